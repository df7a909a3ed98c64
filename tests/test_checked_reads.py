"""Every read checked end to end (issue 26, items 1 and 2): the catalog keeps each
record's CRC32C and every read path compares the bytes it hands back with it; a
mismatch (bit rot past the fingerprint, an offset moved in the catalog, a swapped
legacy index) is a CorruptRecordError naming shard, offset and key; ``verify=False``
trusts the bytes; catalogs of schema version 6 are upgraded and checked by the
records' framing until re-ingested."""

from __future__ import annotations

import mmap
import pickle
import random
import sqlite3
from pathlib import Path

import crc32c as crc32c_package
import pytest
from checked import Damaged, every_read_refuses, write
from legacy_fixtures import quiet_stdout, write_tfrecords
from test_migrations import downgrade_to_v6
from typer.testing import CliRunner

from shardcat import Catalog, CorruptRecordError, TarRandomAccess, TFRecordRandomAccess
from shardcat.catalog.versions import SCHEMA_VERSION
from shardcat.cli import app
from shardcat.formats import checks, native
from shardcat.formats.tfrecord import masked_crc

KINDS = ["tfrecord", "tar", "recordio"]


def _table(kind: str) -> str:
    return "shardcat_members" if kind == "tar" else "shardcat_records_1"


@pytest.mark.parametrize("kind", KINDS)
def test_a_flipped_byte_past_the_fingerprint_is_refused_by_every_read_path(
    tmp_path: Path, kind: str
) -> None:
    d = write(kind, tmp_path / "data")
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(str(d.path), "d").close()
        with cat.dataset("d") as reader:
            assert reader.get_raw(d.key) == d.good
        d.damage()
        with cat.dataset("d") as reader:
            every_read_refuses(reader, d)
            problems = reader.verify()
            assert [(p.path, p.offset) for p in problems] == [(str(d.path), d.offset)]
        # the one opt-out: trust the bytes (the damaged bytes come back)
        with cat.dataset("d", verify=False) as reader:
            raw = reader.get_raw(d.key)
            assert raw != d.good and len(raw) == len(d.good)
            assert reader.verify() != []  # catalog verify checks whatever the reader's knob
        # a snapshot of the catalog checks its reads the same way
        cat.snapshot("d", tmp_path / "snap.sqlite")
    with Catalog(tmp_path / "snap.sqlite", immutable=True) as snap, snap.dataset("d") as reader:
        every_read_refuses(reader, d)


def test_the_drop_ins_check_by_default_and_verify_crc_stays_an_alias(tmp_path: Path) -> None:
    d = write("tfrecord", tmp_path / "data")
    with TFRecordRandomAccess(str(d.path)) as reader:
        assert reader.verify_crc and reader.get_raw(d.key) == d.good
    d.damage()
    with TFRecordRandomAccess(str(d.path)) as reader:
        every_read_refuses(reader, d)
    for knob in ({"verify": False}, {"verify_crc": False}):
        with TFRecordRandomAccess(str(d.path), **knob) as reader:
            assert not reader.verify_crc
            assert reader.get_raw(d.key) != d.good
    t = write("tar", tmp_path / "tar")
    with TarRandomAccess(str(t.path)) as reader:
        assert reader.get_feature(t.key, "image") == t.good["image"]
    t.damage()
    with TarRandomAccess(str(t.path)) as reader:
        every_read_refuses(reader, t)
    with TarRandomAccess(str(t.path), verify=False) as reader:
        assert reader.get_feature(t.key, "image") != t.good["image"]


def _ingested(kind: str, tmp_path: Path) -> tuple[Damaged, Path]:
    """A shard of ``kind`` (not damaged yet) ingested as dataset ``d`` of a new catalog."""
    d = write(kind, tmp_path / "data")
    db = tmp_path / "c.sqlite"
    with Catalog(db) as cat:
        cat.ingest(str(d.path), "d").close()
    return d, db


@pytest.mark.parametrize("kind", KINDS)
def test_an_offset_moved_in_the_catalog_is_refused_never_other_bytes(
    tmp_path: Path, kind: str
) -> None:
    d, db = _ingested(kind, tmp_path)
    with sqlite3.connect(db) as conn:  # one catalog bit flipped: the offset moves by one
        moved = conn.execute(
            f'UPDATE {_table(kind)} SET "offset" = "offset" + 1 WHERE "offset" = ?', (d.offset,)
        )
        assert moved.rowcount == 1
    d.offset += 1  # where the catalog now says the record is
    with Catalog(db) as cat, cat.dataset("d") as reader:
        every_read_refuses(reader, d, by_check=kind != "recordio")


@pytest.mark.parametrize("kind", KINDS)
def test_schema_step_7_adds_the_checks_and_reads_check_framing_until_reingested(
    tmp_path: Path, kind: str
) -> None:
    d = write(kind, tmp_path / "data")
    db = tmp_path / "c.sqlite"
    with Catalog(db) as cat:
        cat.ingest(str(d.path), "d").close()
        keys = cat.dataset("d").get_keys()
    downgrade_to_v6(db)
    with Catalog(db) as cat, cat.dataset("d") as reader:  # opening for writing upgrades
        assert [reader.get_raw(k) is not None for k in keys] == [True] * len(keys)
        assert reader.get_raw(d.key) == d.good
        assert reader.verify() == []
    with sqlite3.connect(db) as conn:
        assert conn.execute(
            "SELECT value FROM shardcat_meta WHERE name = 'schema_version'"
        ).fetchone() == (str(SCHEMA_VERSION),)
        assert (
            conn.execute(f"SELECT count(*) FROM {_table(kind)} WHERE crc IS NULL").fetchone()[0]
            == conn.execute(f"SELECT count(*) FROM {_table(kind)}").fetchone()[0]
        )
        # a moved offset is caught by the record's framing (no check stored yet)
        conn.execute(
            f'UPDATE {_table(kind)} SET "offset" = "offset" + 1 WHERE "offset" = ?', (d.offset,)
        )
    with Catalog(db) as cat, cat.dataset("d") as reader:
        with pytest.raises(CorruptRecordError) as err:
            reader.get_raw(d.key)
        header = 512 if kind == "tar" else 0  # a tar member's header block is checked
        assert (err.value.path, err.value.offset) == (str(d.path), d.offset + 1 - header)
        assert reader.get_raw(keys[0]) is not None
        cat.ingest(str(d.path), "d", rescan=True).close()  # re-ingesting stores the checks
    with sqlite3.connect(db) as conn:
        assert conn.execute(
            f"SELECT count(*) FROM {_table(kind)} WHERE crc IS NULL"
        ).fetchone() == (0,)
    d.damage()
    with Catalog(db) as cat, cat.dataset("d") as reader:
        every_read_refuses(reader, d)


def test_native_check_equals_the_fallback() -> None:
    assert native.available(), "the extension is built for the tests"
    assert checks.crc32c is checks.native_crc32c
    rng = random.Random(7)
    for size in [0, 1, 3, 7, 8, 9, 15, 16, 63, 64, 4095, 4096, 4097, 100_000]:
        data = rng.randbytes(size)
        want = crc32c_package.crc32c(data)
        assert checks.native_crc32c(data) == checks.fallback_crc32c(data) == want
        assert checks.native_crc32c(memoryview(data)[1:]) == crc32c_package.crc32c(data[1:])
        assert checks.native_crc32c(bytearray(data)) == want
        assert checks.unmask(masked_crc(data)) == want
    with mmap.mmap(-1, 5000) as mm:
        mm.write(rng.randbytes(5000))
        assert checks.native_crc32c(mm) == crc32c_package.crc32c(bytes(mm))
    with pytest.raises(TypeError):
        checks.native_crc32c("text")


def test_native_keyed_checks_equal_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard's stored checks in one native call: each check XOR its key's CRC32C
    (UTF-8, lone surrogates escaped), None kept; the same as the Python fallback."""
    keys = ["k0", "k\udcff", None, "é" * 300, "", "x", "k7"]
    found = [7, 2**32 - 1, 5, 0, None, 2**40, 123]
    want = [
        None
        if c is None
        else c
        if k is None
        else c ^ crc32c_package.crc32c(k.encode("utf-8", "surrogateescape"))
        for c, k in zip(found, keys, strict=True)
    ]
    assert want[2] == 5 and want[4] is None
    native_keyed = checks._native_keyed
    assert native_keyed is not None, "the extension is built for the tests"
    assert checks.keyed_checks(found, keys) == want
    assert native_keyed(tuple(found), tuple(keys)) == want  # any sequence
    with pytest.raises(ValueError, match="as many keys as checks"):
        native_keyed(found, keys[:-1])
    with pytest.raises(TypeError, match="a key is a str or None"):
        native_keyed([1], [b"k"])
    monkeypatch.setattr(checks, "_native_keyed", None)
    assert checks.keyed_checks(found, keys) == want


@pytest.mark.parametrize("kind", KINDS)
def test_native_and_reference_scans_store_the_same_checks(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = write(kind, tmp_path / "data")
    got = {}
    for fast in ("1", "0"):
        monkeypatch.setenv("SHARDCAT_NATIVE", fast)
        with Catalog(tmp_path / f"{fast}.sqlite") as cat:
            cat.ingest(str(d.path), "d").close()
            got[fast] = cat.query(f"SELECT * FROM {_table(kind)} ORDER BY 1, 2, 3")
    assert got["1"] == got["0"]
    raw = d.good["image"] if kind == "tar" else d.good
    # the check mixes the record's key (a member's: its sample's)
    mixed = crc32c_package.crc32c(raw) ^ crc32c_package.crc32c(d.key.encode())
    assert mixed in {r[-1] for r in got["1"]}
    assert mixed == checks.crc32c(raw) ^ checks.key_check(d.key)


# -- a swapped legacy index ---------------------------------------------------------------


def _swapped_tfd_index(paths: str, a: str, b: str) -> Path:
    """tfd-utils 1.3.0's own index of ``paths`` (its scan and ``_save_index``) with
    the entries of keys ``a`` and ``b`` swapped: both valid frames of the shard."""
    from tfd_utils import TFRecordRandomAccess as TfdReader

    with quiet_stdout():
        tfd = TfdReader(paths, use_multiprocessing=False, progress_interval=10**9)
        index = tfd._build_index()
        index[a], index[b] = index[b], index[a]
        tfd._save_index(index)
        tfd.close()
    return Path(tfd.index_file)


def test_a_swapped_tfd_index_is_confirmed_against_the_records(tmp_path: Path) -> None:
    (shard,) = write_tfrecords(tmp_path, shards=1, per_shard=1000)
    index = _swapped_tfd_index(str(shard), "r0_500", "r0_501")
    assert pickle.loads(index.read_bytes())["r0_500"]["offset"] > 0
    db = tmp_path / "shardcat.sqlite"
    runner = CliRunner()
    result = runner.invoke(app, ["migrate", str(tmp_path), "-c", str(db)])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.startswith("train_"))
    assert row.split()[1:6] == ["1", "0", "0", "1", "0"]  # shards, imported, verified, re-indexed
    assert "the record at byte 55348 has key='r0_500', the index says 'r0_501'" in result.output
    with Catalog(db) as cat:
        name = cat.datasets()[0].name
    with Catalog(db) as cat, cat.dataset(name) as reader:
        for key in ("r0_500", "r0_501"):
            assert reader.get_feature(key, "key") == key.encode()
    result = runner.invoke(app, ["verify", name, "-c", str(db)])
    assert result.exit_code == 0, result.output
    assert "1,000 records checked, 0 bad" in result.output


def test_a_swap_inside_the_catalog_is_refused_on_either_key_and_verify_lists_both(
    tmp_path: Path,
) -> None:
    (shard,) = write_tfrecords(tmp_path, shards=1, per_shard=100)
    db = tmp_path / "c.sqlite"
    with Catalog(db) as cat:
        cat.ingest(str(shard), "d").close()
    with sqlite3.connect(db) as conn:  # the two records' locations swapped, checks kept
        rows = {
            key: conn.execute(
                'SELECT "offset", length FROM shardcat_records_1 WHERE key = ?', (key,)
            ).fetchone()
            for key in ("r0_50", "r0_51")
        }
        for key, other in (("r0_50", "r0_51"), ("r0_51", "r0_50")):
            conn.execute(
                'UPDATE shardcat_records_1 SET "offset" = ?, length = ? WHERE key = ?',
                (*rows[other], key),
            )
    with Catalog(db) as cat, cat.dataset("d") as reader:
        for key in ("r0_50", "r0_51"):
            with pytest.raises(CorruptRecordError, match=f"record {key!r}: the bytes read"):
                reader.get_record(key)
            with pytest.raises(CorruptRecordError, match=f"record {key!r}: the bytes read"):
                reader.get_many([key])
    result = CliRunner().invoke(app, ["verify", "d", "-c", str(db)])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if "the bytes read" in line]
    assert [line.split(": ")[2] for line in lines] == ["record 'r0_51'", "record 'r0_50'"]
    assert "100 records checked, 2 bad" in result.output


def test_catalog_get_streams_a_checked_member_and_removes_it_when_damaged(tmp_path: Path):
    """``catalog get -o`` writes a tar member as it reads it; the bytes are checked
    when the last piece is in, and a damaged member leaves no file behind."""
    d, db = _ingested("tar", tmp_path)
    out = tmp_path / "member.bin"
    args = ["get", "d", d.key, "image", "-c", str(db), "-o", str(out)]
    runner = CliRunner()
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == d.good["image"]
    out.unlink()
    d.damage()
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert f"record {d.key!r}: the bytes read are not the record the catalog indexed" in (
        result.output
    )
    assert not out.exists()


# -- a key index entry naming another record's row ---------------------------------------


def _swap_keys(db: Path, a: str, b: str) -> None:
    """Exchange two rows' keys in the records table: the key index's entries of ``a``
    and ``b`` then name each other's (shard, ordinal), the rows' payloads unchanged."""
    with sqlite3.connect(db) as conn:
        t = "shardcat_records_1"
        conn.execute(f"UPDATE {t} SET key = '#swap' WHERE key = ?", (a,))
        conn.execute(f"UPDATE {t} SET key = ? WHERE key = ?", (a, b))
        conn.execute(f"UPDATE {t} SET key = ? WHERE key = '#swap'", (b,))


@pytest.mark.parametrize("kind", KINDS)
def test_a_key_index_entry_naming_another_row_is_refused_on_either_key(
    tmp_path: Path, kind: str
) -> None:
    """The stored check mixes the record's key: a read by key whose index entry
    names another record's row (here: record 20's key and record 2's exchanged)
    fails on the key it asked for, never returning the other record's bytes."""
    d = write(kind, tmp_path / "data")
    other = {"tfrecord": "r2", "tar": "s0002", "recordio": "k2"}[kind]
    db = tmp_path / "c.sqlite"
    with Catalog(db) as cat:
        cat.ingest(str(d.path), "d").close()
        with cat.dataset("d") as reader:
            assert reader.get_raw(d.key) == d.good
            good_other = reader.get_raw(other)
    offsets = {}
    with sqlite3.connect(db) as conn:
        for key in (d.key, other):
            offsets[key] = conn.execute(
                'SELECT m."offset" FROM shardcat_members m JOIN shardcat_records_1 r '
                "ON (m.shard_id, m.ordinal) = (r.shard_id, r.ordinal) "
                "WHERE r.key = ? AND m.name = 'image'"
                if kind == "tar"
                else 'SELECT "offset" FROM shardcat_records_1 WHERE key = ?',
                (key,),
            ).fetchone()[0]
    _swap_keys(db, d.key, other)
    # reads of d.key land on record 2's row (position 2): that offset, that key
    d.offset = offsets[other]
    with Catalog(db) as cat:
        with cat.dataset("d") as reader:
            every_read_refuses(reader, d, 2)
            for read in (reader.get_raw, reader.get_record, lambda k: reader.get_many([k])):
                with pytest.raises(CorruptRecordError) as err:
                    read(other)  # the other key: record 20's row
                assert err.value.offset == offsets[d.key]
                assert f"record {other!r}: the bytes read are not the record" in str(err.value)
            problems = reader.verify()  # both rows (a tar sample's every member)
            assert len(problems) == (4 if kind == "tar" else 2)
            assert set(offsets.values()) <= {p.offset for p in problems}
            assert reader.get_raw(reader.key_at(3)) is not None
            assert good_other != d.good
        with cat.dataset("d", verify=False) as reader:  # trusting the bytes: swapped
            assert reader.get_raw(d.key) == good_other
        cat.snapshot("d", tmp_path / "snap.sqlite")
    with Catalog(tmp_path / "snap.sqlite", immutable=True) as snap, snap.dataset("d") as reader:
        every_read_refuses(reader, d, 2)
    done = CliRunner().invoke(app, ["verify", "d", "-c", str(db)])
    assert done.exit_code == 1, done.output
    for key, now in ((d.key, other), (other, d.key)):  # each row by the key it now has
        assert f"at byte {offsets[key]} (key {now!r}): record {now!r}" in done.output
    assert "Traceback" not in done.output
