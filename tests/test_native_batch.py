"""The native batch read (issue 31, item 2; shardcat.readers.batch, readers/hot_batch.h):
a batch of keys or positions looked up, read (nearby frames in one pread), checked and
turned into dicts in one call, equal to the Python path for every feature kind and odd
Example; every failure left to the Python path (a flipped byte, a lying catalog row, a
changed shard, a shard without a source yet); threads, a forked child, soft deletes,
``SHARDCAT_NATIVE=0``; ``RecordDataset(features=...)`` and users' transforms."""

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
from features import b, ex_bytes
from test_native_read import _field, _payload_at, _records

from shardcat import (
    Catalog,
    CorruptRecordError,
    KeyNotFoundError,
    ShardcatError,
    StaleShardError,
)
from shardcat.formats.tfrecord import TFRecordFormat, TFRecordWriter
from shardcat.readers import hot
from shardcat.readers.hot import AGAIN
from shardcat.readers.torch import RecordDataset

KEYS = [f"k{i}" for i in range(60)] + ["twice", "run"]


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    """62 records (the odd wires of test_native_read among them) in 2 shards, keyed
    by feature ``key`` (dataset ``d``) and by position (dataset ``p``)."""
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
        cat.ingest(str(data / "*.tfrecord"), "p", key=None).close()
    return db


def _native(reader: Any) -> bool:
    """Whether ``reader`` reads batches natively (it must where the extension is built:
    CI builds it)."""
    if os.environ.get("CI"):
        assert hot.available()
    return hot.available()


def _reference(reader: Any, items: list[Any], by_key: bool, select: Any = None) -> list[Any]:
    """The Python path's dicts: each record decoded by protobuf, to_dict, chosen."""
    out = []
    for item in items:
        record = reader._get_record(item if by_key else reader.key_at(item))  # (Python)
        d = reader.to_dict(record)
        out.append(d if select is None else {k: d[k] for k in select if k in d})
    return out


def _wired(reader: Any) -> int:
    """How many connections the batch lookups by key and position are prepared on."""
    return sum(len(h._by_conn) for h in (reader._hot, reader._hot_at) if h is not None)


def test_batches_equal_the_python_path_for_every_feature_kind(catalog: Path) -> None:
    rng = random.Random(3)
    with Catalog(catalog) as cat, cat.dataset("d") as reader, cat.dataset("p") as by_pos:
        for _ in range(5):
            keys = rng.choices(KEYS, k=40)  # repeats too
            positions = rng.choices(range(len(reader)), k=40)
            for select in (None, ("image", "label"), ("score", "nothing", "many"), ()):
                assert reader.get_dicts(keys, select) == _reference(reader, keys, True, select)
                assert reader.get_dicts_at(positions, select) == _reference(
                    reader, positions, False, select
                )
                assert by_pos.get_dicts_at(positions, select) == _reference(
                    by_pos, positions, False, select
                )
            many = [reader._fmt.decode(r, {}) for r in reader.get_many(keys, raw=True)]
            assert [r.SerializeToString() for r in many] == [
                reader._get_record(k).SerializeToString() for k in keys
            ]
            assert by_pos.get_many_at(positions, raw=True) == reader.get_many_at(
                positions, raw=True
            )
        assert reader.get_dicts(["twice"])[0]["image"] == b"second"  # protobuf's answer
        assert reader.get_dicts(["k3"], ["label", "key"]) == [{"label": [-27, 7], "key": b"k3"}]
        assert reader.get_dicts_at(slice(0, 3)) == reader.get_dicts_at([0, 1, 2])
        for i in (0, 30, 31, 61):  # get_record_at: the native batch read of one
            python = reader._get_record(reader.key_at(i)).SerializeToString()
            assert reader.get_record_at(i).SerializeToString() == python
            assert by_pos.get_record_at(i).SerializeToString() == python
            assert reader._fmt.decode(
                reader.get_record_at(i, raw=True), {}
            ) == reader.get_record_at(i)
        first, second = reader.get_dicts_at([0, 1])
        if _native(reader):  # a batch's dicts share their key objects (one pickle each)
            assert all(a is b for a, b in zip(sorted(first), sorted(second), strict=True))
        assert reader.get_dicts([]) == [] and reader.get_dicts_at([]) == []
        assert by_pos.get_dicts(["5", "0"]) == by_pos.get_dicts_at([5, 0])
        assert _wired(reader) == (2 if _native(reader) else 0)
        if _native(reader):  # every item settled natively but the repeated map key
            lookup = reader._hot_at.lookup(reader._conn())
            got = hot.read_batch(
                lookup, list(range(62)), reader._layout_buffers, reader._pool.sources,
                True, True, True, None,
            )  # fmt: skip
            assert [reader.key_at(i) for i, item in enumerate(got) if item is AGAIN] == ["twice"]


def test_errors_are_the_python_paths(catalog: Path) -> None:
    with Catalog(catalog) as cat, cat.dataset("d") as reader, cat.dataset("p") as by_pos:
        with pytest.raises(KeyNotFoundError, match=r"2 key\(s\) not in dataset 'd': 'x', 'y'"):
            reader.get_dicts(["k1", "x", "y"])
        with pytest.raises(KeyNotFoundError, match=r"1 key\(s\) not in dataset 'p': '99'"):
            by_pos.get_dicts(["1", "99"])
        with pytest.raises(IndexError, match="position 62 out of range for 62 records"):
            reader.get_dicts_at([1, 62])
        assert reader.get_dicts_at([-1]) == reader.get_dicts_at([61])  # counts from the end
        with pytest.raises(IndexError):
            RecordDataset(reader)[62]
        assert reader.get_dicts(["k\udcff"] * 0) == []
        with pytest.raises(KeyNotFoundError):  # a key the extension cannot encode
            reader.get_dicts(["k1", "k\udcff"])


def test_shardcat_native_0_reads_batches_in_python(
    catalog: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Catalog(catalog) as cat, cat.dataset("d") as native:
        expected = native.get_dicts(KEYS)
        raw = native.get_many(KEYS, raw=True)
        monkeypatch.setenv("SHARDCAT_NATIVE", "0")
        with cat.dataset("d") as reader:
            assert reader._hot_at is None and reader.native_dicts is None
            assert reader.get_dicts(KEYS) == expected == _reference(reader, KEYS, True)
            assert reader.get_many(KEYS, raw=True) == raw
            assert RecordDataset(reader, features=["label"])[32] == {"label": [-27, 7]}
            assert _wired(reader) == 0


def test_a_flipped_byte_in_a_coalesced_run_is_refused(tmp_path: Path) -> None:
    from checked import write

    d = write("tfrecord", tmp_path / "data")
    with Catalog(tmp_path / "c.sqlite") as cat, cat.ingest(str(d.path), "d") as reader:
        run = list(range(15, 26))  # adjacent frames: one pread
        before = reader.get_dicts_at(run, ["key"])
        assert before == [{"key": f"r{i}".encode()} for i in run]
        d.damage()
        for read in (
            lambda: reader.get_dicts_at(run, ["key"]),
            lambda: reader.get_dicts([f"r{i}" for i in run]),
            lambda: reader.get_many_at(run, raw=True),
        ):
            with pytest.raises(CorruptRecordError) as err:
                read()
            assert (err.value.path, err.value.offset) == (str(d.path), d.offset)
        assert reader.get_dicts_at([19, 21], ["key"]) == [{"key": b"r19"}, {"key": b"r21"}]


def test_a_lying_catalog_row_is_refused_never_other_bytes(catalog: Path) -> None:
    with Catalog(catalog) as cat, cat.dataset("d") as reader:
        assert reader.get_dicts(["k20"], ["label"]) == [{"label": [-10, 7]}]
        assert reader.get_dicts_at([10], ["key"]) == [{"key": b"k20"}]
        with sqlite3.connect(catalog) as conn:  # k20's row names k22's bytes and check
            row = conn.execute(
                'SELECT "offset", length, crc FROM shardcat_records_1 WHERE key = ?', ("k22",)
            ).fetchone()
            conn.execute(
                'UPDATE shardcat_records_1 SET "offset" = ?, length = ?, crc = ? WHERE key = ?',
                (*row, "k20"),
            )
        reader.refresh()
        with pytest.raises(CorruptRecordError, match="record 'k20': the bytes read are not"):
            reader.get_dicts(["k1", "k20"])
        with pytest.raises(CorruptRecordError, match="record 'k20': the bytes read are not"):
            reader.get_dicts_at([10, 3])  # (by position: checked with the row's key)
        assert reader.get_dicts(["k22"], ["label"]) == [{"label": [-8, 7]}]
        for offset, length in ((2**62 + 5, 10), (2**63 - 1, 10), (-5, 10), (0, -1)):
            with sqlite3.connect(catalog) as conn:  # rows no file holds: never a crash
                conn.execute(
                    'UPDATE shardcat_records_1 SET "offset" = ?, length = ? WHERE key = ?',
                    (offset, length, "k20"),
                )
            reader.refresh()
            with pytest.raises(ShardcatError) as err:
                reader.get_dicts(["k1", "k20"])
            assert "k20" in str(err.value) or str(offset) in str(err.value)


def test_a_shard_changed_under_a_batch_is_stale(catalog: Path) -> None:
    path, _ = _payload_at(catalog, "k0")
    with Catalog(catalog) as cat, cat.dataset("d") as reader:
        assert len(reader.get_dicts(KEYS)) == 62
        with open(path, "ab") as f:
            f.write(b"appended")
        with pytest.raises(StaleShardError, match="changed after it was indexed"):
            reader.get_dicts(["k1", "k0"])
        with pytest.raises(StaleShardError, match="changed after it was indexed"):
            reader.get_dicts_at([0, 1])


def test_shards_without_a_source_are_opened_then_read_natively(catalog: Path) -> None:
    with Catalog(catalog) as cat:
        with cat.dataset("d") as reader:
            assert reader._pool.sources == {}
            assert reader.get_dicts_at([0, 40]) == _reference(reader, [0, 40], False)
            assert len(reader._pool.sources) == 2
            assert _wired(reader) == (1 if _native(reader) else 0)
        with cat._reader("d", file_pool_size=1) as small:  # one source open at a time
            assert small.get_dicts_at([0, 1, 2, 3]) == _reference(small, [0, 1, 2, 3], False)


def test_soft_deleted_records_leave_the_batch(catalog: Path) -> None:
    with Catalog(catalog) as cat:
        cat.delete("d", keys=["k1", "k4", "run"])  # s1's first, s0's third, the last
        with cat.dataset("d") as reader:
            assert len(reader) == 59
            assert reader.get_dicts_at([29, 30], ["key"]) == [{"key": b"twice"}, {"key": b"k3"}]
            assert reader.get_dicts_at([1, 2], ["key"]) == [{"key": b"k2"}, {"key": b"k6"}]
            everything = list(range(59))
            assert reader.get_dicts_at(everything) == _reference(reader, everything, False)
            assert reader.get_dicts_at([58])[0]["key"] == b"k59"
            with pytest.raises(IndexError):
                reader.get_dicts_at([59])
            with pytest.raises(KeyNotFoundError, match="'k1'"):
                reader.get_dicts(["k0", "k1"])
            assert reader.get_dicts(["k2", "k6"], ["key"]) == [{"key": b"k2"}, {"key": b"k6"}]
            assert reader.get_record("k4") is None and reader.get_feature("k2", "key") == b"k2"
            assert _wired(reader) == (2 if _native(reader) else 0)  # read natively


def test_threads_share_a_batch_reader(catalog: Path) -> None:
    errors: list[BaseException] = []
    with Catalog(catalog) as cat, cat.dataset("d") as reader:
        expected = {i: reader.to_dict(reader.get_record_at(i)) for i in range(62)}

        def work(seed: int) -> None:
            try:
                rng = random.Random(seed)
                for _ in range(60):
                    batch = rng.choices(range(62), k=16)
                    assert reader.get_dicts_at(batch) == [expected[i] for i in batch]
                    keys = [f"k{i}" for i in batch if i < 60]
                    assert reader.get_dicts(keys, ["key"]) == [{"key": k.encode()} for k in keys]
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []


def test_a_forked_child_reads_batches_on_its_own_connection(catalog: Path) -> None:
    positions = list(range(0, 62, 5))
    with Catalog(catalog) as cat, cat.dataset("d") as reader:
        parent = reader.get_dicts_at(positions)  # lookups prepared, sources open
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 1
            try:
                os.close(rfd)
                try:
                    payload: Any = ("ok", reader.get_dicts_at(positions), _wired(reader))
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
        assert received[2] == (2 if _native(reader) else 0)  # the parent's and its own
        assert reader.get_dicts_at(positions) == parent


def test_dataset_items_features_and_transforms(catalog: Path) -> None:
    with Catalog(catalog) as cat, cat.dataset("d") as reader:
        items = RecordDataset(reader)
        assert items.__getitems__([3, 61, 3]) == _reference(reader, [3, 61, 3], False)
        chosen = RecordDataset(reader, features=["label", "key"])
        assert chosen[32] == {"label": [-27, 7], "key": b"k3"}  # (shard s1's second)
        # a transform without features gets the decoded Example (users' transforms)
        examples = RecordDataset(reader, transform=lambda e: e.features.feature["key"])
        assert examples[32].bytes_list.value == [b"k3"]
        # with features, the dict of those
        labels = RecordDataset(reader, ["k3", "k4"], lambda d: d["label"][0], features=["label"])
        assert labels.__getitems__([1, 0]) == [-26, -27]
        assert RecordDataset(reader, ["k3"], features=["nothing"])[0] == {}


@pytest.mark.skipif(not hot.available(), reason="the native read is not built")
def test_chosen_features_settle_or_defer_every_damaged_wire() -> None:
    fmt = TFRecordFormat()
    rng = random.Random(11)
    good = _records(8)[:-2]
    settled = 0
    for _ in range(3000):  # bytes flipped, cut or inserted: protobuf's answer, or AGAIN
        data = bytearray(rng.choice(good))
        at = rng.randrange(len(data))
        if rng.randrange(2):
            data[at] ^= 1 << rng.randrange(8)
        else:
            del data[at:]
        select = tuple(rng.sample(["key", "image", "label", "score", "many", "nothing"], 2))
        got = hot.example_dict(bytes(data), select)
        if got is AGAIN:
            continue
        settled += 1
        record = fmt.decode(bytes(data), {})  # parses wherever the native walk settled
        whole = {k: v[0] if len(v) == 1 else v for k, v in fmt.features(record).items()}
        want = {k: whole[k] for k in select if k in whole}
        assert sorted((k, repr(v)) for k, v in got.items()) == sorted(
            (k, repr(v)) for k, v in want.items()
        )  # (repr: a flipped float may be NaN)
    assert settled > 100
    # an unchosen feature's malformed wire still leaves the record to protobuf
    bad = _field(1, _field(1, _field(1, b"x") + _field(2, _field(3, b"\xff"))))
    assert hot.example_dict(bad, ("key",)) is AGAIN and hot.example_dict(bad) is AGAIN
    assert hot.example_dict(ex_bytes(key=b(b"k"), label=b(b"l")), ("key",)) == {"key": b"k"}


_LEFT_OPEN = """
import sys, threading
from shardcat import Catalog
with Catalog(sys.argv[1]) as cat:
    reader = cat.dataset("d")             # never closed: the catalog's close must do
    assert len(reader.get_dicts_at([0, 40])) == 2 and len(reader.get_dicts(["k1"])) == 1
    def in_a_thread():                    # a connection of a thread that ends
        assert len(reader.get_dicts_at([3])) == 1
    t = threading.Thread(target=in_a_thread); t.start(); t.join()
    assert len(reader.get_dicts_at([5])) == 1  # (the ended thread's connection closes)
    native = reader._hot_at is not None and bool(reader._hot_at._by_conn)
print(native)
"""


def test_a_batch_statement_never_keeps_the_catalog_open(catalog: Path) -> None:
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


def test_a_tag_reads_batches_natively_and_names_a_changed_shard(catalog: Path) -> None:
    path, _ = _payload_at(catalog, "k0")
    with Catalog(catalog) as cat:
        cat.tag("d", "v1")
        with cat.dataset("d@v1") as tagged, cat.dataset("d") as reader:
            assert tagged.get_dicts_at(list(range(62))) == reader.get_dicts_at(list(range(62)))
            assert tagged.get_dicts(KEYS, ["key"]) == reader.get_dicts(KEYS, ["key"])
            assert _wired(tagged) == (2 if _native(tagged) else 0)
            with open(path, "ab") as f:
                f.write(b"appended")
            pinned = r"tag 'v1' of dataset 'd' pins shard .*changed after it was indexed"
            with pytest.raises(StaleShardError, match=pinned):
                tagged.get_dicts_at([0, 40])
            with pytest.raises(StaleShardError, match=pinned):
                tagged.get_dicts(["k0", "k1"])
