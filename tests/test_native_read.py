"""The native single read by key (issue 31, item 1; shardcat.readers.hot): the same
values as the Python path for every feature kind and odd Example, every failure left
to the Python path (a flipped byte, a lying catalog row, a changed shard), threads,
a forked child, and ``SHARDCAT_NATIVE=0`` (the pure-Python fallback)."""

from __future__ import annotations

import os
import pickle
import random
import sqlite3
import threading
import traceback
from pathlib import Path
from typing import Any

import pytest
from checked import write
from features import b, ex_bytes, f32, i64

from shardcat import Catalog, CorruptRecordError, StaleShardError
from shardcat.catalog import lookup
from shardcat.formats.tfrecord import TFRecordWriter
from shardcat.readers import hot
from shardcat.readers.hot import AGAIN

FEATURES = ("image", "label", "score", "empty", "many", "nothing", "key")


def _records(n: int = 60) -> list[bytes]:
    out = []
    for i in range(n):
        out.append(
            ex_bytes(
                key=b(f"k{i}".encode()),
                image=b(random.Random(i).randbytes(300 + i)),
                label=i64(i - 30, 7),
                score=f32(i / 3, 1.5),
                empty=b(),
                many=i64(*range(i % 5)),
            )
        )
    # odd wires the native walk leaves to protobuf: a repeated map key (the last wins)
    # and a packed float run that is empty before the values
    twice = ex_bytes(key=b(b"twice"), image=b(b"first")) + ex_bytes(image=b(b"second"))
    # (settled natively) a float list of an empty packed run, then 1.5
    floats = _field(1, b"") + _field(1, bytes.fromhex("0000c03f"))
    entries = _field(1, _field(1, b"key") + _field(2, _field(1, _field(1, b"run"))))
    entries += _field(1, _field(1, b"score") + _field(2, _field(2, floats)))
    return [*out, twice, _field(1, entries)]


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (payloads under 128 bytes)."""
    return bytes([number << 3 | 2, len(payload)]) + payload


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    records = _records()
    for s in range(2):
        with TFRecordWriter(data / f"s{s}.tfrecord") as w:
            for raw in records[s::2]:
                w.write(raw)
    db = tmp_path / "c.sqlite"
    with Catalog(db) as cat:
        cat.ingest(str(data / "*.tfrecord"), "d").close()
    return db


def _keys() -> list[str]:
    return [f"k{i}" for i in range(60)] + ["twice", "run", "missing"]


def _python(reader: Any, key: str, name: str) -> Any:
    """What the Python path reads (the reference)."""
    record = reader._get_record(key)
    if record is None:
        return None
    values = reader._fmt.feature_list(record, name)
    return values[0] if values else None


def test_native_reads_equal_the_python_path_for_every_feature_kind(catalog: Path) -> None:
    if os.environ.get("CI"):
        assert hot.available()  # CI builds the extension: the native path is tested
    if not hot.available():
        pytest.skip("the native read is not built")
    with Catalog(catalog) as cat, cat.dataset("d") as reader:
        reader.get_record("k0"), reader.get_record("k1")  # open both shards' sources
        settled = 0
        for key in _keys():
            for name in FEATURES:
                native = reader._native(key, name)
                settled += native is not AGAIN
                assert reader.get_feature(key, name) == _python(reader, key, name), (key, name)
            record = reader.get_record(key)
            reference = reader._get_record(key)
            assert (record is None) == (reference is None)
            if record is not None:
                assert record.SerializeToString() == reference.SerializeToString()
        assert reader.get_feature("k3", "label") == -27 and reader.get_feature("k3", "score") == 1.0
        assert reader.get_feature("twice", "image") == b"second"
        assert reader.get_feature("run", "score") == 1.5
        assert reader["k4"].features.feature["key"].bytes_list.value[0] == b"k4"
        # all but the repeated map key are settled natively
        assert settled == 62 * len(FEATURES)


def test_a_native_read_of_pages_not_in_the_page_cache(catalog: Path) -> None:
    """The page cache first (no GIL let go), else a read that waits with the GIL
    released: pages dropped from the cache read the same bytes natively."""
    if os.environ.get("CI"):
        assert hot.available()
    if not hot.available():
        pytest.skip("the native read is not built")
    shards = sorted((catalog.parent / "data").glob("*.tfrecord"))
    with Catalog(catalog) as cat, cat.dataset("d") as reader:
        # (every key but "twice", whose repeated map key the native walk leaves to Python)
        want = {key: _python(reader, key, "image") for key in _keys() if key != "twice"}
        for rounds in range(3):
            for shard in shards:  # (written, then synced: clean pages the kernel drops)
                fd = os.open(shard, os.O_RDONLY)
                try:
                    os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
            got = {key: reader._native(key, "image") for key in want}
            assert got == want, rounds
        assert want["k7"] == random.Random(7).randbytes(307) and want["missing"] is None


def test_shardcat_native_0_reads_in_python(catalog: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDCAT_NATIVE", "0")
    with Catalog(catalog) as cat, cat.dataset("d") as reader:
        assert reader._hot is None and reader._native("k1", "image") is AGAIN
        assert reader.get_feature("k5", "label") == -25
        assert reader.get_feature("twice", "image") == b"second"
        assert reader.get_record("missing") is None


def _warm(reader: Any, key: str, name: str, value: Any) -> None:
    """Assert ``key``'s ``name`` is ``value``, read natively where it is built."""
    assert reader.get_feature(key, name) == value  # (opens the shard's source)
    assert reader._native(key, name) == (value if hot.available() else AGAIN)


def _payload_at(db: Path, key: str) -> tuple[str, int]:
    with sqlite3.connect(db) as conn:
        path, offset = conn.execute(
            'SELECT s.path, r."offset" FROM shardcat_records_1 r '
            "JOIN shardcat_shards s ON s.id = r.shard_id WHERE r.key = ?",
            (key,),
        ).fetchone()
    return str(db.parent / path) if not os.path.isabs(path) else path, offset


def test_a_flipped_byte_under_a_warm_native_reader_is_refused(tmp_path: Path) -> None:
    d = write("tfrecord", tmp_path / "data")  # the record sits past the fingerprint
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(str(d.path), "d").close()
        with cat.dataset("d") as reader:
            _warm(reader, d.key, "key", d.key.encode())
            d.damage()
            for read in (
                lambda: reader.get_feature(d.key, "image"),
                lambda: reader.get_record(d.key),
                lambda: reader[d.key],
            ):
                with pytest.raises(CorruptRecordError) as err:
                    read()
                assert (err.value.path, err.value.offset) == (str(d.path), d.offset)
                assert f"record {d.key!r}: the bytes read are not the record" in str(err.value)
            assert reader.get_feature("r21", "key") == b"r21"  # the others still read


def test_a_lying_catalog_row_is_refused_never_other_bytes(catalog: Path) -> None:
    with Catalog(catalog) as cat, cat.dataset("d") as reader:
        _warm(reader, "k20", "label", -10)
        # the key index now names another record's row (its offset and crc are k22's)
        with sqlite3.connect(catalog) as conn:
            row = conn.execute(
                'SELECT "offset", length, crc FROM shardcat_records_1 WHERE key = ?', ("k22",)
            ).fetchone()
            conn.execute(
                'UPDATE shardcat_records_1 SET "offset" = ?, length = ?, crc = ? WHERE key = ?',
                (*row, "k20"),
            )
        reader.refresh()
        with pytest.raises(CorruptRecordError, match="record 'k20': the bytes read are not"):
            reader.get_feature("k20", "label")
        assert reader.get_feature("k22", "label") == -8


def test_a_shard_rewritten_under_a_warm_native_reader_is_stale(catalog: Path) -> None:
    path, _ = _payload_at(catalog, "k0")
    with Catalog(catalog) as cat, cat.dataset("d") as reader:
        _warm(reader, "k2", "label", -28)
        with open(path, "ab") as f:
            f.write(b"appended")
        with pytest.raises(StaleShardError, match="changed after it was indexed"):
            reader.get_feature("k2", "label")


def test_threads_share_a_native_reader(catalog: Path) -> None:
    expected = {f"k{i}": i - 30 for i in range(60)}
    errors: list[BaseException] = []
    together = threading.Barrier(6)  # every thread alive at once: 6 connections
    with Catalog(catalog) as cat, cat.dataset("d") as reader:

        def work(seed: int) -> None:
            try:
                rng = random.Random(seed)
                for i in range(300):
                    key = f"k{rng.randrange(60)}"
                    assert reader.get_feature(key, "label") == expected[key]
                    if i == 0:
                        together.wait(timeout=60)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        if hot.available():
            assert len(reader._hot._by_conn) == 6  # a lookup per thread's connection


def test_a_forked_child_prepares_its_own_lookup(catalog: Path) -> None:
    keys = [f"k{i}" for i in range(0, 60, 7)]
    with Catalog(catalog) as cat, cat.dataset("d") as reader:
        parent = [reader.get_feature(k, "image") for k in keys]  # lookups prepared, fds open
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 1
            try:
                os.close(rfd)
                try:
                    payload: Any = ("ok", [reader.get_feature(k, "image") for k in keys])
                    payload += (len(reader._hot._by_conn) if reader._hot else 2,)
                    code = 0
                except BaseException:
                    payload = ("error", traceback.format_exc())
                with os.fdopen(wfd, "wb") as pipe:
                    pipe.write(pickle.dumps(payload))
            finally:
                os._exit(code)
        os.close(wfd)
        with os.fdopen(rfd, "rb") as pipe:
            received = pickle.loads(pipe.read())
        _, status = os.waitpid(pid, 0)
        assert received[0] == "ok", received[1]
        assert received[1] == parent and os.waitstatus_to_exitcode(status) == 0
        assert received[2] == 2  # the parent's connection's and its own
        assert [reader.get_feature(k, "image") for k in keys] == parent


def test_a_connection_the_extension_cannot_use_is_left_to_python(catalog: Path) -> None:
    lookups = hot.HotLookups('SELECT shard_id, "offset", length, crc FROM t WHERE key = ?')
    assert lookups.lookup(_NotSqlite()) is None  # not a sqlite3 connection
    conn = sqlite3.connect(catalog)
    assert lookups.lookup(conn) is None  # no table t: the statement does not prepare
    conn.close()
    assert lookups.lookup(conn) is None  # closed


class _NotSqlite:
    """A connection that answers like sqlite3's but is none."""

    def execute(self, sql: str) -> Any:
        return self

    def fetchall(self) -> list[tuple[int, str, str]]:
        return [(0, "main", "")]


def test_native_dataset_items_equal_to_dict_of_the_decoded_records(catalog: Path) -> None:
    from shardcat.readers.torch import RecordDataset

    with Catalog(catalog) as cat, cat.dataset("d") as reader:
        assert (reader.native_dicts is not None) == hot.available()
        dataset = RecordDataset(reader)
        n = len(reader)
        indices = [*range(n), n - 1, 0, 5]  # every record (the odd ones too), repeats
        expected = [reader.to_dict(reader.get_record_at(i)) for i in indices]
        assert dataset.__getitems__(indices) == expected
        keyed = RecordDataset(reader, keys=["k3", "twice", "run", "k3"])
        assert keyed.__getitems__([0, 1, 2, 3]) == [keyed[i] for i in range(4)]
        assert keyed.__getitems__([1])[0]["image"] == b"second"
        assert keyed.__getitems__([0])[0]["label"] == [-27, 7]
        assert keyed.__getitems__([0])[0]["empty"] == []
        if hot.available():  # the odd wires are left to protobuf
            raw = reader.get_many_at(list(range(n)), raw=True)
            odd = [i for i, r in enumerate(raw) if hot.example_dict(r) is AGAIN]
            assert [reader.key_at(i) for i in odd] == ["twice"]


@pytest.mark.skipif(not hot.available(), reason="the native read is not built")
def test_example_dict_settles_or_defers_every_damaged_wire() -> None:
    from shardcat.formats.tfrecord import TFRecordFormat

    fmt = TFRecordFormat()
    rng = random.Random(7)
    good = _records(8)
    for raw in good[:-2]:
        assert hot.example_dict(raw) == {
            k: v[0] if len(v) == 1 else v for k, v in fmt.features(fmt.decode(raw, {})).items()
        }
    settled = 0
    for _ in range(3000):  # bytes flipped, cut or inserted: the same as protobuf, or AGAIN
        data = bytearray(rng.choice(good))
        at = rng.randrange(len(data))
        kind = rng.randrange(3)
        if kind == 0:
            data[at] ^= 1 << rng.randrange(8)
        elif kind == 1:
            del data[at:]
        else:
            data.insert(at, rng.randrange(256))
        got = hot.example_dict(bytes(data))
        if got is AGAIN:
            continue
        settled += 1
        record = fmt.decode(bytes(data), {})  # parses wherever the native walk settled
        want = {k: v[0] if len(v) == 1 else v for k, v in fmt.features(record).items()}
        assert sorted((k, repr(v)) for k, v in got.items()) == sorted(
            (k, repr(v)) for k, v in want.items()
        )  # (repr: a flipped float may be NaN)
    assert settled > 100


@pytest.mark.skipif(not hot.available(), reason="the native read is not built")
def test_a_map_entry_with_an_unknown_field_is_left_to_protobuf() -> None:
    from shardcat.formats.tfrecord import TFRecordFormat

    fmt = TFRecordFormat()
    entry = _field(1, b"many") + _field(2, b"") + _field(3, b"\x00\x01")
    raw = _field(1, _field(1, entry) + _field(1, _field(1, b"key") + _field(2, b"")))
    assert hot.example_dict(raw) is AGAIN  # upb keeps that entry out of the map
    assert sorted(fmt.features(fmt.decode(raw, {}))) == ["key"]


def test_native_batches_equal_the_python_path_and_check_each_record(
    catalog: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = [f"k{i}" for i in range(59, -1, -3)] + ["twice", "k3", "k3"]
    with Catalog(catalog) as cat, cat.dataset("d") as reader:
        many, at = reader.get_many(keys, raw=True), reader.get_many_at([5, 0, 61, 5], raw=True)
        if hot.available():  # read natively
            ordered = sorted(
                lookup.records_by_key(reader._conn(), reader._sql, keys), key=lambda r: r[1:3]
            )
            assert reader._read_natively(ordered, keys) == many
        monkeypatch.setenv("SHARDCAT_NATIVE", "0")
        with cat.dataset("d") as python:
            assert python._read_natively([], None) is AGAIN
            assert python.get_many(keys, raw=True) == many
            assert python.get_many_at([5, 0, 61, 5], raw=True) == at
            decoded = [r.SerializeToString() for r in python.get_many(keys)]
        assert [r.SerializeToString() for r in reader.get_many(keys)] == decoded
        # a row whose crc lies: the batch is refused, naming the record
        with sqlite3.connect(catalog) as conn:
            flip = "(crc | 1) - (crc & 1)"  # its lowest bit flipped
            conn.execute(f"UPDATE shardcat_records_1 SET crc = {flip} WHERE key = 'k30'")
        reader.refresh()
        with pytest.raises(CorruptRecordError, match="record 'k30': the bytes read are not"):
            reader.get_many([*keys[:5], "k30"])
        path, _ = _payload_at(catalog, "k0")
        with open(path, "ab") as f:  # a shard changed under the batch
            f.write(b"appended")
        with pytest.raises(StaleShardError, match="changed after it was indexed"):
            reader.get_many(["k1", "k0"])


_LEFT_OPEN = """
import sys, threading
from shardcat import Catalog
with Catalog(sys.argv[1]) as cat:
    reader = cat.dataset("d")             # never closed: the catalog's close must do
    assert reader.get_feature("k3", "label") is not None
    def in_a_thread():                    # a connection of a thread that ends
        assert reader.get_feature("k4", "label") is not None
    t = threading.Thread(target=in_a_thread); t.start(); t.join()
    assert reader.get_feature("k5", "label") is not None  # (the ended thread's connection closes)
    native = reader._hot is not None and bool(reader._hot._by_conn)
print(native)
"""


def test_a_prepared_statement_never_keeps_the_catalog_open(catalog: Path) -> None:
    # a statement left on a connection keeps SQLite's database open after close():
    # the -wal and -shm files stayed beside the catalog when its reader was not closed
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _LEFT_OPEN, str(catalog)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == str(hot.available())
    assert sorted(p.name for p in catalog.parent.iterdir() if p.name.startswith("c.")) == [
        "c.sqlite"
    ]
