"""A catalog on a PostgreSQL server under attack and failure (issue 26): ``catalog
query`` cannot write nor lift its time limit, its memory is bounded, and readers
reconnect after the server restarts or their backend is killed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_query import _REFUSED
from typer.testing import CliRunner

from shardcat import Catalog, CatalogError, TFRecordWriter, make_example
from shardcat.cli import app
from shardcat.testing.postgres import find_binaries, fresh_database, postgres_server, restart
from shardcat.testing.required import missing, need

psycopg = need("psycopg", why="shardcat[postgres]")
if find_binaries() is None:
    missing("the PostgreSQL server binaries (initdb, postgres)")

runner = CliRunner()
N = 40

# The cases: statements after a COMMIT, and a timeout lifted by SET.
_ESCAPES = [
    "SELECT 1; COMMIT; BEGIN READ WRITE; CREATE TABLE pwned(x int); COMMIT",
    "SELECT count(*) FROM train; COMMIT; BEGIN READ WRITE; DELETE FROM shardcat_meta; "
    "DROP VIEW train; COMMIT",
    "COMMIT; BEGIN READ WRITE; CREATE TABLE pwned(x int)",
    "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE",
    "SET statement_timeout = 0; SELECT pg_sleep(20)",
    "CREATE TABLE pwned(x int)",
    "CREATE TEMP TABLE pwned(x int)",
    "SELECT 1 INTO pwned",
    "COPY train TO STDOUT",
]


@pytest.fixture(scope="module")
def server():
    with postgres_server() as url:
        yield url


@pytest.fixture
def pg_url(server):
    """A fresh database on the server, dropped afterwards."""
    with fresh_database(server) as url:
        yield url


def _value(i: int) -> bytes:
    return f"value {i} ".encode() * (i % 7 + 1)


@pytest.fixture
def train(tmp_path: Path, pg_url: str) -> str:
    """Dataset ``train`` (N records k00..k39, ``v`` = _value(i)) in a server catalog."""
    with TFRecordWriter(tmp_path / "train.tfrecord") as writer:
        for i in range(N):
            writer.write(make_example({"key": f"k{i:02d}", "v": _value(i), "label": i % 4}))
    with Catalog(pg_url) as cat:
        cat.ingest(str(tmp_path / "train.tfrecord"), "train").close()
    return pg_url


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as c:
        rows = c.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {r[0] for r in rows}


@pytest.mark.parametrize("sql", _REFUSED + _ESCAPES)
def test_queries_cannot_write_nor_leave_read_only(train: str, sql: str, tmp_path: Path) -> None:
    before = _tables(train)
    with Catalog(train, readonly=True) as cat:
        with pytest.raises(CatalogError, match="query failed"):
            cat.query(sql.replace("{dir}", str(tmp_path)), timeout=5)
        assert cat.query("SELECT count(*) FROM train") == [(N,)]
        with cat.dataset("train") as reader:
            assert reader.get_feature("k07", "v") == _value(7)
    assert _tables(train) == before
    with Catalog(train) as cat:  # and it is still a catalog a writer opens
        assert [d.name for d in cat.datasets()] == ["train"]


def test_several_statements_are_refused_by_name(train: str) -> None:
    with Catalog(train, readonly=True) as cat, pytest.raises(CatalogError) as err:
        cat.query(_ESCAPES[0])
    assert str(err.value) == "query failed: only one statement may run at a time"


def test_the_cli_refuses_the_escapes(train: str) -> None:
    for sql in _ESCAPES[:2]:
        done = runner.invoke(app, ["query", sql, "-c", train])
        assert done.exit_code == 1, done.output
        assert "only one statement may run at a time" in done.output
        assert "Traceback" not in done.output
    assert "pwned" not in _tables(train)


def test_a_query_cannot_lift_its_time_limit(train: str) -> None:
    with Catalog(train, readonly=True) as cat:
        for sql in (
            "SELECT set_config('statement_timeout', '0', true), pg_sleep(20)",
            "SELECT pg_sleep(20)",
        ):
            start = time.monotonic()
            with pytest.raises(CatalogError, match=r"time limit of 1 s"):
                cat.query(sql, timeout=1)
            assert time.monotonic() - start < 15  # (not 20 s: stopped, not waited out)


def test_cli_timeout_stops_a_sleeping_query(train: str) -> None:
    start = time.monotonic()
    done = runner.invoke(
        app, ["query", "SELECT set_config('statement_timeout', '0', true), pg_sleep(20)",
              "-c", train, "--timeout", "3"],
    )  # fmt: skip
    assert done.exit_code == 1, done.output
    assert "time limit of 3 s" in done.output
    assert time.monotonic() - start < 15


def test_session_locks_and_settings_die_with_the_query(train: str) -> None:
    with Catalog(train, readonly=True) as cat:
        assert cat.query("SELECT pg_advisory_lock(42) IS NULL") == [(False,)]
        assert cat.query("SELECT set_config('default_transaction_read_only', 'off', false)")
        assert cat.query("SELECT set_config('statement_timeout', '0', false)")
        assert cat.query("SELECT current_setting('statement_timeout')") == [("1min",)]
        assert cat.query("SELECT current_setting('transaction_read_only')") == [("on",)]
    with psycopg.connect(train) as c:
        held = c.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone()
    assert held == (0,)


def test_query_memory_is_bounded(train: str) -> None:
    big = "SELECT repeat('x', 1000000) FROM generate_series(1, 1000)"
    with Catalog(train, readonly=True) as cat:
        with pytest.raises(CatalogError) as err:
            cat.query(big, memory=16 * 2**20)
        assert str(err.value).startswith("query exceeded its memory limit of 16 MB")
        with cat.query_rows(big, memory=16 * 2**20) as (columns, rows):
            assert columns == ["repeat"]
            assert sum(len(r[0]) for r in rows) == 10**9  # streamed: one row at a time
        assert cat.query("SELECT count(*) FROM train") == [(N,)]


# -- readers reconnect -------------------------------------------------------------


def _reads(reader, rounds: int) -> tuple[int, list[str]]:
    """Read every key ``rounds`` times: (right reads, errors); wrong bytes fail here."""
    right, errors = 0, []
    for _ in range(rounds):
        for i in range(0, N, 5):
            try:
                got = reader.get_feature(f"k{i:02d}", "v")
            except CatalogError as exc:
                errors.append(str(exc))
                continue
            assert got == _value(i)
            right += 1
    return right, errors


def _kill_backends(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as c:
        rows = c.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return len(rows)


def test_readers_reconnect_after_their_backend_is_killed(train: str) -> None:
    with Catalog(train, readonly=True) as cat, cat.dataset("train") as reader:
        assert _reads(reader, 1) == (N // 5, [])
        assert _kill_backends(train) >= 1
        right, errors = _reads(reader, 2)  # the reads in the killed snapshot may fail
        assert len(errors) <= 1, errors
        assert right == 2 * N // 5 - len(errors)
        for message in errors:
            assert message.startswith("lost the connection to catalog"), message
        time.sleep(1.1)  # a new snapshot: begun on a new connection, nothing fails
        assert _kill_backends(train) >= 1
        assert _reads(reader, 2) == (2 * N // 5, [])
        assert cat.query("SELECT count(*) FROM train") == [(N,)]


def test_readers_reconnect_after_a_server_restart(server: str, train: str) -> None:
    with Catalog(train, readonly=True) as cat, cat.dataset("train") as reader:
        assert _reads(reader, 1) == (N // 5, [])
        restart(server)
        right, errors = _reads(reader, 3)
        assert len(errors) <= 1, errors
        assert right == 3 * N // 5 - len(errors)
        assert reader.get_many(["k01", "k02"], raw=False) is not None
        assert cat.query("SELECT count(*) FROM train") == [(N,)]
