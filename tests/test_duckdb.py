"""``engine="duckdb"``: the same read-only SQL through DuckDB over the columnar
mirror -- equal results, never stale, the same guards, the CLI's ``--engine``."""

from __future__ import annotations

import os
import shutil
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from shardcat import Catalog, CatalogError, TFRecordWriter, make_example
from shardcat.catalog.columnar import mirror_directory
from shardcat.cli import app
from shardcat.testing.postgres import find_binaries, fresh_database, postgres_server
from shardcat.testing.required import missing, need

need("duckdb", "pyarrow", why="shardcat[duckdb]")

runner = CliRunner()
PER_SHARD = 50

# Queries over the view's columns that SQLite and DuckDB spell and answer alike.
QUERIES = [
    "SELECT count(*) FROM train",
    "SELECT count(*) AS n FROM train WHERE label < 3",
    "SELECT label, count(*) AS n FROM train GROUP BY label ORDER BY label",
    "SELECT key, position, shard, label, score, caption FROM train ORDER BY position",
    "SELECT key FROM train WHERE score IS NULL ORDER BY key",
    "SELECT count(score) AS n, sum(score) AS s, min(score) AS lo, max(score) AS hi FROM train",
    "SELECT caption, count(*) AS n FROM train GROUP BY caption ORDER BY n DESC, caption",
    "SELECT key, score FROM train WHERE score > 0.5 AND caption LIKE 'cap 1%' ORDER BY key",
    "SELECT t.key, t.label, v.label AS other FROM train t JOIN val v ON v.key = t.key "
    "ORDER BY t.key",
    "SELECT label, avg(score) AS mean FROM train WHERE score IS NOT NULL "
    "GROUP BY label HAVING count(*) > 2 ORDER BY label",
    "SELECT key FROM train WHERE label = ? AND caption = ? ORDER BY key",
]
PARAMS: dict[str, list[Any]] = {QUERIES[-1]: [3, "cap 13"]}


def _write(path: Path, records: list[dict[str, Any]]) -> None:
    with TFRecordWriter(path) as writer:
        for rec in records:
            writer.write(make_example(rec))


def _records(shard: int, label_of: int = 7) -> list[dict[str, Any]]:
    out = []
    for j in range(PER_SHARD):
        i = shard * PER_SHARD + j
        rec: dict[str, Any] = {"key": f"k{i:04d}", "label": (i * label_of) % 10}
        rec["caption"] = f"cap {i % 17}"
        if i % 5:  # every fifth record has no score: NULL
            rec["score"] = (i % 16) / 16
        out.append(rec)
    return out


@pytest.fixture
def built(tmp_path: Path) -> Path:
    """``train`` (3 shards, 150 records) and ``val`` (train's first 50 keys, other labels)."""
    for s in range(3):
        _write(tmp_path / f"train-{s}.tfrecord", _records(s))
    _write(tmp_path / "val-0.tfrecord", _records(0, label_of=3))
    db = tmp_path / "catalog.sqlite"
    with Catalog(db) as cat:
        cat.ingest(str(tmp_path / "train-*.tfrecord"), "train").close()
        cat.ingest(str(tmp_path / "val-*.tfrecord"), "val").close()
    return db


def _both(cat: Catalog, sql: str, params: Any = None) -> tuple[list[Any], list[Any]]:
    return list(cat.query(sql, params)), list(cat.query(sql, params, engine="duckdb"))


@pytest.mark.parametrize("sql", QUERIES)
def test_duckdb_answers_as_sqlite(built: Path, sql: str) -> None:
    with Catalog(built) as cat:
        sqlite_rows, duck_rows = _both(cat, sql, PARAMS.get(sql))
        assert duck_rows == sqlite_rows
        assert sqlite_rows  # every query has an answer to compare
        named = cat.query(sql, PARAMS.get(sql), engine="duckdb").columns
        if "count(*) FROM" not in sql:  # (an unnamed count(*) is count_star() in DuckDB)
            assert named == cat.query(sql, PARAMS.get(sql)).columns


def test_values_keep_their_types(built: Path) -> None:
    with Catalog(built) as cat:
        rows = cat.query(
            "SELECT key, position, shard, label, score FROM train WHERE key IN ('k0001', 'k0005')"
            " ORDER BY key",
            engine="duckdb",
        )
    assert rows == [
        ("k0001", 1, "train-0.tfrecord", 7, 1 / 16),
        ("k0005", 5, "train-0.tfrecord", 5, None),
    ]
    assert [type(v) for v in rows[0]] == [str, int, str, int, float]


def test_the_mirror_is_one_parquet_file_per_dataset_beside_the_catalog(built: Path) -> None:
    with Catalog(built) as cat:
        cat.query("SELECT count(*) FROM train", engine="duckdb")
        files = sorted(p.name for p in mirror_directory(built).glob("*.parquet"))
        assert mirror_directory(built) == built.with_name("catalog.sqlite.columns")
        assert len(files) == 1 and files[0].startswith("1-")  # val is not named: not built
        cat.query("SELECT count(*) FROM val", engine="duckdb")
        assert len(list(mirror_directory(built).glob("*.parquet"))) == 2


def test_reingest_of_a_changed_shard_changes_the_answer(built: Path) -> None:
    sql = "SELECT label, count(*) AS n FROM train GROUP BY label ORDER BY label"
    with Catalog(built) as cat:
        before = cat.query(sql, engine="duckdb")
        assert before == cat.query(sql)
        _write(built.parent / "train-1.tfrecord", [{**r, "label": 42} for r in _records(1)])
        cat.ingest(str(built.parent / "train-*.tfrecord"), "train").close()
        after = cat.query(sql, engine="duckdb")
        assert after == cat.query(sql) != before
        assert (42, PER_SHARD) in after
        assert len(list(mirror_directory(built).glob("1-*.parquet"))) == 1  # the old one removed


def test_another_process_reingest_is_seen_by_an_open_catalog(built: Path) -> None:
    sql = "SELECT count(*) AS n FROM train"
    with Catalog(built, readonly=True) as reader:
        assert reader.query(sql, engine="duckdb") == [(3 * PER_SHARD,)]
        _write(built.parent / "train-3.tfrecord", _records(3))
        with Catalog(built) as writer:
            writer.ingest(str(built.parent / "train-*.tfrecord"), "train").close()
        assert reader.query(sql, engine="duckdb") == [(4 * PER_SHARD,)]


def test_a_new_field_and_a_dropped_dataset_are_seen(built: Path) -> None:
    with Catalog(built) as cat:
        cat.query("SELECT count(*) FROM val", engine="duckdb")
        _write(built.parent / "val-1.tfrecord", [{"key": "x", "label": 1, "extra": 2.5}])
        cat.ingest(str(built.parent / "val-*.tfrecord"), "val").close()
        assert cat.query("SELECT key, extra FROM val WHERE extra IS NOT NULL", engine="duckdb") == [
            ("x", 2.5)
        ]
        cat.drop("val")
        with pytest.raises(CatalogError, match="query failed: Catalog Error: Table with name val"):
            cat.query("SELECT count(*) FROM val", engine="duckdb")
        assert not list(mirror_directory(built).glob("2-*.parquet"))  # its file removed
        # a new dataset of the same name is not the old one's mirror
        _write(built.parent / "val-0.tfrecord", [{"key": "only", "label": 0}])
        cat.ingest(str(built.parent / "val-0.tfrecord"), "val").close()
        assert cat.query("SELECT key FROM val", engine="duckdb") == [("only",)]


_REFUSED = [
    "DELETE FROM train",
    "INSERT INTO train (key) VALUES ('x')",
    "CREATE TABLE t AS SELECT 1",
    "DROP VIEW train",
    "UPDATE train SET label = 1",
    "COPY train TO 'out.csv'",
    "ATTACH ':memory:' AS other",
    "SET memory_limit = '10GB'",
    "PRAGMA version",
    "INSTALL sqlite",
]


@pytest.mark.parametrize("sql", _REFUSED)
def test_writes_and_settings_are_refused(built: Path, sql: str) -> None:
    with Catalog(built) as cat, pytest.raises(CatalogError) as err:
        cat.query(sql, engine="duckdb")
    assert str(err.value) == (
        "query failed: the catalog is read-only here: only SELECT statements are allowed"
    )


def test_two_statements_and_files_outside_the_mirror_are_refused(built: Path) -> None:
    outside = built.parent / "secret.csv"
    outside.write_text("a\n1\n")
    with Catalog(built) as cat:
        with pytest.raises(CatalogError, match="one statement at a time"):
            cat.query("SELECT 1; DELETE FROM train", engine="duckdb")
        with pytest.raises(CatalogError, match="query failed: Permission Error"):
            cat.query(f"SELECT * FROM read_csv('{outside}')", engine="duckdb")
        with pytest.raises(CatalogError, match="query failed: Parser Error"):
            cat.query("SELEKT 1", engine="duckdb")
        assert cat.query("SELECT count(*) FROM train", engine="duckdb") == [(3 * PER_SHARD,)]


def test_time_limit(built: Path) -> None:
    slow = "SELECT count(*) FROM range(100000000000) a WHERE a.range % 7 = 3"
    with Catalog(built) as cat:
        with pytest.raises(CatalogError) as err:
            cat.query(slow, engine="duckdb", timeout=0.3)
        assert str(err.value) == (
            "query exceeded its time limit of 0.3 s; pass --timeout/timeout= to allow more"
        )
        assert cat.query("SELECT count(*) FROM train", engine="duckdb") == [(3 * PER_SHARD,)]


def test_memory_limit(built: Path) -> None:
    big = (
        "SELECT max(length(s)) FROM (SELECT string_agg(range::VARCHAR, ',') s FROM range(3000000))"
    )
    with Catalog(built) as cat:
        with pytest.raises(CatalogError, match="query exceeded its memory limit of 4 MB"):
            cat.query(big, engine="duckdb", memory=4 * 2**20)
        assert cat.query(big, engine="duckdb", memory=None)[0][0] > 3_000_000
        # the rows the caller keeps are bounded as with sqlite (a row cap by size)
        with pytest.raises(CatalogError, match="memory limit"):
            cat.query("SELECT * FROM range(1000000)", engine="duckdb", memory=2**20)


def test_unknown_engine_and_attach(built: Path) -> None:
    with Catalog(built) as cat:
        with pytest.raises(CatalogError, match="unknown query engine 'postgres': use 'sqlite'"):
            cat.query("SELECT 1", engine="postgres")
        with pytest.raises(CatalogError, match="attach= is for engine='sqlite'"):
            cat.query("SELECT 1", engine="duckdb", attach={"x": built})
    result = runner.invoke(app, ["query", "SELECT 1", "-c", str(built), "--engine", "nope"])
    assert result.exit_code == 1
    assert "unknown query engine 'nope'" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("mode", [[], ["--csv"], ["--json"]])
def test_cli_output_is_identical(built: Path, mode: list[str]) -> None:
    sql = "SELECT label, count(*) AS n, min(score) AS lo FROM train GROUP BY label ORDER BY label"
    outputs = [
        runner.invoke(app, ["query", sql, "-c", str(built), *mode, *engine])
        for engine in ([], ["--engine", "sqlite"], ["--engine", "duckdb"])
    ]
    assert [r.exit_code for r in outputs] == [0, 0, 0]
    assert outputs[0].output == outputs[1].output == outputs[2].output
    assert "10 row(s)" in outputs[2].output or mode


def _check_private(built: Path) -> None:
    with Catalog(built, immutable=True) as cat:
        got = cat.query("SELECT count(*) AS n FROM train WHERE label < 3", engine="duckdb")
        assert got == cat.query("SELECT count(*) AS n FROM train WHERE label < 3")
    private = mirror_directory(built)
    assert private.parent != built.parent and private.stat().st_uid == os.getuid()
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert len(list(private.glob("1-*.parquet"))) == 1
    shutil.rmtree(private)


def test_no_room_beside_the_catalog_mirrors_in_a_private_temp_dir(built: Path) -> None:
    built.with_name(built.name + ".columns").write_text("not a directory")
    _check_private(built)


def test_read_only_directory_mirrors_in_a_private_temp_dir(built: Path) -> None:
    directory = built.parent
    os.chmod(directory, stat.S_IRUSR | stat.S_IXUSR)
    try:
        if os.access(directory, os.W_OK):  # root: the test above covers the fallback
            return
        _check_private(built)
    finally:
        os.chmod(directory, stat.S_IRWXU)


def test_postgresql_catalog_is_refused() -> None:
    need("psycopg", why="shardcat[postgres]")
    if find_binaries() is None:
        missing("the PostgreSQL server binaries (initdb, postgres)")
    with postgres_server() as server, fresh_database(server) as url, Catalog(url) as cat:
        assert cat.query("SELECT 1 AS one") == [(1,)]
        with pytest.raises(CatalogError) as err:
            cat.query("SELECT 1 AS one", engine="duckdb")
    assert str(err.value).startswith("engine='duckdb' is for SQLite catalogs; ")
    assert str(err.value).endswith(" is a server catalog (query it with the default engine)")


def test_threads_share_the_session(built: Path) -> None:
    sql = "SELECT label, count(*) AS n FROM train GROUP BY label ORDER BY label"
    with Catalog(built) as cat:
        want = cat.query(sql)
        got: list[Any] = []

        def run() -> None:
            for _ in range(5):
                got.append(cat.query(sql, engine="duckdb"))

        threads = [threading.Thread(target=run) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert got == [want] * 20


def test_processes_building_one_mirror_at_once(built: Path) -> None:
    import multiprocessing

    context = multiprocessing.get_context("fork")
    with context.Pool(3) as pool:
        counts = pool.map(_count_in_child, [str(built)] * 6)
    assert counts == [3 * PER_SHARD] * 6
    assert len(list(mirror_directory(built).glob("1-*.parquet"))) == 1
    assert not list(mirror_directory(built).glob(".*.tmp"))


def _count_in_child(path: str) -> int:
    with Catalog(path, readonly=True) as cat:
        return int(cat.query("SELECT count(*) FROM train", engine="duckdb")[0][0])


def test_a_query_inside_the_rows_of_another(built: Path) -> None:
    with Catalog(built) as cat:
        seen = []
        sql = "SELECT label FROM train GROUP BY label ORDER BY label"
        with cat.query_rows(sql, engine="duckdb") as (columns, rows):
            for (label,) in rows:
                inner = "SELECT count(*) AS n FROM val WHERE label = ?"
                seen.append((label, cat.query(inner, [label], engine="duckdb")[0][0]))
        assert columns == ["label"]
        assert seen == [(label, cat.query(inner, [label])[0][0]) for label in range(10)]


def test_forked_children_after_the_parent_queried(built: Path) -> None:
    import multiprocessing

    with Catalog(built) as cat:
        assert cat.query("SELECT count(*) FROM train", engine="duckdb") == [(3 * PER_SHARD,)]
    with multiprocessing.get_context("fork").Pool(2) as pool:
        assert pool.map(_count_in_child, [str(built)] * 4) == [3 * PER_SHARD] * 4


_CTRL_C = """
import sys
from shardcat import Catalog
with Catalog(sys.argv[1]) as cat:
    print("running", flush=True)
    try:
        cat.query("SELECT count(*) FROM range(100000000000) a WHERE a.range % 7 = 3",
                  engine="duckdb", timeout=None)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    print(cat.query("SELECT count(*) FROM train", engine="duckdb")[0][0], flush=True)
"""


def test_ctrl_c_stops_a_running_statement(built: Path) -> None:
    import signal
    import subprocess
    import sys

    child = subprocess.Popen(
        [sys.executable, "-c", _CTRL_C, str(built)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    assert child.stdout.readline() == "running\n"
    time.sleep(1.0)  # (into the statement)
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=60)
    assert out == f"interrupted\n{3 * PER_SHARD}\n"
    assert child.returncode == 0


def test_a_catalog_made_anew_at_the_same_path_is_not_its_old_mirror(built: Path) -> None:
    sql = "SELECT label, count(*) AS n FROM val GROUP BY label ORDER BY label"
    with Catalog(built) as cat:
        before = cat.query(sql, engine="duckdb")
    for suffix in ("", "-wal", "-shm"):
        built.with_name(built.name + suffix).unlink(missing_ok=True)
    # the same shard path, record count and keys; other labels
    _write(built.parent / "val-0.tfrecord", [{**r, "label": 9} for r in _records(0, 3)])
    with Catalog(built) as cat:  # (the same dataset ids: train 1, val 2)
        cat.ingest(str(built.parent / "train-*.tfrecord"), "train").close()
        cat.ingest(str(built.parent / "val-*.tfrecord"), "val").close()
        after = cat.query(sql, engine="duckdb")
        assert after == cat.query(sql) == [(9, PER_SHARD)] != before


def test_upper_case_names_datasets_without_fields_and_empty_sql(built: Path) -> None:
    with Catalog(built) as cat:
        cat.ingest(str(built.parent / "val-*.tfrecord"), "Bare", fields=False).close()
        sql = "SELECT key, position, shard FROM \"Bare\" WHERE key < 'k0003' ORDER BY key"
        assert cat.query(sql, engine="duckdb") == cat.query(sql)
        assert cat.query(sql, engine="duckdb").columns == ["key", "position", "shard"]
        assert cat.query("SELECT count(*) AS n FROM bare", engine="duckdb") == [(PER_SHARD,)]
        with pytest.raises(CatalogError, match="one statement at a time \\(found 0\\)"):
            cat.query("  ", engine="duckdb")
