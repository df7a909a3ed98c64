"""Dedup (issue 32, item 4): ``Catalog.dedup(dataset, across=[...], mark=False)`` and
``catalog dedup`` find exact duplicate records within a dataset and across datasets
of one catalog: candidates by the payload CRC32C of the stored checks, confirmed
byte by byte (a CRC32C collision is never a duplicate), the first kept (dataset
named first, then position); ``mark`` soft-deletes the others, ``undelete``
restores them. On SQLite and PostgreSQL catalogs."""

from __future__ import annotations

import io
import json
import sqlite3
import tarfile
from pathlib import Path

import crc32c as crc32c_package
import pytest
from typer.testing import CliRunner

from shardcat import Catalog, TFRecordWriter, make_example
from shardcat.catalog import dedup as dedup_sql
from shardcat.cli import app
from shardcat.errors import CatalogError
from shardcat.facade.dedup import Copy, DedupReport
from shardcat.formats.recordio import RecordIOWriter
from shardcat.readers.sampler import RecordSampler
from shardcat.testing.required import missing, need
from tests.checked import N
from tests.checked import write as write_damaged

runner = CliRunner()

_POLY = 0x82F63B78  # CRC32C, reflected


def forge(prefix: bytes, target: int) -> bytes:
    """``prefix`` and 4 bytes chosen so that its CRC32C is ``target``."""
    register = crc32c_package.crc32c(prefix) ^ 0xFFFFFFFF
    want = target ^ 0xFFFFFFFF
    for _ in range(32):  # undo the 32 shifts that four bytes of input take
        if want & 0x80000000:
            want = (((want ^ _POLY) << 1) | 1) & 0xFFFFFFFF
        else:
            want = (want << 1) & 0xFFFFFFFF
    return prefix + (want ^ register).to_bytes(4, "little")


def test_forge_makes_a_crc32c_collision() -> None:
    a, b = forge(b"one payload....", 0x1234ABCD), forge(b"another payload", 0x1234ABCD)
    assert a != b and len(a) == len(b)
    assert crc32c_package.crc32c(a) == crc32c_package.crc32c(b) == 0x1234ABCD


# payloads of dataset "a" (keys a0..a9) and "b" (b0..b5): a3, a7 are a0's bytes, a5 is
# a1's; b2 is a0's, b4 is a1's, b5 is b1's; a8/a9 collide (same CRC32C and length)
SAME = forge(b"collision one...", 0xC0FFEE00), forge(b"collision two...", 0xC0FFEE00)
A = [b"zero", b"one", b"two", b"zero", b"four", b"one", b"six", b"zero", SAME[0], SAME[1]]
B = [b"other0", b"other1", b"zero", b"other3", b"one", b"other1"]


def write_recordio(path: Path, prefix: str, payloads: list[bytes]) -> None:
    with RecordIOWriter(path) as w:
        for i, payload in enumerate(payloads):
            w.write(payload, key=f"{prefix}{i}")


@pytest.fixture
def two(tmp_path: Path) -> Path:
    """A catalog with datasets ``a`` and ``b`` (RecordIO: keys beside the payloads)."""
    write_recordio(tmp_path / "a.rec", "a", A)
    write_recordio(tmp_path / "b.rec", "b", B)
    db = tmp_path / "c.sqlite"
    with Catalog(db) as cat:
        cat.ingest(str(tmp_path / "a.rec"), "a", workers=1).close()
        cat.ingest(str(tmp_path / "b.rec"), "b", workers=1).close()
    return db


def groups(report: DedupReport) -> list[tuple[str, list[str]]]:
    """Each group as ``("dataset/key", ["dataset/key", ...])``."""

    def name(c: Copy) -> str:
        return f"{c.dataset}/{c.key}"

    return [(name(g.kept), [name(c) for c in g.duplicates]) for g in report.groups]


WITHIN_A = [("a/a0", ["a/a3", "a/a7"]), ("a/a1", ["a/a5"])]
ACROSS = [("a/a0", ["a/a3", "a/a7", "b/b2"]), ("a/a1", ["a/a5", "b/b4"]), ("b/b1", ["b/b5"])]


def check_found(cat: Catalog, deleted: int = 0) -> None:
    """What dedup finds in the catalog of :func:`two` (``deleted``: records of a
    without another copy deleted)."""
    within = cat.dedup("a")
    assert groups(within) == WITHIN_A
    assert (within.records, within.duplicates, within.candidates) == (10 - deleted, 3, 7)
    assert within.collisions == 2  # a8 and a9: the same CRC32C, other bytes
    assert within.bytes_compared == 4 * 3 + 3 * 2 + 2 * 20
    assert [g.length for g in within.groups] == [4, 3]
    across = cat.dedup("a", ["b"])
    assert groups(across) == ACROSS
    assert (across.records, across.duplicates, across.collisions) == (16 - deleted, 6, 2)
    # the first named is kept: b's copies come first the other way round
    assert groups(cat.dedup("b", ["a"]))[:2] == [
        ("b/b1", ["b/b5"]),
        ("b/b2", ["a/a0", "a/a3", "a/a7"]),
    ]


def test_planted_duplicates_within_and_across_datasets(two: Path) -> None:
    with Catalog(two, readonly=True) as cat:  # finding them writes nothing
        check_found(cat)
        steps: list[tuple[str, int, int]] = []
        cat.dedup("a", ["b"], progress=lambda *step: steps.append(step))
        assert steps[:2] == [("scan", 10, 16), ("scan", 16, 16)]  # a page a dataset here
        compared = [done for stage, done, total in steps[2:] if stage == "compare" and total == 11]
        assert len(compared) == 4 == len(steps) - 2  # a group at a time, in CRC32C order
        assert compared == sorted(compared) and compared[-1] == 11
        assert cat.dedup("b").duplicates == 1
        with pytest.raises(CatalogError, match="read-only"):
            cat.dedup("a", mark=True)
    with Catalog(two) as cat:
        cat.snapshot(["a", "b"], two.parent / "snap.sqlite")
    with Catalog(two.parent / "snap.sqlite", immutable=True) as snap:  # no locks, no writes
        check_found(snap)


def test_pages_of_records(two: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dedup_sql, "PAGE", 3)
    with Catalog(two) as cat:
        cat.delete("a", keys=["a2", "a6"])  # pages end past deleted records
        check_found(cat, deleted=2)


def check_marked(cat: Catalog) -> None:
    """After ``mark`` over a and b: readers, samplers and the views skip the copies."""
    marked = {"a": ["a3", "a5", "a7"], "b": ["b2", "b4", "b5"]}
    for name, payloads in (("a", A), ("b", B)):
        with cat.dataset(name) as reader:
            live = [f"{name}{i}" for i in range(len(payloads)) if f"{name}{i}" not in marked[name]]
            assert reader.get_keys() == live and len(reader) == len(live)
            for key in marked[name]:
                assert key not in reader and reader.get_raw(key) is None
            seen = sorted(reader.key_at(p) for p in RecordSampler(reader, 1, 0, seed=1))
            assert seen == sorted(live)
        assert cat.query(f"SELECT count(*) FROM {name}") == [(len(live),)]


def test_mark_deletes_all_but_the_first_and_undelete_restores(two: Path) -> None:
    with Catalog(two) as cat:
        report = cat.dedup("a", ["b"], mark=True)
        assert groups(report) == ACROSS and report.marked == {"a": 3, "b": 3}
        check_marked(cat)
        again = cat.dedup("a", ["b"], mark=True)  # idempotent: nothing left to mark
        assert (again.duplicates, again.marked, again.records) == (0, {}, 10)
        assert again.collisions == 2
        assert cat.undelete("a") == 3 and cat.undelete("b") == 3
        assert groups(cat.dedup("a", ["b"])) == ACROSS


def _tar(path: Path, samples: dict[str, dict[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for key, members in samples.items():
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_tar_samples_are_duplicates_when_every_member_is(tmp_path: Path) -> None:
    _tar(
        tmp_path / "t.tar",
        {
            "s0": {"jpg": b"IMG-A", "cls": b"1"},
            "s1": {"jpg": b"IMG-A", "cls": b"2"},  # another label: not a duplicate
            "s2": {"jpg": b"IMG-A", "cls": b"1"},
            "s3": {"jpg": b"IMG-A"},  # a member missing: not a duplicate
            "s4": {"png": b"IMG-A", "cls": b"1"},  # another member name: not one
        },
    )
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(str(tmp_path / "t.tar"), "t", workers=1).close()
        report = cat.dedup("t", mark=True)
        assert groups(report) == [("t/s0", ["t/s2"])]
        assert report.groups[0].length == 6 and report.collisions == 0
        with cat.dataset("t") as reader:
            assert reader.get_keys() == ["s0", "s1", "s3", "s4"]


def test_datasets_keyed_by_position(tmp_path: Path) -> None:
    write_recordio(tmp_path / "a.rec", "a", A)
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(str(tmp_path / "a.rec"), "p", key=None, workers=1).close()
        assert groups(cat.dedup("p")) == [("p/0", ["p/3", "p/7"]), ("p/1", ["p/5"])]
        with pytest.raises(CatalogError, match="'p' is keyed by position"):
            cat.dedup("p", mark=True)


def test_records_without_a_stored_check_are_read(two: Path) -> None:
    """Rows indexed before checks were stored (schema version 7): their CRC32C is
    computed from their bytes."""
    with sqlite3.connect(two) as conn:
        conn.execute("UPDATE shardcat_records_2 SET crc = NULL WHERE key IN ('b2', 'b5')")
    conn.close()
    with Catalog(two) as cat:
        report = cat.dedup("a", ["b"])
        assert report.computed == 2
        assert groups(report) == ACROSS


def test_parquet_rows_are_refused(tmp_path: Path) -> None:
    pa = need("pyarrow", why="shardcat[parquet]")
    pq = need("pyarrow.parquet", why="shardcat[parquet]")
    pq.write_table(pa.table({"key": ["k0", "k1"], "v": [1, 1]}), tmp_path / "a.parquet")
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(str(tmp_path / "a.parquet"), "a", workers=1).close()
        with pytest.raises(CatalogError, match="'a' is Parquet: its records have no bytes"):
            cat.dedup("a")


def test_tfrecords_holding_their_key_differ_but_copies_across_datasets_match(
    tmp_path: Path,
) -> None:
    """A TFRecord example holding its key is another record under another key; the
    same example in two datasets is a duplicate."""
    for name, keys in (("a", ["x", "y", "z"]), ("b", ["y", "w"])):
        with TFRecordWriter(tmp_path / f"{name}.tfrecord") as w:
            for key in keys:
                w.write(make_example({"key": key, "image": b"same bytes"}).SerializeToString())
    with Catalog(tmp_path / "c.sqlite") as cat:
        for name in ("a", "b"):
            cat.ingest(str(tmp_path / f"{name}.tfrecord"), name, workers=1).close()
        assert cat.dedup("a").duplicates == 0
        assert groups(cat.dedup("a", ["b"])) == [("a/y", ["b/y"])]


def test_bad_input(two: Path) -> None:
    with Catalog(two) as cat:
        with pytest.raises(CatalogError, match="no dataset 'nope'"):
            cat.dedup("nope")
        with pytest.raises(CatalogError, match="no dataset 'nope'"):
            cat.dedup("a", ["nope"], mark=True)
        with pytest.raises(CatalogError, match="dataset 'a' named twice"):
            cat.dedup("a", ["b", "a"])
        assert cat.info("a").deleted == 0  # nothing marked by a refused call


def test_cli(two: Path) -> None:
    db = str(two)
    done = runner.invoke(app, ["dedup", "a", "--across", "b", "--catalog", db])
    assert done.exit_code == 0, done.output
    assert done.stdout.splitlines() == [
        "a 'a0' (4 bytes): a 'a3', a 'a7', b 'b2'",
        "a 'a1' (3 bytes): a 'a5', b 'b4'",
        "b 'b1' (6 bytes): b 'b5'",
    ]
    assert "a, b: 16 records, 6 duplicate(s) in 3 group(s); 11 candidate(s) compared" in (
        done.stderr
    )
    assert "2 CRC32C collision(s)" in done.stderr
    shown = json.loads(runner.invoke(app, ["dedup", "a", "--json", "-c", db]).stdout)
    assert (shown["duplicates"], shown["records"], shown["collisions"]) == (3, 10, 2)
    assert shown["groups"][0] == {
        "kept": {"dataset": "a", "key": "a0"},
        "duplicates": [{"dataset": "a", "key": "a3"}, {"dataset": "a", "key": "a7"}],
        "length": 4,
    }
    marked = runner.invoke(app, ["dedup", "a", "--across", "b", "--mark", "-c", db])
    assert marked.exit_code == 0, marked.output
    assert "marked deleted: a 3, b 3 (catalog undelete restores them)" in marked.stderr
    with Catalog(db) as cat:
        check_marked(cat)
    again = runner.invoke(app, ["dedup", "a", "--across", "b", "--mark", "-c", db])
    assert again.exit_code == 0 and again.stdout == "" and "nothing to mark" in again.stderr
    for args in (["dedup", "nope"], ["dedup", "a", "--across", "a"]):
        bad = runner.invoke(app, [*args, "-c", db])
        assert bad.exit_code == 1 and "Traceback" not in bad.output
        assert bad.stderr.startswith("error: ")


def test_a_postgresql_catalog(tmp_path: Path) -> None:
    need("psycopg", why="shardcat[postgres]")
    from shardcat.testing.postgres import find_binaries, fresh_database, postgres_server

    if find_binaries() is None:
        missing("the PostgreSQL server binaries (initdb, postgres)")
    write_recordio(tmp_path / "a.rec", "a", A)
    write_recordio(tmp_path / "b.rec", "b", B)
    with postgres_server() as server, fresh_database(server) as url, Catalog(url) as cat:
        cat.ingest(str(tmp_path / "a.rec"), "a", workers=1).close()
        cat.ingest(str(tmp_path / "b.rec"), "b", workers=1).close()
        check_found(cat)
        assert cat.dedup("a", ["b"], mark=True).marked == {"a": 3, "b": 3}
        check_marked(cat)
        assert cat.dedup("a", ["b"], mark=True).marked == {}
        assert cat.undelete("a") == 3
        # verify's bad records soft-deleted the same way on a server (issue 32, item 3)
        d = write_damaged("recordio", tmp_path / "data")
        cat.ingest(str(d.path), "v", workers=1).close()
        d.damage()
        assert [p.key for p in cat.verify("v", delete_bad=True)] == [d.key]
        with cat.dataset("v") as reader:
            assert d.key not in reader and len(reader) == N - 1
        assert cat.verify("v") == [] and cat.undelete("v") == 1
