"""Tags (issue 32, item 2): ``Catalog.tag(dataset, name)`` pins a dataset's shard
versions and record set; ``"dataset@name"`` reads exactly that set later (readers,
samplers, the SQL view, snapshots) after re-ingests that change shards, adds,
deletes and undeletes; a pinned shard whose file changed is a ``StaleShardError``
naming the tag; ``untag`` removes the rows; on SQLite and PostgreSQL catalogs. A tag
reads the dataset's rows by reference (nothing copied when tagging; a tag of a subset
reads the donor's) and gets its own copy before an ingest writes them."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardcat import Catalog, make_example
from shardcat.catalog import versions
from shardcat.cli import app
from shardcat.errors import CatalogError, MissingShardError, ShardcatWarning, StaleShardError
from shardcat.formats.tfrecord import TFRecordWriter
from shardcat.migrations import schema as schema_steps
from shardcat.readers.sampler import RecordSampler
from shardcat.readers.torch import RecordDataset
from shardcat.testing.postgres import find_binaries, fresh_database, postgres_server
from tests.test_subset import sharing

runner = CliRunner()
KEYS = [f"r{i:02d}" for i in range(20)]


def write(path: Path, first: int, n: int, tag: bytes = b"", when: int | None = None) -> None:
    with TFRecordWriter(path) as w:
        for i in range(first, first + n):
            payload = {"key": f"r{i:02d}", "label": i, "image": tag + bytes([i]) * 30}
            w.write(make_example(payload).SerializeToString())
    if when is not None:  # a distinct mtime: the change is seen whatever the clock
        os.utime(path, ns=(when, when))


def image(reader, key: str) -> bytes:
    return bytes(reader.to_dict(reader[key])["image"])


@pytest.fixture
def shards(tmp_path: Path) -> str:
    write(tmp_path / "a.tfrecord", 0, 10)
    write(tmp_path / "b.tfrecord", 10, 10)
    return str(tmp_path / "*.tfrecord")


def check_pinned(cat: Catalog, name: str = "d@v1") -> None:
    """What the tag pinned: r00..r19 less r03 (deleted when tagged), old bytes."""
    want = [k for k in KEYS if k != "r03"]
    with cat.dataset(name) as reader:
        assert len(reader) == 19 and reader.get_keys() == want
        assert [reader.key_at(p) for p in range(19)] == want
        assert reader.get_record("r03") is None and "r03" not in reader
        assert image(reader, "r12") == bytes([12]) * 30  # not the re-ingested bytes
        assert reader.get_record("r20") is None  # added after the tag
        many = reader.get_many(["r19", "r00", "r11"])
        assert [reader.to_dict(r)["label"] for r in many] == [19, 0, 11]
        sampled = [reader.key_at(p) for p in RecordSampler(reader, 1, 0, seed=7)]
        assert sorted(sampled) == want
        halves = [list(RecordSampler(reader, 2, rank, seed=7)) for rank in (0, 1)]
        assert len(halves[0]) == len(halves[1]) == 10  # equal ranks: one repeated
        assert sorted({reader.key_at(p) for h in halves for p in h}) == want
    got = cat.query(f'SELECT count(*), sum(label) FROM "{name}"')
    assert got == [(19, sum(range(20)) - 3)]
    assert cat.query(f'SELECT key FROM "{name}" WHERE label IN (2, 3, 12)') == [
        ("r02",),
        ("r12",),
    ]


def change_everything(tmp_path: Path, cat: Catalog, shards: str) -> None:
    """After the tag: shard b rewritten (new bytes, one record fewer), shard c added,
    r03 restored, r00 deleted."""
    write(tmp_path / "b.tfrecord", 10, 9, tag=b"v2", when=10**18)
    write(tmp_path / "c.tfrecord", 20, 5)
    cat.undelete("d", keys=["r03"])
    cat.delete("d", keys=["r00"])
    cat.ingest(shards, "d", workers=1, rescan=True).close()
    with cat.dataset("d") as reader:  # the live dataset moved on
        assert len(reader) == 23 and "r03" in reader and "r00" not in reader
        assert image(reader, "r12").startswith(b"v2") and "r19" not in reader


def test_a_tag_reads_what_it_pinned_after_changes(tmp_path: Path, shards: str) -> None:
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(shards, "d", workers=1).close()
        cat.delete("d", keys=["r03"])
        cat.create_index("d", "label")
        info = cat.tag("d", "v1")
        assert cat.info("d@v1").indexed == ["label"]  # the tag's view is as fast
        assert (info.dataset, info.name, info.records, info.shards) == ("d", "v1", 19, 2)
        assert info.pinned == "d@v1"
        # shard b's file as tagged, kept aside: the tag reads it after b is rewritten
        (tmp_path / "b.tfrecord").rename(tmp_path / "kept.bin")
        change_everything(tmp_path, cat, shards)
        (tmp_path / "b.tfrecord").unlink()
        (tmp_path / "kept.bin").rename(tmp_path / "b.tfrecord")  # the same file (inode)
        check_pinned(cat)
        sql = 'SELECT count(*), sum(label) FROM "d@v1"'
        assert cat.query(sql, engine="duckdb") == [(19, sum(range(20)) - 3)]
        assert [d.name for d in cat.datasets()] == ["d"]  # a tag is no dataset of its own
        assert cat.info("d").tags == 1


def _rows(cat: Catalog) -> dict[str, int]:
    """Rows of every records table, of members and of seek points, by table."""
    conn = cat.store.reader_connection()
    names = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND (name LIKE "
            "'shardcat_records_%' OR name IN ('shardcat_members', 'shardcat_seek_indexes'))"
        )
    ]
    return {n: conn.execute(f'SELECT count(*) FROM "{n}"').fetchone()[0] for n in names}


def test_a_tag_copies_no_record(tmp_path: Path, shards: str) -> None:
    """A tag reads the dataset's rows by reference: tagging adds shard rows, shares
    and marks, no record, member or seek point."""
    _tar_gz(tmp_path / "a.tar.gz", 0, 30)
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(shards, "d", workers=1).close()
        cat.ingest(str(tmp_path / "*.tar.gz"), "t", workers=1).close()
        cat.delete("d", keys=["r03"])
        before = _rows(cat)
        assert (cat.tag("d", "v1").records, cat.tag("t", "v1").records) == (19, 30)
        after = _rows(cat)
        assert {n: after[n] for n in before} == before  # nothing copied
        assert sum(after.values()) == sum(before.values())  # the tags' own tables are empty
        assert (sharing(cat, "d@v1"), sharing(cat, "t@v1")) == ((2, 0), (1, 0))
        with cat.dataset("d@v1") as reader:
            assert len(reader) == 19 and image(reader, "r12") == bytes([12]) * 30
        with cat.dataset("t@v1") as reader:
            assert reader.get_record("sample0012") == {"txt": b"text 12", "cls": b"5"}


def test_a_reingest_gives_the_tag_its_copy_first(tmp_path: Path, shards: str) -> None:
    """The live dataset's re-ingest of a changed shard copies the tag's rows first
    (once): the tag reads its pinned bytes after it."""
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(shards, "d", workers=1).close()
        cat.tag("d", "v1")
        with cat.dataset("d@v1") as reader:
            pinned = {k: image(reader, k) for k in KEYS}
        (tmp_path / "b.tfrecord").rename(tmp_path / "kept.bin")
        write(tmp_path / "b.tfrecord", 10, 10, tag=b"v2", when=10**18)
        cat.ingest(shards, "d", workers=1, rescan=True).close()
        assert sharing(cat, "d@v1") == (0, 20)  # its own copy, made before b's rows changed
        write(tmp_path / "b.tfrecord", 10, 10, tag=b"v3", when=10**18 + 1)
        cat.ingest(shards, "d", workers=1, rescan=True).close()
        assert sharing(cat, "d@v1") == (0, 20)  # copied once
        with cat.dataset("d") as reader:
            assert image(reader, "r12").startswith(b"v3")
        (tmp_path / "b.tfrecord").unlink()
        (tmp_path / "kept.bin").rename(tmp_path / "b.tfrecord")
        with cat.dataset("d@v1") as reader:
            assert {k: image(reader, k) for k in KEYS} == pinned
            assert pinned["r12"] == bytes([12]) * 30


def test_a_tag_of_a_subset_shares_the_donors_rows(tmp_path: Path, shards: str) -> None:
    """A tag of a dataset that reads another's rows by reference shares the donor's
    rows; the donor's re-ingest copies both the subset's and the tag's."""
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(shards, "d", workers=1).close()
        cat.ingest(str(tmp_path / "b.tfrecord"), "sub", workers=1).close()
        assert sharing(cat, "sub") == (1, 0)
        cat.tag("sub", "v1")
        assert sharing(cat, "sub@v1") == (1, 0)
        ((donor,),) = cat.query(
            "SELECT DISTINCT x.donor_id FROM shardcat_shares x JOIN shardcat_datasets d "
            "ON d.id = x.dataset_id WHERE d.name = 'sub@v1'"
        )
        assert donor == cat.query("SELECT id FROM shardcat_datasets WHERE name = 'd'")[0][0]
        write(tmp_path / "a.tfrecord", 0, 10, tag=b"v2", when=10**18)
        cat.ingest(shards, "d", workers=1).close()  # a re-indexed, b's rows stay
        assert sharing(cat, "sub@v1") == (1, 0)
        cat.drop("d")
        assert (sharing(cat, "sub"), sharing(cat, "sub@v1")) == ((0, 10), (0, 10))
        with cat.dataset("sub@v1") as reader:
            assert reader.get_keys() == KEYS[10:] and image(reader, "r15") == bytes([15]) * 30


def test_untag_leaves_a_subset_reading_the_tags_rows_whole(tmp_path: Path, shards: str) -> None:
    """A tag that owns its rows may be a new subset's donor; untag copies them to the
    subset first."""
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(shards, "d", workers=1).close()
        cat.tag("d", "v1")
        cat.ingest(str(tmp_path / "a.tfrecord"), "d", workers=1).close()  # b left d
        assert sharing(cat, "d@v1") == (0, 20)
        cat.ingest(str(tmp_path / "b.tfrecord"), "sub", workers=1).close()
        assert sharing(cat, "sub") == (1, 0)  # the tag's rows: b is in no other dataset
        cat.untag("d", "v1")
        assert sharing(cat, "sub") == (0, 10)
        with cat.dataset("sub") as reader:
            assert reader.get_keys() == KEYS[10:] and image(reader, "r15") == bytes([15]) * 30


def test_a_changed_pinned_shard_is_a_named_error(tmp_path: Path, shards: str) -> None:
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(shards, "d", workers=1).close()
        cat.tag("d", "v1")
        write(tmp_path / "b.tfrecord", 10, 10, tag=b"v2", when=10**18)
        cat.ingest(shards, "d", workers=1, rescan=True).close()
        b = str(tmp_path / "b.tfrecord")
        with cat.dataset("d@v1") as reader:
            assert image(reader, "r02") == bytes([2]) * 30  # shard a is as pinned
            pinned = rf"tag 'v1' of dataset 'd' pins shard {b} as it was when tagged, and "
            with pytest.raises(StaleShardError, match=pinned + ".*changed after it was indexed"):
                reader["r12"]
            with pytest.raises(StaleShardError, match=pinned):
                reader.get_record_at(15)
        (tmp_path / "b.tfrecord").unlink()
        with cat.dataset("d@v1") as reader, pytest.raises(MissingShardError, match=pinned):
            reader["r12"]


def test_a_shard_the_dataset_dropped_still_reads(tmp_path: Path, shards: str) -> None:
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(shards, "d", workers=1).close()
        cat.tag("d", "v1")
        cat.ingest(str(tmp_path / "a.tfrecord"), "d", workers=1).close()  # b dropped
        with cat.dataset("d") as reader:
            assert len(reader) == 10 and "r12" not in reader
        with cat.dataset("d@v1") as reader:
            assert len(reader) == 20 and image(reader, "r12") == bytes([12]) * 30


def test_snapshot_and_torch_dataset_of_a_tag(tmp_path: Path, shards: str) -> None:
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(shards, "d", workers=1).close()
        cat.delete("d", keys=["r03"])
        cat.tag("d", "v1")
        (tmp_path / "b.tfrecord").rename(tmp_path / "kept.bin")
        change_everything(tmp_path, cat, shards)
        (tmp_path / "b.tfrecord").unlink()
        (tmp_path / "kept.bin").rename(tmp_path / "b.tfrecord")
        cat.snapshot("d@v1", tmp_path / "snap.sqlite")
        with cat.dataset("d@v1") as reader:
            data = RecordDataset(reader)
            assert len(data) == 19
            items = data.__getitems__(list(range(19)))
            assert [item["key"].decode() for item in items] == [k for k in KEYS if k != "r03"]
            assert items[11]["image"] == bytes([12]) * 30
    with Catalog(tmp_path / "snap.sqlite", immutable=True) as snap:
        check_pinned(snap)
        assert [d.name for d in snap.datasets()] == ["d@v1"]  # there, a dataset of its own


def test_tags_are_read_only_and_names_are_checked(tmp_path: Path, shards: str) -> None:
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(shards, "d", workers=1).close()
        cat.tag("d", "v1")
        refused = r"'d@v1': it is tag 'v1' of dataset 'd', and tags are read-only"
        with pytest.raises(CatalogError, match="cannot ingest into " + refused):
            cat.ingest(shards, "d@v1", workers=1)
        with pytest.raises(CatalogError, match="cannot delete records of " + refused):
            cat.delete("d@v1", "label = 1")
        with pytest.raises(CatalogError, match="cannot restore records of " + refused):
            cat.undelete("d@v1")
        with pytest.raises(CatalogError, match="cannot change the indexes of " + refused):
            cat.create_index("d@v1", "label")
        with pytest.raises(CatalogError, match=r"cannot drop .*`catalog untag d v1` removes it"):
            cat.drop("d@v1")
        with pytest.raises(CatalogError, match="cannot tag " + refused):
            cat.tag("d@v1", "v2")
        with pytest.raises(CatalogError, match="dataset 'd' has a tag 'v1' already"):
            cat.tag("d", "V1")
        with pytest.raises(CatalogError, match="invalid tag name 'a@b'"):
            cat.tag("d", "a@b")
        with pytest.raises(CatalogError, match=r"tag name 'x+' is too long for dataset 'd'"):
            cat.tag("d", "x" * 127)
        with pytest.raises(CatalogError, match="invalid tag name ''"):
            cat.tag("d", "")
        with pytest.raises(CatalogError, match="no dataset 'nope'"):
            cat.tag("nope", "v1")
        with pytest.raises(CatalogError, match=r"dataset 'd' has no tag 'v2' \(its tags: v1\)"):
            cat.untag("d", "v2")
        with pytest.raises(CatalogError, match="no dataset 'd@v2'"):
            cat.dataset("d@v2")
        with pytest.raises(CatalogError):  # the view is read-only SQL too
            cat.query('DELETE FROM "d@v1"')
        with cat.dataset("d@v1") as reader, pytest.raises(CatalogError, match="cannot ingest"):
            reader.rebuild_index()
    ro = Catalog(tmp_path / "c.sqlite", readonly=True)
    with ro, pytest.raises(CatalogError, match="read-only"):
        ro.tag("d", "v2")


def _tar_gz(path: Path, first: int, n: int) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for i in range(first, first + n):
            for ext, data in (("txt", f"text {i}".encode()), ("cls", str(i % 7).encode())):
                info = tarfile.TarInfo(f"sample{i:04d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_tar_members_seek_points_and_position_keys(tmp_path: Path, shards: str) -> None:
    """A compressed tar shard (members, seek points) and a dataset keyed by position
    read through their tags after the live datasets dropped or added shards."""
    _tar_gz(tmp_path / "a.tar.gz", 0, 30)
    _tar_gz(tmp_path / "b.tar.gz", 30, 5)
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(str(tmp_path / "*.tar.gz"), "t", workers=1).close()
        cat.ingest(shards, "p", key=None, workers=1).close()
        assert (cat.tag("t", "v1").records, cat.tag("p", "v1").records) == (35, 20)
        # an ingest without a name finds the dataset, never the tag's copy of it
        same_files = sorted(str(p) for p in tmp_path.glob("*.tfrecord"))  # another spelling
        assert cat.find_dataset(same_files) == "p"
        cat.ingest(str(tmp_path / "b.tar.gz"), "t", workers=1).close()  # a.tar.gz dropped
        write(tmp_path / "c.tfrecord", 20, 5)
        cat.ingest(shards, "p", key=None, workers=1).close()  # c added
        kept = cat.store.reader_connection().execute(
            "SELECT count(*) FROM shardcat_seek_indexes i JOIN shardcat_shards s "
            "ON s.id = i.shard_id JOIN shardcat_datasets d ON d.id = s.dataset_id "
            "WHERE d.name = 't@v1'"
        )
        assert kept.fetchone() == (2,)
        with cat.dataset("t") as live, cat.dataset("t@v1") as tag:
            assert (len(live), len(tag)) == (5, 35)
            assert tag.get_record("sample0012") == {"txt": b"text 12", "cls": b"5"}
            assert tag.get_feature("sample0031", "txt") == b"text 31"
            assert tag.key_at(29) == "sample0029"
        with cat.dataset("p") as live, cat.dataset("p@v1") as tag:
            assert (len(live), len(tag)) == (25, 20)
            assert tag.to_dict(tag["19"])["label"] == 19 and "20" not in tag
            assert tag.to_dict(tag.get_record_at(12))["key"] == b"r12"
        got = cat.query('SELECT key, label FROM "p@v1" WHERE position IN (0, 19) ORDER BY 1')
        assert got == [("0", 0), ("19", 19)]


def _pinned_rows(db: Path) -> tuple[int, int, int, list[str]]:
    """(datasets, shards, members+records tables, views) in the catalog file."""
    with sqlite3.connect(db) as conn:
        datasets = conn.execute("SELECT count(*) FROM shardcat_datasets").fetchone()[0]
        shards = conn.execute("SELECT count(*) FROM shardcat_shards").fetchone()[0]
        names = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') "
                "AND (name LIKE 'shardcat_records_%' OR name LIKE 'd%') ORDER BY name"
            )
        ]
    conn.close()
    return datasets, shards, len([n for n in names if n.startswith("shardcat_")]), names


def test_untag_removes_the_pinned_rows(tmp_path: Path, shards: str) -> None:
    db = tmp_path / "c.sqlite"
    with Catalog(db) as cat:
        cat.ingest(shards, "d", workers=1).close()
        before = _pinned_rows(db)
        cat.tag("d", "v1")
        cat.tag("d", "v2")
        assert [(t.dataset, t.name, t.records) for t in cat.tags()] == [
            ("d", "v1", 20),
            ("d", "v2", 20),
        ]
        assert _pinned_rows(db)[:3] == (3, 6, 3)
        gone = cat.untag("d", "v1")
        assert (gone.name, gone.records) == ("v1", 20)
        assert [t.name for t in cat.tags("d")] == ["v2"]
        assert _pinned_rows(db)[:3] == (2, 4, 2)
        with pytest.raises(CatalogError, match="no dataset 'd@v1'"):
            cat.dataset("d@v1")
        cat.drop("d")  # its tags go with it
        assert cat.tags() == []
        assert _pinned_rows(db) == (0, 0, 0, [])
        cat.ingest(shards, "d", workers=1).close()
        assert _pinned_rows(db)[:2] == before[:2]


def test_threads_read_a_tag_during_a_reingest(tmp_path: Path, shards: str) -> None:
    """Readers of the tag get the pinned bytes or the named error, never others."""
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(shards, "d", workers=1).close()
        cat.tag("d", "v1")
        stop = threading.Event()
        wrong: list[str] = []
        errors: list[BaseException] = []

        def read() -> None:
            with cat.dataset("d@v1") as reader:
                while not stop.is_set():
                    for i in range(20):
                        try:
                            got = image(reader, f"r{i:02d}")
                        except StaleShardError as exc:
                            if "tag 'v1' of dataset 'd'" not in str(exc):
                                errors.append(exc)
                            continue
                        if got != bytes([i]) * 30:
                            wrong.append(f"r{i:02d}")

        threads = [threading.Thread(target=read) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            for round_ in range(3):
                write(tmp_path / "b.tfrecord", 10, 10, tag=b"v%d" % round_, when=10**18 + round_)
                cat.ingest(shards, "d", workers=1, rescan=True).close()
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert wrong == [] and errors == []
        with cat.dataset("d@v1") as reader:
            assert image(reader, "r05") == bytes([5]) * 30


def test_cli_tag_tags_untag(tmp_path: Path, shards: str) -> None:
    db = str(tmp_path / "c.sqlite")
    with Catalog(db) as cat:
        cat.ingest(shards, "d", workers=1).close()
    done = runner.invoke(app, ["tag", "d", "v1", "--catalog", db])
    assert done.exit_code == 0, done.output
    assert "tagged d as d@v1: 20 record(s) in 2 shard(s)" in done.stdout
    listed = json.loads(runner.invoke(app, ["tags", "--json", "--catalog", db]).stdout)
    assert [(t["dataset"], t["name"], t["records"]) for t in listed] == [("d", "v1", 20)]
    listed = json.loads(runner.invoke(app, ["datasets", "--json", "--catalog", db]).stdout)
    assert [(d["name"], d["tags"]) for d in listed] == [("d", 1)]
    shown = runner.invoke(app, ["tags", "d", "--catalog", db])
    assert shown.exit_code == 0 and "v1" in shown.stdout
    stats = json.loads(runner.invoke(app, ["stats", "d@v1", "--json", "--catalog", db]).stdout)
    assert stats["total_records"] == 20
    rows = runner.invoke(app, ["query", 'SELECT count(*) FROM "d@v1"', "--catalog", db])
    assert rows.exit_code == 0 and "20" in rows.stdout
    bad = runner.invoke(app, ["tag", "d", "v1", "--catalog", db])
    assert bad.exit_code != 0 and "has a tag 'v1' already" in bad.output
    assert "Traceback" not in bad.output
    done = runner.invoke(app, ["untag", "d", "v1", "--catalog", db])
    assert done.exit_code == 0 and "removed tag v1 of d (20 record(s))" in done.stdout
    bad = runner.invoke(app, ["untag", "d", "v1", "--catalog", db])
    assert bad.exit_code != 0 and "has no tag 'v1'" in bad.output


def test_schema_step_adds_the_table(tmp_path: Path, shards: str) -> None:
    """A version-9 catalog upgrades to one with the (empty) tags table."""
    step = next(n for n, f in schema_steps.STEPS.items() if f.__name__ == "_add_tags")
    assert step == 9
    db = tmp_path / "c.sqlite"
    with Catalog(db) as cat:
        cat.ingest(shards, "d", workers=1).close()
    with sqlite3.connect(db) as conn:
        fresh = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'shardcat_tags'")
        fresh_sql = fresh.fetchone()
        conn.execute("DROP TABLE shardcat_tags")
        conn.execute("UPDATE shardcat_meta SET value = ? WHERE name = 'schema_version'", (step,))
    conn.close()
    with pytest.warns(ShardcatWarning, match=f"from schema version {step} to"), Catalog(db) as cat:
        assert cat.tag("d", "v1").records == 20
    with sqlite3.connect(db) as conn:
        upgraded = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'shardcat_tags'")
        assert upgraded.fetchone() == fresh_sql
        version = conn.execute("SELECT value FROM shardcat_meta WHERE name = 'schema_version'")
        assert version.fetchone() == (str(versions.SCHEMA_VERSION),)
    conn.close()


# -- PostgreSQL -------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    if find_binaries() is None:
        from shardcat.testing.required import missing

        missing("the PostgreSQL server binaries (initdb, postgres)")
    with postgres_server() as url:
        yield url


def test_tags_on_postgresql(tmp_path: Path, shards: str, server: str) -> None:
    with fresh_database(server) as url, Catalog(url) as cat:
        cat.ingest(shards, "d", workers=1).close()
        cat.delete("d", keys=["r03"])
        assert cat.tag("d", "v1").records == 19
        (tmp_path / "b.tfrecord").rename(tmp_path / "kept.bin")
        change_everything(tmp_path, cat, shards)
        (tmp_path / "b.tfrecord").unlink()
        (tmp_path / "kept.bin").rename(tmp_path / "b.tfrecord")
        check_pinned(cat)
        cat.untag("d", "v1")
        assert cat.tags() == []
        with pytest.raises(CatalogError, match="no dataset 'd@v1'"):
            cat.dataset("d@v1")
        cat.tag("d", "v2")
        cat.drop("d")  # its tags go with it
        assert cat.tags() == [] and cat.datasets() == []
        with pytest.raises(CatalogError, match="no dataset 'd@v2'"):
            cat.dataset("d@v2")
