"""The seams between facade, store and readers: ``Catalog`` holds a store, an ingest
writes through the store's session (claim, commit, fail, release), and a reader
holds a read-only handle."""

from __future__ import annotations

import os
import pickle
import sqlite3
from pathlib import Path

import pytest

from shardcat import Catalog, CatalogError, TFRecordWriter, make_example
from shardcat.catalog.commit import IngestJob
from shardcat.catalog.handle import ReadHandle
from shardcat.catalog.session import ClaimedShard, IngestSession, ShardVersion
from shardcat.catalog.store import Store
from shardcat.formats.registry import get_format
from shardcat.readers.reader import Reader
from shardcat.sources.local import fingerprint_file


def _shards(directory: Path, count: int) -> str:
    directory.mkdir(parents=True)
    for s in range(count):
        with TFRecordWriter(directory / f"part-{s}.tfrecord") as writer:
            for i in range(3):
                writer.write(make_example({"key": f"k{s}_{i}", "label": i}).SerializeToString())
    return str(directory / "*.tfrecord")


def _job(cat: Catalog, name: str) -> IngestJob:
    row = cat.store.dataset_row(name)
    return IngestJob(
        catalog=cat.location,
        catalog_dir=cat.store.directory,
        dataset_id=row.id,
        dataset_name=name,
        format=row.format,
        options=row.options,
        key_rule=row.key_rule,
    )


def _version(path: str, options: dict[str, object]) -> ShardVersion:
    scanned = get_format("tfrecord").scan_shard(path, options)
    st = os.stat(path)
    return ShardVersion(scanned.columns, st, fingerprint_file(path, st.st_size))


def _states(catalog: Path) -> list[tuple[str, str, str | None, int]]:
    with sqlite3.connect(catalog) as conn:
        sql = "SELECT path, state, error, num_records FROM shardcat_shards ORDER BY path"
        return conn.execute(sql).fetchall()


def test_catalog_holds_a_store_and_keeps_only_its_public_names(tmp_path: Path) -> None:
    with Catalog(tmp_path / "c.sqlite") as cat:
        assert isinstance(cat.store, Store) and not isinstance(cat, Store)
        for name in ("reader_connection", "dataset_row", "ensure_dataset", "shard_states"):
            assert not hasattr(cat, name) and callable(getattr(cat.store, name))
        assert cat.path == cat.store.path == tmp_path / "c.sqlite"
        assert (cat.readonly, cat.immutable, cat.closed) == (False, False, False)
    assert cat.closed and cat.store.closed


def test_session_claims_commits_fails_and_releases(tmp_path: Path) -> None:
    pattern = _shards(tmp_path / "ds", 4)
    catalog = tmp_path / "c.sqlite"
    with Catalog(catalog) as cat:
        cat.ingest(pattern, "d").close()
        with sqlite3.connect(catalog) as conn:  # every shard pending again
            conn.execute("UPDATE shardcat_shards SET state = 'pending'")
        job = _job(cat, "d")
        with cat.store.ingest_session(job) as session:
            claimed = [session.claim() for _ in range(4)]
            assert session.claim() is None  # all four are this process's now
            assert [c.stored for c in claimed if c] == [f"ds/part-{s}.tfrecord" for s in range(4)]
            a, b, c, d = (x for x in claimed if x is not None)
            assert a.owner == session.owner and session.open_shards() == 4
            # a claim another process took over: the commit writes nothing
            with sqlite3.connect(catalog) as conn:
                conn.execute(
                    "UPDATE shardcat_shards SET claim_owner = 'x:1:1' WHERE id = ?", (a.id,)
                )
            path = str(tmp_path / a.stored)
            assert session.commit(a, _version(path, job.options)) is None
            stolen = ClaimedShard(a.id, a.stored, "x:1:1")
            session.release(stolen)  # (back to pending, as that process would)
            path = str(tmp_path / b.stored)
            assert session.commit(b, _version(path, job.options)) == (3, 0)
            session.fail(c, "ds/part-2.tfrecord: broken")
            session.release(d)
        assert _states(catalog) == [
            ("ds/part-0.tfrecord", "pending", None, 3),
            ("ds/part-1.tfrecord", "ready", None, 3),
            ("ds/part-2.tfrecord", "failed", "ds/part-2.tfrecord: broken", 0),
            ("ds/part-3.tfrecord", "pending", None, 3),
        ]
        with cat.ingest(pattern, "d") as reader:  # the next ingest indexes the rest
            assert len(reader) == 12
    assert [s[1] for s in _states(catalog)] == ["ready"] * 4


def test_session_only_on_its_own_writable_catalog(tmp_path: Path) -> None:
    pattern = _shards(tmp_path / "ds", 1)
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(pattern, "d").close()
        job = _job(cat, "d")
        with (
            Catalog(tmp_path / "other.sqlite") as other,
            pytest.raises(CatalogError, match=r"an ingest job of .*c\.sqlite, not of"),
        ):
            other.store.ingest_session(job)
    with (
        Catalog(tmp_path / "c.sqlite", readonly=True) as cat,
        pytest.raises(CatalogError, match="was opened read-only"),
    ):
        cat.store.ingest_session(job)
    session = IngestSession(job)
    assert session.claim() is None  # (a session opens its connection when first used)
    session.close()
    session.close()


def test_reader_holds_a_read_only_handle(tmp_path: Path) -> None:
    pattern = _shards(tmp_path / "ds", 2)
    with Catalog(tmp_path / "c.sqlite") as cat, cat.ingest(pattern, "d") as reader:
        handle = reader.catalog
        assert isinstance(handle, ReadHandle) and not handle.owned
        for name in ("ingest", "drop", "ensure_dataset", "checkpoint", "ingest_session"):
            assert not hasattr(handle, name)
        row = handle.dataset_row("d")
        assert (row.name, row.format, row.key_rule) == ("d", "tfrecord", "feature:key")
        assert row.source == ["ds/*.tfrecord"]
        assert handle.query('SELECT count(*) FROM "d"') == [(6,)]
        # a reader given no re-indexer says so
        with Reader(ReadHandle(cat.store), "d") as plain:
            assert plain.get_feature("k1_2", "label") == 2
            with pytest.raises(CatalogError, match="cannot re-index it: open it through"):
                plain.rebuild_index()
        assert not cat.closed  # a handle on the Catalog's store leaves it open
        # pickled, the handle opens a store of its own; rebuild_index still works
        with TFRecordWriter(tmp_path / "ds" / "part-2.tfrecord") as writer:
            writer.write(make_example({"key": "new", "label": 9}).SerializeToString())
        with pickle.loads(pickle.dumps(reader)) as copy:
            assert copy.catalog.owned and copy.catalog is not handle
            copy.rebuild_index()
            assert len(copy) == 7 and copy.get_feature("new", "label") == 9
        assert copy.catalog.closed and not cat.closed
        reader.refresh()
        assert len(reader) == 7


def test_a_retried_task_takes_over_its_earlier_attempt_and_that_attempt_cannot_commit(
    tmp_path: Path,
) -> None:
    """A Ray task attempt claims as ``host:pid:start:tag``: a retry of the same task
    takes over the earlier attempt's claim at once, even one from another host
    (whose lease is ten minutes); the earlier attempt, should it still run, commits
    nothing; another task's or another ingest's tag takes nothing over."""
    import time

    from shardcat.catalog.processes import holder, is_dead, tag_of

    pattern = _shards(tmp_path / "ds", 2)
    catalog = tmp_path / "c.sqlite"
    with Catalog(catalog) as cat:
        cat.ingest(pattern, "d").close()
        job = _job(cat, "d")
        with sqlite3.connect(catalog) as conn:  # the first attempt, on a lost host
            (sid,) = conn.execute(
                "SELECT id FROM shardcat_shards WHERE path LIKE '%part-0%'"
            ).fetchone()
            earlier = f"gone-host:4242:99:ray-run1-{sid}-aaaa"
            conn.execute("UPDATE shardcat_shards SET state = 'pending'")
            conn.execute(
                "UPDATE shardcat_shards SET state = 'indexing', claim_owner = ?, claimed_at = ? "
                "WHERE id = ?",
                (earlier, time.time(), sid),
            )
        stored = "ds/part-0.tfrecord"
        with IngestSession(job, tag=f"ray-run1-{sid}-bbbb") as retry:
            assert (
                retry.owner.endswith(f":ray-run1-{sid}-bbbb")
                and tag_of(retry.owner) == f"ray-run1-{sid}-bbbb"
            )
            assert not is_dead(retry.owner, time.time(), 600.0)  # the tag is not the start time
            assert holder(earlier) == "gone-host:4242"
            assert retry.claim(only={stored}) is None  # without retry_of: the lease holds
            assert retry.claim(only={stored}, retry_of=f"ray-run1-{sid + 10}-") is None
            assert retry.claim(only={stored}, retry_of=f"ray-run2-{sid}-") is None
            claimed = retry.claim(only={stored}, retry_of=f"ray-run1-{sid}-")
            assert claimed is not None and claimed.owner == retry.owner
            path = str(tmp_path / stored)
            zombie = ClaimedShard(sid, stored, earlier)
            assert retry.commit(zombie, _version(path, job.options)) is None
            assert _states(catalog)[0][1] == "indexing"
            assert retry.commit(claimed, _version(path, job.options)) == (3, 0)
            assert retry.commit(claimed, _version(path, job.options)) is None  # once only
        assert _states(catalog) == [
            ("ds/part-0.tfrecord", "ready", None, 3),
            ("ds/part-1.tfrecord", "pending", None, 3),
        ]
        # a stopped Ray ingest gives back its tasks' claims, on any host
        with sqlite3.connect(catalog) as conn:
            conn.execute(
                "UPDATE shardcat_shards SET state = 'indexing', claim_owner = ?, claimed_at = ? "
                "WHERE path = 'ds/part-1.tfrecord'",
                ("gone-host:1:1:ray-run3-9-cccc", time.time()),
            )
        with IngestSession(job) as driver:
            driver.give_back(tagged="ray-run1-")
            assert _states(catalog)[1][1] == "indexing"
            driver.give_back(tagged="ray-run3-")
            assert _states(catalog)[1][1] == "pending"
