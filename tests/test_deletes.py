"""Soft deletes (issue 32, item 3): ``Catalog.delete(dataset, where=...)`` marks records
deleted without rewriting shards; readers raise ``KeyError`` for them and leave them
out of ``len``, positions, iteration and ``reader.index``; samplers and the SQL view
skip them; stats count them; a re-ingest and a snapshot keep them; ``undelete``
restores. On SQLite and PostgreSQL catalogs."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardcat import Catalog, make_example
from shardcat.catalog import versions
from shardcat.cli import app
from shardcat.errors import CatalogError, KeyNotFoundError, ShardcatWarning, StaleShardError
from shardcat.formats.tfrecord import TFRecordWriter
from shardcat.migrations import schema as schema_steps
from shardcat.readers.sampler import RecordSampler

runner = CliRunner()
KEYS = [f"r{i:02d}" for i in range(20)]
DEAD = ["r00", "r05", "r10", "r15"]  # label % 5 = 0
LIVE = [k for k in KEYS if k not in DEAD]


def write(path: Path, first: int, n: int, tag: bytes = b"") -> None:
    with TFRecordWriter(path) as w:
        for i in range(first, first + n):
            payload = {"key": f"r{i:02d}", "label": i, "image": tag + bytes([i]) * 30}
            w.write(make_example(payload).SerializeToString())


@pytest.fixture
def shards(tmp_path: Path) -> str:
    write(tmp_path / "a.tfrecord", 0, 10)
    write(tmp_path / "b.tfrecord", 10, 10)
    return str(tmp_path / "*.tfrecord")


def check_deleted(cat: Catalog) -> None:
    """What every reader, sampler and the view show with :data:`DEAD` deleted."""
    with cat.dataset("d") as reader:
        assert len(reader) == 16
        for key in DEAD:
            assert key not in reader
            assert reader.get_record(key) is None
            assert reader.get_feature(key, "label") is None
            with pytest.raises(KeyError, match=repr(key)):
                reader[key]
            with pytest.raises(KeyNotFoundError):
                reader.get_many(["r01", key])
        assert reader.get_keys() == LIVE
        assert [reader.key_at(p) for p in range(16)] == LIVE
        assert reader.keys_at(slice(0, 16)) == LIVE
        labels = [reader.to_dict(reader.get_record_at(p))["label"] for p in range(16)]
        assert labels == [int(k[1:]) for k in LIVE]
        many = reader.get_many_at([15, 0, 7])
        assert [reader.to_dict(r)["label"] for r in many] == [19, 1, 9]
        assert reader.to_dict(reader.get_record_at(-1))["label"] == 19
        with pytest.raises(IndexError):
            reader.get_record_at(16)
        assert reader.to_dict(reader["r01"])["image"] == bytes([1]) * 30
        assert list(reader.index) == LIVE and len(reader.index) == 16
        assert "r05" not in reader.index and reader.index.get("r05") is None
        assert reader.shard_starts() == [0, 8]
        stats = reader.get_stats()
        assert (stats["total_records"], stats["deleted_records"]) == (16, 4)
        seen = [reader.key_at(p) for p in RecordSampler(reader, 1, 0, seed=3)]
        assert sorted(seen) == LIVE
    info = cat.info("d")
    assert (info.records, info.deleted) == (20, 4)
    assert cat.query("SELECT count(*), sum(label) FROM d") == [(16, sum(range(20)) - 30)]
    assert cat.query("SELECT key FROM d WHERE label IN (4, 5, 6)") == [("r04",), ("r06",)]


def test_delete_hides_records_and_undelete_restores(tmp_path: Path, shards: str) -> None:
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(shards, "d", workers=1).close()
        before = cat.dataset("d")
        assert cat.delete("d", "label % 5 = ?", [0]) == 4
        assert cat.delete("d", keys=["r05", "r10"]) == 0  # already deleted
        check_deleted(cat)
        # an open reader sees the delete; its positions moved, so it says so
        assert before.get_record("r05") is None and len(before) == 16
        with pytest.raises(StaleShardError, match="refresh"):
            before.get_record_at(0)
        before.refresh()
        assert before.key_at(0) == "r01"
        before.close()
        assert cat.undelete("d", "label = 5") == 1
        assert cat.undelete("d", keys=["r10"]) == 1
        assert cat.undelete("d") == 2
        assert cat.undelete("d") == 0
        with cat.dataset("d") as reader:
            assert reader.get_keys() == KEYS and len(reader) == 20
            assert reader.get_stats()["deleted_records"] == 0
            assert reader.to_dict(reader["r05"])["label"] == 5
        assert cat.query("SELECT count(*) FROM d") == [(20,)]


def test_deletes_survive_reingest_and_snapshot(tmp_path: Path, shards: str) -> None:
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(shards, "d", workers=1).close()
        cat.delete("d", "label % 5 = 0")
        # shard b changes (new bytes): re-indexed, its deleted keys stay deleted
        write(tmp_path / "b.tfrecord", 10, 10, tag=b"v2")
        os.utime(tmp_path / "b.tfrecord", ns=(1, 1))
        cat.ingest(shards, "d", workers=1, rescan=True).close()
        check_deleted(cat)
        with cat.dataset("d") as reader:
            assert reader.to_dict(reader["r11"])["image"].startswith(b"v2")
        result = cat.snapshot("d", tmp_path / "snap.sqlite")
        assert result is not None
    with Catalog(tmp_path / "snap.sqlite", immutable=True) as snap:
        check_deleted(snap)


def test_bad_input(tmp_path: Path, shards: str) -> None:
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(shards, "d", workers=1).close()
        cat.ingest(shards, "p", key=None, workers=1).close()
        with pytest.raises(CatalogError, match=r"where= \(SQL\) or keys="):
            cat.delete("d")
        with pytest.raises(CatalogError, match="keyed by position"):
            cat.delete("p", "position = 1")
        with pytest.raises(CatalogError, match="no dataset 'nope'"):
            cat.delete("nope", "label = 1")
        with pytest.raises(CatalogError):  # the query's guards: no writes
            cat.delete("d", "1; DROP TABLE shardcat_deleted")
        with pytest.raises(CatalogError, match="no such column"):
            cat.delete("d", "nosuch = 1")
        assert cat.delete("d", keys=["not-a-key"]) == 1  # marks a key; nothing to hide
        with cat.dataset("d") as reader:
            assert len(reader) == 20
    ro = Catalog(tmp_path / "c.sqlite", readonly=True)
    with ro, pytest.raises(CatalogError, match="read-only"):
        ro.delete("d", "label = 1")


def test_cli_delete_and_undelete(tmp_path: Path, shards: str) -> None:
    db = str(tmp_path / "c.sqlite")
    with Catalog(db) as cat:
        cat.ingest(shards, "d", workers=1).close()
    done = runner.invoke(app, ["delete", "d", "--where", "label % 5 = 0", "--catalog", db])
    assert done.exit_code == 0, done.output
    assert "4 record(s) of d deleted" in done.stdout
    with Catalog(db) as cat:
        check_deleted(cat)
    shown = json.loads(runner.invoke(app, ["stats", "d", "--json", "--catalog", db]).stdout)
    assert (shown["total_records"], shown["deleted_records"]) == (16, 4)
    listed = json.loads(runner.invoke(app, ["datasets", "--json", "--catalog", db]).stdout)
    assert [(d["records"], d["deleted"]) for d in listed] == [(20, 4)]
    bad = runner.invoke(app, ["delete", "d", "--where", "nosuch = 1", "--catalog", db])
    assert bad.exit_code != 0 and "Traceback" not in bad.output
    done = runner.invoke(app, ["undelete", "d", "--catalog", db])
    assert done.exit_code == 0 and "4 record(s) of d restored" in done.stdout


def test_schema_step_adds_the_table(tmp_path: Path, shards: str) -> None:
    """A version-8 catalog upgrades to one with the (empty) deleted table."""
    step = next(n for n, f in schema_steps.STEPS.items() if f.__name__ == "_add_deleted")
    db = tmp_path / "c.sqlite"
    with Catalog(db) as cat:
        cat.ingest(shards, "d", workers=1).close()
    with sqlite3.connect(db) as conn:
        fresh = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'shardcat_deleted'")
        fresh_sql = fresh.fetchone()
        conn.execute("DROP TABLE shardcat_deleted")
        conn.execute("UPDATE shardcat_meta SET value = ? WHERE name = 'schema_version'", (step,))
    conn.close()
    with pytest.warns(ShardcatWarning, match=f"from schema version {step} to"), Catalog(db) as cat:
        assert cat.delete("d", "label % 5 = 0") == 4
        check_deleted(cat)
    with sqlite3.connect(db) as conn:
        got = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'shardcat_deleted'")
        upgraded = got.fetchone()
        version = conn.execute("SELECT value FROM shardcat_meta WHERE name = 'schema_version'")
        assert version.fetchone() == (str(versions.SCHEMA_VERSION),)
    conn.close()
    assert upgraded == fresh_sql


# -- bad records (issue 32, item 3: "set aside by ingest or verify are skipped the same way")


def test_verify_delete_bad_soft_deletes_what_it_found(tmp_path: Path) -> None:
    from checked import BAD, N
    from checked import write as write_damaged

    d = write_damaged("recordio", tmp_path / "data")
    db = tmp_path / "c.sqlite"
    with Catalog(db) as cat:
        cat.ingest(str(d.path), "d", workers=1).close()
        d.damage()
        problems = cat.verify("d", delete_bad=True)
        assert [(p.path, p.offset, p.key) for p in problems] == [(str(d.path), d.offset, d.key)]
        with cat.dataset("d") as reader:  # skipped as any soft-deleted record
            assert len(reader) == N - 1 and d.key not in reader
            assert reader.get_raw(d.key) is None
            with pytest.raises(KeyError):
                reader[d.key]
            assert reader.key_at(BAD) == f"k{BAD + 1}"
            seen = sorted(reader.key_at(p) for p in RecordSampler(reader, 1, 0, seed=2))
            assert seen == sorted(f"k{i}" for i in range(N) if i != BAD)
        assert cat.query("SELECT count(*) FROM d") == [(N - 1,)]
        assert cat.info("d").deleted == 1
        assert cat.verify("d") == []  # soft-deleted records are not re-read
        assert cat.undelete("d") == 1
        assert [p.key for p in cat.verify("d")] == [d.key]
    shown = runner.invoke(app, ["verify", "d", "--delete-bad", "--catalog", str(db)])
    assert shown.exit_code == 1, shown.output
    assert "1 bad record(s) of d soft-deleted" in shown.stderr
    again = runner.invoke(app, ["verify", "d", "--delete-bad", "--catalog", str(db)])
    assert again.exit_code == 0 and "40 records checked" not in again.stderr
    assert f"d: {N - 1} records checked, 0 bad" in again.stderr
    both = runner.invoke(app, ["verify", "d", "--delete-bad", "--immutable", "-c", str(db)])
    assert both.exit_code == 1 and "Traceback" not in both.output
    assert "--delete-bad writes to the catalog: not with --immutable" in both.stderr


def test_verify_delete_bad_refuses_before_reading(tmp_path: Path, shards: str) -> None:
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(shards, "p", key=None, workers=1).close()
        cat.ingest(shards, "d", workers=1).close()
        with pytest.raises(CatalogError, match="keyed by position"):
            cat.verify("p", delete_bad=True)
    with Catalog(tmp_path / "c.sqlite", readonly=True) as ro:
        assert ro.verify("d") == []
        with pytest.raises(CatalogError, match="read-only"):
            ro.verify("d", delete_bad=True)


def test_records_set_aside_at_ingest_are_no_records(tmp_path: Path) -> None:
    """An ingest that sets a bad record aside leaves it out of keys, positions,
    samplers and the SQL view, as a soft-deleted one."""
    from checked import BAD, N
    from checked import write as write_damaged

    d = write_damaged("tfrecord", tmp_path / "data")
    d.damage()
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(str(d.path), "d", workers=1, on_bad_record="skip").close()
        assert [b.key for b in cat.bad_records("d")] == [d.key]
        with cat.dataset("d") as reader:
            assert len(reader) == N - 1 and d.key not in reader
            assert reader.key_at(BAD) == f"r{BAD + 1}"
            seen = sorted(reader.key_at(p) for p in RecordSampler(reader, 1, 0, seed=2))
            assert seen == sorted(f"r{i}" for i in range(N) if i != BAD)
        assert cat.query("SELECT count(*) FROM d WHERE key = ?", [d.key]) == [(0,)]
        assert cat.query("SELECT count(*) FROM d") == [(N - 1,)]
        assert cat.verify("d") == []
