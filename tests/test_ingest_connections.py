"""The ingest keeps one writer connection per process, and never uses one across fork."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

import shardcat.catalog.sqlite as sqlite_backend
from shardcat import Catalog, TFRecordWriter, make_example
from shardcat.catalog.backend import make_engine
from shardcat.catalog.processes import START_METHOD_ENV


def _shards(directory: Path, count: int) -> str:
    directory.mkdir(parents=True)
    for s in range(count):
        with TFRecordWriter(directory / f"part-{s:05d}.tfrecord") as writer:
            for i in range(5):
                writer.write(make_example({"key": f"k{s}_{i}", "label": i}).SerializeToString())
    return str(directory / "*.tfrecord")


def _connections_to_ingest(tmp_path: Path, shards: int, monkeypatch: pytest.MonkeyPatch) -> int:
    pattern = _shards(tmp_path / f"ds{shards}", shards)
    with Catalog(tmp_path / f"c{shards}.sqlite") as cat:
        opened: list[int] = []
        real = sqlite_backend._on_connect

        def counting(conn: Any, record: Any) -> None:
            opened.append(os.getpid())
            real(conn, record)

        monkeypatch.setattr(sqlite_backend, "_on_connect", counting)
        with cat.ingest(pattern, "train", workers=1) as reader:
            assert len(reader) == 5 * shards
        monkeypatch.setattr(sqlite_backend, "_on_connect", real)
    return len(opened)


def test_connections_do_not_grow_with_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every claim, commit and release used to open its own connection: 2 + 2 per shard.
    two = _connections_to_ingest(tmp_path, 2, monkeypatch)
    eight = _connections_to_ingest(tmp_path, 8, monkeypatch)
    assert eight == two


def test_kept_connection_is_closed_when_the_ingest_ends(tmp_path: Path) -> None:
    from shardcat.catalog import session

    pattern = _shards(tmp_path / "ds", 3)
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(pattern, "train", workers=1).close()
        assert session.open_sessions() == []
        assert cat.checkpoint()
        assert os.path.getsize(tmp_path / "c.sqlite-wal") == 0  # truncated: nothing pins it


def test_forked_child_never_uses_the_parents_kept_connection(tmp_path: Path) -> None:
    engine = make_engine(tmp_path / "f.sqlite", keep_connection=True)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (pid INTEGER, conn INTEGER)"))
        parent_conn = id(conn.connection.dbapi_connection)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own connection, the parent's left untouched
        code = 1
        try:
            with engine.begin() as conn:
                mine = id(conn.connection.dbapi_connection)
                conn.execute(text("INSERT INTO t VALUES (:p, :c)"), {"p": os.getpid(), "c": mine})
            os.write(write, b"ok" if mine != parent_conn else b"reused")
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    assert os.read(read, 16) == b"ok"
    assert os.waitpid(pid, 0)[1] == 0
    with engine.begin() as conn:  # the parent's kept connection still works
        assert id(conn.connection.dbapi_connection) == parent_conn
        assert conn.execute(text("SELECT pid FROM t")).scalars().all() == [pid]
    engine.dispose()


def test_each_worker_claims_its_next_shard_right_after_its_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 2 workers, a worker's next claim follows its commit in the same turn at the
    write lock (it scans while the other commits), and every shard is reported once."""
    from shardcat.catalog import claims, commit

    log = tmp_path / "events.log"
    real_commit, real_claim = commit.commit_shard, claims.claim_next

    def note(event: str) -> None:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {event}\n")

    def commit_shard(*args: Any, **kwargs: Any) -> Any:
        note("commit")
        return real_commit(*args, **kwargs)

    def claim_next(*args: Any, **kwargs: Any) -> Any:
        claimed = real_claim(*args, **kwargs)
        note("claim" if claimed is not None else "none")
        return claimed

    monkeypatch.setenv(START_METHOD_ENV, "fork")  # (forked even after Ray in this process)
    monkeypatch.setattr(commit, "commit_shard", commit_shard)  # the forked workers inherit it
    monkeypatch.setattr(claims, "claim_next", claim_next)
    pattern = _shards(tmp_path / "ds", 6)
    seen: list[str] = []
    with (
        Catalog(tmp_path / "c.sqlite") as cat,
        cat.ingest(pattern, "train", workers=2, progress=lambda o, t: seen.append(o.path)) as r,
    ):
        assert len(r) == 30
    assert sorted(seen) == [f"ds/part-{s:05d}.tfrecord" for s in range(6)]
    events = [line.split() for line in log.read_text().splitlines()]
    assert sorted({pid for pid, _ in events}) != [str(os.getpid())]  # workers did it
    assert [e for _, e in events].count("commit") == 6
    for n, (pid, event) in enumerate(events):
        if event == "commit":  # the very next write-lock holder is the same worker, claiming
            assert events[n + 1][0] == pid and events[n + 1][1] in ("claim", "none")


def test_a_worker_s_error_reaches_the_caller_and_the_next_ingest_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardcat.catalog import commit

    real_commit = commit.commit_shard

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("commit exploded")

    monkeypatch.setenv(START_METHOD_ENV, "fork")  # the forked workers inherit failing
    monkeypatch.setattr(commit, "commit_shard", failing)
    pattern = _shards(tmp_path / "ds", 4)
    with Catalog(tmp_path / "c.sqlite") as cat:
        with pytest.raises(RuntimeError, match="commit exploded"):
            cat.ingest(pattern, "train", workers=2)
        monkeypatch.setattr(commit, "commit_shard", real_commit)
        with cat.ingest(pattern, "train", workers=2) as reader:
            assert len(reader) == 20
            assert reader.get_feature("k3_4", "label") == 4
