"""Read-only SQL safety: the function allow-list, time limits, Ctrl-C, and escaped table output."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from shardcat import Catalog, CatalogError, TFRecordWriter, make_example
from shardcat.catalog.handle import ReadHandle
from shardcat.cli import app

runner = CliRunner()

N = 20
FOREVER = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
LIMIT_MESSAGE = "query exceeded its time limit of {} s; pass --timeout/timeout= to allow more"
DENIED = "query failed: function {}() is not allowed in a read-only query"


def _records() -> list[dict[str, Any]]:
    return [{"key": f"k{i:02d}", "label": i % 4, "caption": f"cap {i}"} for i in range(N)]


@pytest.fixture
def built(tmp_path: Path) -> Path:
    """A catalog with dataset ``train``: 20 records, label = i % 4."""
    with TFRecordWriter(tmp_path / "train-00000.tfrecord") as writer:
        for rec in _records():
            writer.write(make_example(rec))
    db = tmp_path / "cat.sqlite"
    with Catalog(db) as cat:
        cat.ingest(str(tmp_path / "*.tfrecord"), "train").close()
    return db


# -- 1. functions ------------------------------------------------------------------


def test_allowed_functions_work(built: Path) -> None:
    with Catalog(built, readonly=True) as cat:
        rows = cat.query(
            "SELECT count(*), sum(label), total(label), max(label), "
            """json_extract('{"a": [1, 2]}', '$.a[1]'), '{"b": 7}' ->> '$.b', """
            "printf('%05d', 42), abs(-3), lower('AbC'), upper('x'), substr('shardcat', 1, 5), "
            "coalesce(NULL, 'x'), ifnull(NULL, 2), strftime('%Y-%m', '2024-05-06'), "
            "date('2024-05-06', '+1 day'), length('abc'), round(2.25, 1), sqrt(16.0), "
            "json_array_length('[1, 2, 3]'), typeof(1.5), group_concat(DISTINCT label) "
            'FROM "train"'
        )
        assert rows == [
            (
                N,
                sum(i % 4 for i in range(N)),
                float(sum(i % 4 for i in range(N))),
                3,
                2,
                7,
                "00042",
                3,
                "abc",
                "X",
                "shard",
                "x",
                2,
                "2024-05",
                "2024-05-07",
                3,
                2.3,
                4.0,
                3,
                "real",
                "0,1,2,3",
            )
        ]
        window = cat.query(
            "SELECT key, row_number() OVER (ORDER BY position), "
            "rank() OVER (PARTITION BY label ORDER BY position), "
            "lag(key) OVER (ORDER BY position) "
            'FROM "train" WHERE position < 5 ORDER BY position'
        )
        assert window == [
            ("k00", 1, 1, None),
            ("k01", 2, 1, "k00"),
            ("k02", 3, 1, "k01"),
            ("k03", 4, 1, "k02"),
            ("k04", 5, 2, "k03"),
        ]
        assert cat.query("SELECT key FROM train WHERE caption LIKE 'cap 1_' ORDER BY key") == [
            (f"k{i}",) for i in range(10, 20)
        ]
        with cat.dataset("train") as reader:
            assert reader.where("abs(label - 2) = 1 AND position < 8") == [
                "k01",
                "k03",
                "k05",
                "k07",
            ]


@pytest.mark.parametrize(
    ("sql", "name"),
    [
        ("SELECT hex(fts3_tokenizer('simple'))", "fts3_tokenizer"),
        ("SELECT HEX(FTS3_TOKENIZER('simple'))", "fts3_tokenizer"),
        # the 2-argument form writes a pointer; a name nothing uses keeps the pre-fix run safe
        ("SELECT fts3_tokenizer('shardcat_probe', zeroblob(8))", "fts3_tokenizer"),
        ("SELECT load_extension('libnothing')", "load_extension"),
        ("SELECT fts5_source_id()", "fts5_source_id"),
        ("SELECT sqlite_log(1, 'x')", "sqlite_log"),
        (
            'SELECT key FROM "train" WHERE label = '
            "(SELECT length(hex(fts3_tokenizer('simple'))))",
            "fts3_tokenizer",
        ),
        (
            "WITH p(x) AS (SELECT fts3_tokenizer('simple')) SELECT hex(x) FROM p",
            "fts3_tokenizer",
        ),
        (
            "SELECT key FROM \"train\" ORDER BY hex(fts3_tokenizer('simple'))",
            "fts3_tokenizer",
        ),
    ],
)
def test_functions_outside_the_allow_list_are_refused(built: Path, sql: str, name: str) -> None:
    with Catalog(built, readonly=True) as cat:
        with pytest.raises(CatalogError) as err:
            cat.query(sql)
        assert str(err.value).startswith(DENIED.format(name)), str(err.value)
        assert cat.query('SELECT count(*) FROM "train"') == [(N,)]


def test_unknown_functions_are_refused_by_name(built: Path) -> None:
    with Catalog(built, readonly=True) as cat, pytest.raises(CatalogError) as err:
        cat.query("SELECT readfile('catalog.sqlite')")
    assert "readfile" in str(err.value)
    assert str(err.value).startswith("query failed:")


def test_functions_inside_views_are_checked(built: Path, tmp_path: Path) -> None:
    # A catalog (or an attached file) may come from anyone: its views are checked too.
    # (SQLite itself refuses fts3_tokenizer in a view: "unsafe use of fts3_tokenizer()";
    # fts5_source_id it would run.)
    conn = sqlite3.connect(built)
    with conn:
        conn.execute("CREATE VIEW leak AS SELECT hex(fts3_tokenizer('simple')) AS p")
        conn.execute("CREATE VIEW probe AS SELECT key, fts5_source_id() AS p FROM train")
    conn.close()
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    with conn:
        conn.execute("CREATE VIEW probe2 AS SELECT 1 AS one, fts5_source_id() AS p")
        conn.execute("CREATE VIEW fine AS SELECT abs(-2) AS two")
    conn.close()
    with Catalog(built, readonly=True) as cat:
        with pytest.raises(CatalogError, match="fts3_tokenizer"):
            cat.query("SELECT p FROM leak")
        with pytest.raises(CatalogError) as err:
            cat.query("SELECT key FROM probe")
        assert str(err.value).startswith(DENIED.format("fts5_source_id"))
        with pytest.raises(CatalogError) as err:
            cat.query("SELECT one FROM o.probe2", attach={"o": other})
        assert str(err.value).startswith(DENIED.format("fts5_source_id"))
        assert cat.query("SELECT two FROM o.fine", attach={"o": other}) == [(2,)]
        with cat.dataset("train") as reader, pytest.raises(CatalogError) as err:
            reader.where("fts3_tokenizer('simple') IS NOT NULL")
        assert str(err.value).startswith(DENIED.format("fts3_tokenizer"))


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM pragma_table_info('records')",
        "SELECT name FROM pragma_function_list",
        "SELECT * FROM pragma_compile_options",
        "SELECT * FROM pragma_database_list",
        "SELECT count(*) FROM shardcat_records_1 WHERE EXISTS (SELECT 1 FROM "
        "pragma_index_list('records'))",
    ],
)
def test_table_valued_pragmas_are_refused(built: Path, sql: str) -> None:
    with Catalog(built, readonly=True) as cat:
        with pytest.raises(CatalogError) as err:
            cat.query(sql)
        assert str(err.value) == (
            "query failed: the catalog is read-only here: only SELECT statements are allowed"
        )
        assert cat.query("SELECT 1") == [(1,)]


# -- 2. time limit and Ctrl-C ---------------------------------------------------------


def test_a_query_over_its_time_limit_stops(built: Path) -> None:
    with Catalog(built, readonly=True) as cat:
        start = time.monotonic()
        with pytest.raises(CatalogError) as err:
            cat.query(FOREVER, timeout=0.2)
        assert time.monotonic() - start < 10
        assert str(err.value) == LIMIT_MESSAGE.format("0.2")
        # The connection still works, and no handler is left behind (the deadline
        # above has passed: a leftover handler would stop this raw statement).
        assert cat.query('SELECT count(*) FROM "train"', timeout=0.2) == [(N,)]
        bounded = FOREVER.replace("FROM c)", "FROM c WHERE x < 200000)")
        assert cat.store.reader_connection().execute(bounded).fetchall() == [(200000,)]
        assert cat.query(bounded, timeout=None) == [(200000,)]
        for bad in (0, -1.0):
            with pytest.raises(CatalogError, match="timeout must be"):
                cat.query("SELECT 1", timeout=bad)


def test_where_inherits_the_time_limit(built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert Catalog.query.__kwdefaults__["timeout"] == 60.0
    # a reader's where runs through its read-only handle, with the same limits
    limits = {k: Catalog.query.__kwdefaults__[k] for k in ("timeout", "memory")}
    assert ReadHandle.query.__kwdefaults__ == limits
    monkeypatch.setitem(ReadHandle.query.__kwdefaults__, "timeout", 0.2)
    with Catalog(built, readonly=True) as cat, cat.dataset("train") as reader:
        with pytest.raises(CatalogError) as err:
            reader.where(f"label = ({FOREVER})")
        assert str(err.value) == LIMIT_MESSAGE.format("0.2")
        assert reader.where("label = 3") == ["k03", "k07", "k11", "k15", "k19"]


def test_cli_timeout_option(built: Path) -> None:
    result = runner.invoke(app, ["query", FOREVER, "-c", str(built), "--timeout", "0.3"])
    assert result.exit_code == 1
    assert result.output == f"error: {LIMIT_MESSAGE.format('0.3')}\n".replace("/timeout=", "")
    result = runner.invoke(app, ["query", "SELECT count(*) FROM train", "-c", str(built), "--csv"])
    assert result.exit_code == 0, result.output
    assert list(csv.reader(io.StringIO(result.output))) == [["count(*)"], [str(N)]]


def _child(code: str) -> subprocess.Popen[str]:
    # Python keeps SIGINT ignored when it starts with it ignored (background jobs):
    # the child restores the default handler first.
    prelude = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    return subprocess.Popen(
        [sys.executable, "-c", prelude + code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the query ignored SIGINT: {out!r} {err!r}")
    return proc.returncode, out, err


def test_ctrl_c_interrupts_a_library_query(built: Path) -> None:
    proc = _child(
        "import sys\n"
        "from shardcat import Catalog\n"
        f"cat = Catalog({str(built)!r}, readonly=True)\n"
        "reader = cat.dataset('train')\n"
        "print('ready', flush=True)\n"
        "try:\n"
        f"    reader.where({f'label = ({FOREVER})'!r})\n"
        "except KeyboardInterrupt:\n"
        "    print('KeyboardInterrupt', flush=True)\n"
        "    print(cat.query('SELECT count(*) FROM train'), flush=True)\n"
        "    sys.exit(3)\n"
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    code, out, err = _finish(proc)
    assert (code, out, err) == (3, f"KeyboardInterrupt\n[({N},)]\n", "")


def _opened(pid: int, path: Path) -> bool:
    fds = Path(f"/proc/{pid}/fd")
    try:
        return any(os.path.realpath(fd) == str(path) for fd in fds.iterdir())
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to see the open")
def test_ctrl_c_interrupts_a_cli_query(built: Path) -> None:
    proc = _child(
        "import runpy, sys\n"
        f"sys.argv = ['catalog', 'query', {FOREVER!r}, '-c', {str(built)!r}]\n"
        "runpy.run_module('shardcat', run_name='__main__')\n"
    )
    deadline = time.monotonic() + 20
    while not _opened(proc.pid, built.resolve()) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the query is running by now
    proc.send_signal(signal.SIGINT)
    code, out, err = _finish(proc)
    assert (code, out, err) == (130, "", "interrupted\n")


# -- 6. table output ------------------------------------------------------------------


def test_printable() -> None:
    from shardcat.cli.common import printable

    assert printable("plain text, ünïcode, 日本") == "plain text, ünïcode, 日本"
    assert printable("\x1b[2J") == "\\x1b[2J"
    assert printable("a\tb\nc\rd\x00e\x7f\x9b") == "a\\tb\\nc\\rd\\x00e\\x7f\\x9b"
    assert printable("evil\u202egnp.exe") == "evil\\u202egnp.exe"
    assert printable("back\\slash") == "back\\slash"


@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    """Keys, a shard name and a feature name full of terminal escapes and rich markup."""
    shard = tmp_path / "sh\x1b[31mard.tfrecord"
    with TFRecordWriter(shard) as writer:
        writer.write(make_example({"key": "\x1b[2J", "label": 1, "note\x1b[5m": "x"}))
        writer.write(make_example({"key": "[bold]b[/bold]", "label": 2, "note\x1b[5m": "y"}))
    db = tmp_path / "cat.sqlite"
    with Catalog(db) as cat:
        cat.ingest(str(shard), "evil").close()
    return db


def test_tables_show_escapes_instead_of_sending_them(hostile: Path) -> None:
    result = runner.invoke(
        app, ["query", "SELECT key FROM evil ORDER BY position", "-c", str(hostile)]
    )
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output
    assert "\\x1b[2J" in result.output
    assert "[bold]b[/bold]" in result.output
    for command in (["datasets"], ["stats", "evil"], ["list", "evil"]):
        result = runner.invoke(app, [*command, "-c", str(hostile)])
        assert result.exit_code == 0, result.output
        assert "\x1b" not in result.output, command
    stats = runner.invoke(app, ["stats", "evil", "-c", str(hostile)]).output
    assert "sh\\x1b[31mard.tfrecord" in stats
    listed = runner.invoke(app, ["list", "evil", "-c", str(hostile)]).output
    assert "note\\x1b[5m" in listed
    assert "\\x1b[2J" in listed  # the first key, in the title


def test_json_and_csv_stay_exact(hostile: Path) -> None:
    sql = "SELECT key, label FROM evil ORDER BY position"
    result = runner.invoke(app, ["query", sql, "-c", str(hostile), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == [
        {"key": "\x1b[2J", "label": 1},
        {"key": "[bold]b[/bold]", "label": 2},
    ]
    result = runner.invoke(app, ["query", sql, "-c", str(hostile), "--csv"])
    assert result.exit_code == 0, result.output
    assert list(csv.reader(io.StringIO(result.output))) == [
        ["key", "label"],
        ["\x1b[2J", "1"],
        ["[bold]b[/bold]", "2"],
    ]
