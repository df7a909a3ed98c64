"""Readers are tied to the shard version they index: forked workers, shards changed
or re-indexed under open readers, position keys, and the errors that replace
silently wrong bytes. Every format, plain and compressed."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import multiprocessing
import os
import random
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from shardcat import (
    Catalog,
    CatalogError,
    CorruptRecordError,
    MissingShardError,
    ShardcatError,
    StaleShardError,
    TFRecordWriter,
    make_example,
)
from shardcat.catalog import store as catalog_module
from shardcat.formats.recordio import RecordIOWriter
from shardcat.testing.required import need

COMPRESS: dict[str | None, Callable[[bytes], bytes]] = {
    None: lambda b: b,
    "gzip": lambda b: gzip.compress(b, 6),
    "bz2": lambda b: bz2.compress(b, 1),  # 100 KB blocks: several per shard
    "xz": lambda b: lzma.compress(b),
}
CASES = [
    *(("tfrecord", c) for c in COMPRESS),
    *(("tar", c) for c in COMPRESS),
    ("recordio", None),
]


def payload(rng: random.Random, i: int, version: int = 0) -> bytes:
    return f"v{version}-r{i:05d}-".encode() + rng.randbytes(rng.randrange(200, 3000))


def write_shard(
    path: Path, fmt: str, keys: list[str], payloads: list[bytes], compression: str | None = None
) -> None:
    """One shard holding ``payloads`` under ``keys`` (RecordIO: keys by position)."""
    buf = io.BytesIO()
    scratch = path.with_name(path.name + ".tmp")
    if fmt == "tfrecord":
        with TFRecordWriter(scratch) as w:
            for k, p in zip(keys, payloads, strict=True):
                w.write(make_example({"key": k, "data": p}))
        buf.write(scratch.read_bytes())
        scratch.unlink()
    elif fmt == "tar":
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
            for k, p in zip(keys, payloads, strict=True):
                info = tarfile.TarInfo(f"{k}.bin")
                info.size = len(p)
                tf.addfile(info, io.BytesIO(p))
    else:
        with RecordIOWriter(scratch, idx_path=None) as w:
            for p in payloads:
                w.write(p)
        buf.write(scratch.read_bytes())
        scratch.unlink()
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(COMPRESS[compression](buf.getvalue()))
    os.replace(tmp, path)


def read_value(reader, fmt: str, key: str) -> bytes:
    """The payload of ``key`` as the reader returns it."""
    if fmt == "tfrecord":
        return reader.get_feature(key, "data")
    if fmt == "tar":
        return reader.get_feature(key, "bin")
    return reader.get_raw(key)


def dataset(tmp_path: Path, fmt: str, compression: str | None, n: int = 300, shards: int = 2):
    """(catalog path, files, {key: payload}) of a fresh dataset "d"."""
    rng = random.Random(hash((fmt, compression)) & 0xFFFF)
    expected: dict[str, bytes] = {}
    files = []
    per = n // shards
    for s in range(shards):
        path = tmp_path / f"part-{s}.{fmt}"
        keys = [f"k{s}_{i:05d}" for i in range(per)]
        payloads = [payload(rng, s * per + i) for i in range(per)]
        write_shard(path, fmt, keys, payloads, compression)
        if fmt == "recordio":  # keyed by position across the shards
            keys = [str(s * per + i) for i in range(per)]
        expected.update(zip(keys, payloads, strict=True))
        files.append(path)
    db = tmp_path / "c.sqlite"
    with Catalog(db) as cat:
        cat.ingest([str(f) for f in files], "d", format=fmt, workers=1).close()
    return db, files, expected


# -- 1. forked workers --------------------------------------------------------------


def _child(reader, fmt: str, keys: list[str], expected: dict[str, bytes], queue) -> None:
    wrong, errors = 0, []
    for key in keys:
        try:
            if read_value(reader, fmt, key) != expected[key]:
                wrong += 1
        except Exception as exc:  # counted, reported by the parent
            errors.append(f"{type(exc).__name__}: {exc}")
    queue.put((wrong, errors[:3], len(errors)))


@pytest.mark.parametrize(("fmt", "compression"), CASES)
def test_forked_workers_read_their_own_bytes(tmp_path: Path, fmt: str, compression: str | None):
    """The parent reads first (its files and decompressors are open and positioned),
    then 4 forked workers read random records at once: every byte right."""
    db, _, expected = dataset(tmp_path, fmt, compression, n=800)
    reads = 25 if compression in ("bz2", "xz") else 200
    ctx = multiprocessing.get_context("fork")
    with Catalog(db, readonly=True) as cat, cat.dataset("d") as reader:
        keys = sorted(expected)
        for key in (keys[0], keys[-1]):  # one record of each shard: both sources open
            assert read_value(reader, fmt, key) == expected[key]
        queue = ctx.Queue()
        workers = []
        for w in range(4):
            mine = random.Random(w).choices(keys, k=reads)
            workers.append(ctx.Process(target=_child, args=(reader, fmt, mine, expected, queue)))
        for p in workers:
            p.start()
        results = [queue.get(timeout=120) for _ in workers]
        for p in workers:
            p.join(30)
            assert p.exitcode == 0
        assert [(wrong, n) for wrong, _, n in results] == [(0, 0)] * 4, results
        # and the parent's own source still reads right after its children
        assert all(read_value(reader, fmt, k) == expected[k] for k in keys[::29])


def test_dataloader_workers_over_a_compressed_tar(tmp_path: Path):
    torch_data = need("torch.utils.data", why="shardcat[torch]")
    from shardcat import RecordDataset

    db, _, expected = dataset(tmp_path, "tar", "gzip", n=200)
    with Catalog(db, readonly=True) as cat, cat.dataset("d") as reader:
        assert reader.get_record_at(0)  # the parent positions its gzip stream first
        keys = [reader.key_at(i) for i in range(len(reader))]
        loader = torch_data.DataLoader(
            RecordDataset(reader, transform=lambda record: record["bin"]),
            batch_size=None,
            num_workers=4,
            sampler=random.Random(1).sample(range(len(reader)), len(reader)),
        )
        got = list(loader)
        order = random.Random(1).sample(range(len(reader)), len(reader))
        assert got == [expected[keys[i]] for i in order]


# -- 2. shards replaced and re-indexed under open readers -----------------------------


@pytest.mark.parametrize(("fmt", "compression"), [("tar", None), ("tfrecord", "gzip")])
def test_a_replaced_and_reingested_shard_is_followed_never_mixed(
    tmp_path: Path, fmt: str, compression: str | None, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(catalog_module, "SNAPSHOT_SECONDS", 0.05)
    db, files, old = dataset(tmp_path, fmt, compression, n=100)
    rng = random.Random(7)
    keys = sorted(k for k in old if k.startswith("k0_"))
    new = {k: payload(rng, i, version=1) for i, k in enumerate(keys)}
    with Catalog(db, readonly=True) as cat, cat.dataset("d") as reader:
        assert read_value(reader, fmt, keys[0]) == old[keys[0]]  # the old file is open
        order = keys[::-1]  # another layout: every offset moves
        write_shard(files[0], fmt, order, [new[k] for k in order], compression)
        # not re-indexed yet: the open descriptor still holds the indexed bytes
        assert [read_value(reader, fmt, k) for k in keys] == [old[k] for k in keys]
        with Catalog(db) as writer:
            writer.ingest([str(f) for f in files], "d", format=fmt, workers=1).close()
        time.sleep(0.1)  # past the reader's snapshot
        assert [read_value(reader, fmt, k) for k in keys] == [new[k] for k in keys]
        assert reader.get_many(keys[:3], raw=True)  # one batch, one version


def test_a_replaced_shard_not_yet_reingested_is_stale_not_other_bytes(tmp_path: Path):
    db, files, old = dataset(tmp_path, "tar", None, n=40)
    keys = sorted(k for k in old if k.startswith("k0_"))
    with Catalog(db, readonly=True) as cat, cat.dataset("d") as reader:
        write_shard(files[0], "tar", keys[::-1], [old[k][::-1] for k in keys[::-1]])
        with pytest.raises(StaleShardError) as err:  # this reader never opened it
            read_value(reader, "tar", keys[3])
        assert err.value.path == str(files[0])
        assert str(err.value).startswith(f"{files[0]} changed after it was indexed: ")
        assert read_value(reader, "tar", "k1_00003") == old["k1_00003"]


def _rewrite_in_place(path: Path, data: bytes, keep_mtime: bool) -> None:
    st = path.stat()
    with open(path, "r+b") as f:
        f.write(data)
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("change", ["in-place", "in-place-mtime-kept", "truncated", "appended"])
def test_a_shard_changed_under_an_open_reader_is_stale(tmp_path: Path, change: str):
    db, files, old = dataset(tmp_path, "tar", None, n=40)
    keys = sorted(k for k in old if k.startswith("k0_"))
    with Catalog(db, readonly=True) as cat, cat.dataset("d") as reader:
        assert read_value(reader, "tar", keys[0]) == old[keys[0]]  # open, checked
        data = files[0].read_bytes()
        if change.startswith("in-place"):
            swapped = data[512:] + data[:512]  # same size, every member moved
            _rewrite_in_place(files[0], swapped, keep_mtime=change.endswith("kept"))
        elif change == "truncated":
            os.truncate(files[0], len(data) // 2)
        else:
            with open(files[0], "ab") as f:
                f.write(bytes(1024))
        for key in (keys[0], keys[5]):
            with pytest.raises(StaleShardError, match="changed after it was indexed") as err:
                read_value(reader, "tar", key)
            assert err.value.path == str(files[0])
        assert read_value(reader, "tar", "k1_00000") == old["k1_00000"]
        problems = reader.verify()
        assert [(p.path, p.offset) for p in problems] == [(str(files[0]), 0)]


def test_a_deleted_shard(tmp_path: Path):
    db, files, old = dataset(tmp_path, "tfrecord", None, n=40)
    with Catalog(db, readonly=True) as cat, cat.dataset("d") as reader:
        assert read_value(reader, "tfrecord", "k0_00000") == old["k0_00000"]
        files[0].unlink()
        # the open descriptor holds exactly the indexed bytes: served
        assert read_value(reader, "tfrecord", "k0_00007") == old["k0_00007"]
        files[1].unlink()
        with pytest.raises(MissingShardError) as err:  # never opened: gone
            read_value(reader, "tfrecord", "k1_00000")
        assert isinstance(err.value, FileNotFoundError)
        assert isinstance(err.value, StaleShardError)
        assert str(err.value) == (
            f"{files[1]} no longer exists (deleted or moved after it was indexed); "
            "re-ingest the dataset to drop it"
        )


def test_a_same_size_rewrite_with_restored_mtime_is_reindexed(tmp_path: Path):
    """``touch -r`` after rewriting: the sync compares the fingerprint and re-indexes."""
    path = tmp_path / "s.tfrecord"
    keys = [f"k{i:03d}" for i in range(20)]
    payloads = [bytes([i]) * 100 for i in range(20)]
    write_shard(path, "tfrecord", keys, payloads)
    db = tmp_path / "c.sqlite"
    with Catalog(db) as cat:
        cat.ingest(path, "d").close()
        st = path.stat()
        write_shard(path, "tfrecord", keys[::-1], payloads)  # same size, keys moved
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert path.stat().st_size == st.st_size
        with cat.dataset("d") as reader, pytest.raises(StaleShardError, match="fingerprint"):
            reader["k000"]
        problems = cat.verify("d")
        assert len(problems) == 1 and "fingerprint differs" in str(problems[0])
        with cat.ingest(path, "d") as reader:
            assert reader.get_feature("k000", "data") == payloads[19]
            assert reader.get_feature("k019", "data") == payloads[0]
        assert cat.verify("d") == []


def test_a_copied_catalog_and_shards_still_open(tmp_path: Path):
    """Same bytes under a new inode and ctime (cp, rsync): the fingerprint vouches."""
    src = tmp_path / "a"
    src.mkdir()
    db, files, old = dataset(src, "tfrecord", None, n=20)
    dst = tmp_path / "b"
    dst.mkdir()
    for f in [*files, db]:
        (dst / f.name).write_bytes(f.read_bytes())
        st = f.stat()
        os.utime(dst / f.name, ns=(st.st_atime_ns, st.st_mtime_ns))
    with Catalog(dst / db.name, readonly=True) as cat, cat.dataset("d") as reader:
        assert [read_value(reader, "tfrecord", k) for k in sorted(old)] == [
            old[k] for k in sorted(old)
        ]
    with Catalog(dst / db.name) as cat:  # a sync records the new identity, no re-index
        before = cat.query("SELECT id, generation, ino FROM shardcat_shards ORDER BY id")
        cat.ingest([str(dst / f.name) for f in files], "d").close()
        after = cat.query("SELECT id, generation, ino FROM shardcat_shards ORDER BY id")
        assert [r[:2] for r in after] == [r[:2] for r in before]
        assert [r[2] for r in after] == [(dst / f.name).stat().st_ino for f in files]


# -- 3. positions and position keys ---------------------------------------------------


def test_position_keys_never_silently_name_another_record(tmp_path: Path):
    db, files, old = dataset(tmp_path, "recordio", None, n=20)
    with Catalog(db) as cat, cat.dataset("d") as reader:
        assert reader["12"] == old["12"]  # second shard, 3rd record
        short = [bytes([9]) * 10] * 4
        write_shard(files[0], "recordio", ["0"] * 4, short)  # 10 -> 4 records
        cat.ingest([str(f) for f in files], "d").close()
        for read in (lambda: reader["12"], lambda: reader.get_raw("3"), lambda: reader.key_at(0)):
            with pytest.raises(StaleShardError, match="changed since this reader opened"):
                read()
        reader.refresh()  # take the new numbering
        assert len(reader) == 14
        assert reader["3"] == short[3]
        assert reader["6"] == old["12"]


def test_positions_of_a_keyed_dataset_are_pinned_keys_follow(tmp_path: Path):
    db, files, old = dataset(tmp_path, "tfrecord", None, n=20)
    with Catalog(db) as cat, cat.dataset("d") as reader:
        assert reader.features(reader.get_record_at(12))["data"] == [old["k1_00002"]]
        write_shard(files[0], "tfrecord", ["k0_00000"], [b"only"])
        cat.ingest([str(f) for f in files], "d").close()
        assert read_value(reader, "tfrecord", "k1_00002") == old["k1_00002"]
        assert read_value(reader, "tfrecord", "k0_00000") == b"only"
        assert reader.get_raw("k0_00005") is None  # gone from the new version
        with pytest.raises(StaleShardError, match=r"reader\.refresh"):
            reader.get_record_at(12)
        reader.refresh()
        assert reader.key_at(3) == "k1_00002"


def test_keys_stay_in_the_catalog_while_their_shard_is_reindexed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Between the sync and the commit of a re-index the old version stays: a reader
    holding the old file reads its bytes, a new reader finds the key (and a stale
    file, said so), nobody gets None; after the commit everyone reads the new bytes."""
    from shardcat.formats.tfrecord import TFRecordFormat as Format  # its own scan_shard

    monkeypatch.setattr(catalog_module, "SNAPSHOT_SECONDS", 0.05)
    db, files, old = dataset(tmp_path, "tfrecord", None, n=20)
    seen: list[object] = []
    real = Format.scan_shard

    with Catalog(db, readonly=True) as cat, cat.dataset("d") as early:
        assert read_value(early, "tfrecord", "k0_00001") == old["k0_00001"]

        def scan_and_look(fmt, path, options):
            time.sleep(0.1)
            seen.append((len(early), read_value(early, "tfrecord", "k0_00001")))
            with Catalog(db, readonly=True) as fresh, fresh.dataset("d") as late:
                seen.append((len(late), "k0_00001" in late))
                with pytest.raises(StaleShardError, match="changed after it was indexed"):
                    read_value(late, "tfrecord", "k0_00001")
            return real(fmt, path, options)

        keys = [f"k0_{i:05d}" for i in range(10)]
        write_shard(files[0], "tfrecord", keys, [b"new" + k.encode() for k in keys])
        monkeypatch.setattr(Format, "scan_shard", scan_and_look)
        with Catalog(db) as writer:
            writer.ingest([str(f) for f in files], "d", workers=1).close()
        assert seen == [(20, old["k0_00001"]), (20, True)]
        time.sleep(0.1)
        assert read_value(early, "tfrecord", "k0_00001") == b"newk0_00001"


# -- 4. errors instead of other exceptions ----------------------------------------------


def test_a_damaged_payload_that_does_not_parse_is_a_corrupt_record_error(tmp_path: Path):
    path = tmp_path / "big.tfrecord"
    with TFRecordWriter(path) as w:
        offsets = [w.write(make_example({"key": f"r{i}", "data": b"x" * 8000})) for i in range(40)]
    db = tmp_path / "c.sqlite"
    with Catalog(db) as cat:
        cat.ingest(path, "d").close()
        st = path.stat()
        with open(path, "r+b") as f:  # the length varint of the first feature, mid-file
            f.seek(offsets[20] + 12 + 3)
            f.write(b"\xff\xff\xff\xff\x0f")
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        with cat.dataset("d") as reader:  # the check catches it first
            with pytest.raises(CorruptRecordError) as err:
                reader.get_record("r20")
            assert (err.value.path, err.value.offset) == (str(path), offsets[20])
            assert "record 'r20': the bytes read are not the record" in str(err.value)
            assert reader.get_feature("r21", "data") == b"x" * 8000
        with cat.dataset("d", verify=False) as reader:  # trusting the bytes: decoding fails
            with pytest.raises(CorruptRecordError) as err:
                reader.get_record("r20")
            assert (err.value.path, err.value.offset) == (str(path), offsets[20])
            assert "cannot decode the record" in str(err.value)


def test_disk_full_during_ingest_is_a_catalog_error(tmp_path: Path, monkeypatch):
    from shardcat.catalog import engine

    first = tmp_path / "a.tfrecord"
    write_shard(first, "tfrecord", ["a"], [b"a"])
    db = tmp_path / "c.sqlite"
    with Catalog(db) as cat:
        cat.ingest(first, "small").close()
    big = tmp_path / "big.tfrecord"
    write_shard(big, "tfrecord", [f"k{i}" for i in range(3000)], [b"y" * 300] * 3000)
    real = engine.configure_writer

    def full_disk(conn):
        real(conn)
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages + 2}")

    monkeypatch.setattr(engine, "configure_writer", full_disk)
    with Catalog(db) as cat:
        with pytest.raises(CatalogError) as err:
            cat.ingest(big, "big", workers=1)
        assert str(err.value).startswith(f"cannot write the catalog {db}: ")
        assert "full" in str(err.value)
    monkeypatch.setattr(engine, "configure_writer", real)
    with Catalog(db, readonly=True) as cat, cat.dataset("small") as reader:
        assert read_value(reader, "tfrecord", "a") == b"a"  # what was there stays


def test_every_read_failure_is_a_shardcat_error(tmp_path: Path):
    db, files, _ = dataset(tmp_path, "tar", "gzip", n=40)
    with Catalog(db, readonly=True) as cat, cat.dataset("d") as reader:
        files[1].write_bytes(b"\x1f\x8b" + bytes(100))
        with pytest.raises(ShardcatError):
            read_value(reader, "tar", "k1_00000")
