"""The native TFRecord scanner against the pure-Python reference scan: the same
Columns (every list) or the same error (type, message, offset) on valid, odd and
damaged shards, on random bytes and on random mutations of valid files; its
float32 rule against ``float32_shortest``; the ``SHARDCAT_NATIVE=0`` fallback."""

from __future__ import annotations

import gzip
import math
import random
import struct
from pathlib import Path
from typing import Any

import pytest
from features import b, f32, i64
from features import ex_bytes as ex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardcat import Catalog
from shardcat.errors import CorruptRecordError
from shardcat.formats import native, tfrecord
from shardcat.formats.base import Columns, Format, float32_shortest
from shardcat.formats.tfrecord import TFRecordFormat, TFRecordWriter, masked_crc
from shardcat.pb2 import (
    Example,
    Feature,
    FeatureList,
    FeatureLists,
    Features,
    SequenceExample,
)
from shardcat.sample import make_sample
from shardcat.testing.required import CI, need, needs

# in CI (core-only run included) a missing _scan fails the collection: never a quiet skip
needs_native = needs(native.available(), "the _scan extension is built", extra=False)
FMT = TFRecordFormat()
OPTIONS: list[dict[str, Any]] = [
    {},
    {"fields": False},
    {"key": None},
    {"key": None, "fields": False},
    {"key": "id"},
    {"key": "score"},
]


def frame(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    crc = struct.pack("<I", masked_crc(length))
    return length + crc + data + struct.pack("<I", masked_crc(data))


def reference(path: str, options: dict[str, Any]) -> Columns | CorruptRecordError:
    try:
        return Columns.of(FMT.scan(path, options))
    except CorruptRecordError as exc:
        return exc


def fast(path: str, options: dict[str, Any]) -> Columns | CorruptRecordError:
    try:
        return native.scan_tfrecord(path, options, tfrecord._scan)
    except CorruptRecordError as exc:
        return exc


def same(path: Path | str, options: dict[str, Any]) -> Columns | CorruptRecordError:
    """Assert both scans agree on ``path``; return the outcome."""
    want, got = reference(str(path), options), fast(str(path), options)
    if isinstance(want, CorruptRecordError):
        assert isinstance(got, CorruptRecordError), (want, got)
        assert (type(got), str(got), got.offset) == (type(want), str(want), want.offset)
        return want
    assert isinstance(got, Columns), got
    assert got.keys == want.keys
    assert got.offsets == want.offsets
    assert got.lengths == want.lengths
    assert got.fields.keys() == want.fields.keys()
    for name, column in want.fields.items():
        assert repr(got.fields[name]) == repr(column), name  # 0.0 vs -0.0, types
    assert (got.members, got.extents, got.items) == ([], None, None)
    return want


def write(path: Path, payloads: list[bytes]) -> Path:
    path.write_bytes(b"".join(frame(p) for p in payloads))
    return path


def varied() -> list[bytes]:
    """Records that exercise every branch of the scalar and key rules."""
    seq = SequenceExample(
        context=Features(feature={"key": b(b"seq"), "id": i64(7), "score": f32(0.25)}),
        feature_lists=FeatureLists(
            feature_list={"frames": FeatureList(feature=[b(b"x"), i64(1, 2), f32()])}
        ),
    ).SerializeToString()
    return [
        ex(key=b(b"a"), id=i64(1), score=f32(0.967), caption=b(b"hello")),
        ex(key=b(b"b"), id=i64(-5), score=f32(0.1), long=b(b"x" * 257), edge=b(b"y" * 256)),
        ex(key=b("é".encode()), id=i64(2**63 - 1), score=f32(1.5), bad=b(b"\xff\xfe")),
        ex(key=b(b"d", b"e"), id=i64(-(2**63)), score=f32(3.0), many=i64(1, 2), none=i64()),
        ex(key=b(b"e"), id=i64(0), score=f32(-0.0), inf=f32(math.inf), nan=f32(math.nan)),
        ex(key=b(b"f"), id=i64(3), score=f32(1e-45), tiny=f32(1.17549435e-38), p2=f32(2.0**-96)),
        ex(key=b(b"g"), id=i64(4), score=f32(0.123456789), empty=Feature(), blank=b(b"")),
        seq,
        ex(key=b(b"h"), id=i64(5), score=f32(7.25), later=b(b"new column")),
    ]


def test_ci_builds_the_extension() -> None:
    """CI must not silently test the fallback twice (no skip mark: it runs everywhere)."""
    if CI:
        assert native.available(), "CI=true but shardcat.formats._scan did not build"


@needs_native
@pytest.mark.parametrize("options", OPTIONS)
def test_varied_records(tmp_path: Path, options: dict[str, Any]) -> None:
    out = same(write(tmp_path / "v.tfrecord", varied()), options)
    assert isinstance(out, Columns) and len(out) == 9


@needs_native
@pytest.mark.parametrize("options", OPTIONS[:4])
def test_sample_shards(tmp_path: Path, options: dict[str, Any]) -> None:
    for path in make_sample(tmp_path, shards=2, records=300, image_bytes=64):
        out = same(path, options)
        assert isinstance(out, Columns) and len(out) == 150


@needs_native
def test_writer_and_tensorflow_layout(tmp_path: Path) -> None:
    """shardcat's writer; and TF's own layout: unpacked int64/float values, an
    unknown field, map entries with the value before the key."""
    path = tmp_path / "w.tfrecord"
    with TFRecordWriter(path) as w:
        for i in range(50):
            w.write(ex(key=b(b"k%d" % i), label=i64(i % 7), score=f32(i / 3)))
    assert len(same(path, {})) == 50  # type: ignore[arg-type]

    def entry(name: bytes, feature: bytes) -> bytes:
        body = b"\x12" + bytes([len(feature)]) + feature + b"\x0a" + bytes([len(name)]) + name
        return b"\x0a" + bytes([len(body)]) + body

    unpacked_int = b"\x1a\x04" + b"\x08\x05\x08\x06"  # int64_list, two unpacked values
    one_int = b"\x1a\x02\x08\x2a"
    one_float = b"\x12\x05\x0d" + struct.pack("<f", 0.5)
    key = b"\x0a\x05\x0a\x03abc"
    unknown = b"\x28\x01"  # field 5 varint inside Feature
    features = entry(b"key", key) + entry(b"n", one_int + unknown) + entry(b"m", unpacked_int)
    features += entry(b"f", one_float)
    payload = b"\x0a" + bytes([len(features)]) + features + b"\x18\x01"  # unknown top field
    out = same(write(tmp_path / "tf.tfrecord", [payload, payload]), {})
    assert isinstance(out, Columns) and out.fields == {"n": [42, 42], "f": [0.5, 0.5]}


@needs_native
def test_empty_file_and_empty_payloads(tmp_path: Path) -> None:
    empty = tmp_path / "e.tfrecord"
    empty.write_bytes(b"")
    assert len(same(empty, {})) == 0  # type: ignore[arg-type]
    assert len(same(write(tmp_path / "p.tfrecord", [b"", b""]), {"key": None})) == 2  # type: ignore[arg-type]
    same(tmp_path / "p.tfrecord", {})  # no key feature: the reference's error


def with_entry(entry: bytes) -> bytes:
    """An Example whose Features hold the key and then the raw map ``entry``."""
    body = Example(features=Features(feature={"key": b(b"k")})).features.SerializeToString()
    body += b"\x0a" + bytes([len(entry)]) + entry
    return b"\x0a" + bytes([len(body)]) + body


@needs_native
@pytest.mark.parametrize(
    "payload",
    [
        b"\xff\xff\xff",  # garbage protobuf
        ex(id=i64(1)),  # missing key
        ex(key=b()),  # empty key
        ex(key=b(b"\xff")),  # key not UTF-8
        ex(key=b(b"a")) + ex(key=b(b"b")),  # Features twice: protobuf merges, last key wins
        ex(key=i64(3), x=b(b"1")) + ex(x=f32(2.0)),  # a feature redefined by the merge
        b"\x0a\x03\x0a\x01\x80",  # truncated varint
        b"\x0b\x0c",  # a group
        # a map entry with an unknown field (7032): upb keeps it out of the map
        with_entry(bytes.fromhex("0a007032120812060a040000800f")),
        with_entry(bytes.fromhex("0a0270327032120812060a040000800f")),
        with_entry(bytes.fromhex("120812060a040000800f")),  # no key: ""
        with_entry(bytes.fromhex("0a00120812060a040000800f")),  # key ""
    ],
)
def test_odd_payloads_after_good_records(tmp_path: Path, payload: bytes) -> None:
    good = ex(key=b(b"ok"), id=i64(1))
    same(write(tmp_path / "o.tfrecord", [good, payload, good]), {})
    same(tmp_path / "o.tfrecord", {"key": None})


@needs_native
@pytest.mark.parametrize("where", ["length", "length_crc", "data", "data_crc"])
def test_damaged_frames(tmp_path: Path, where: str) -> None:
    payloads = [ex(key=b(b"%d" % i), id=i64(i)) for i in range(3)]
    path = write(tmp_path / "d.tfrecord", payloads)
    raw = bytearray(path.read_bytes())
    second = 16 + len(payloads[0])
    at = {"length": 0, "length_crc": 9, "data": 14, "data_crc": 12 + len(payloads[1])}[where]
    raw[second + at] ^= 0x10
    path.write_bytes(bytes(raw))
    out = same(path, {})
    assert isinstance(out, CorruptRecordError) and out.offset == second


@needs_native
@pytest.mark.parametrize("cut", [1, 5, 11, 12, 20, -4, -1])
def test_truncated(tmp_path: Path, cut: int) -> None:
    payloads = [ex(key=b(b"%d" % i), id=i64(i)) for i in range(3)]
    path = write(tmp_path / "t.tfrecord", payloads)
    raw = path.read_bytes()
    last = len(raw) - 16 - len(payloads[2])
    path.write_bytes(raw[: last + cut] if cut > 0 else raw[:cut])
    out = same(path, {})
    assert isinstance(out, CorruptRecordError) and out.offset == last


@needs_native
def test_masked_crc_matches_the_reference() -> None:
    rng = random.Random(3)
    for n in [*range(70), 1000, 4097, 100_001]:
        data = rng.randbytes(n)
        assert native._native.masked_crc(data) == masked_crc(data), n  # type: ignore[union-attr]


@needs_native
def test_float32_rule_matches_float32_shortest() -> None:
    rng = random.Random(12)
    patterns = [rng.getrandbits(32) for _ in range(200_000)]
    patterns += [e << 23 for e in range(256)]  # powers of two, 0, inf
    patterns += [(e << 23) | m for e in (0, 1, 254, 255) for m in (1, 2, 3, 0x7FFFFF, 0x400000)]
    patterns += [p | 0x80000000 for p in patterns[-300:]]  # negatives, -0.0
    for bits in patterns:
        (x,) = struct.unpack("<f", struct.pack("<I", bits))
        got, want = native._native.float32_shortest(x, float32_shortest), float32_shortest(x)
        assert repr(got) == repr(want), hex(bits)


def mutate(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(3)
        at = rng.randrange(len(out) + 1)
        if op == 0 and out:
            out[min(at, len(out) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            del out[at : at + rng.randint(1, 8)]
        else:
            out[at:at] = rng.randbytes(rng.randint(1, 8))
    return bytes(out)


@needs_native
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32 - 1), raw=st.binary(max_size=64), options=st.sampled_from(OPTIONS))
def test_fuzz_random_and_mutated(
    tmp_path: Path, seed: int, raw: bytes, options: dict[str, Any]
) -> None:
    rng = random.Random(seed)
    payloads = varied()
    path = tmp_path / "f.tfrecord"
    path.write_bytes(raw)
    same(path, options)
    # a mutated payload, correctly framed, among good ones
    i = rng.randrange(len(payloads))
    payloads[i] = mutate(payloads[i], rng)
    write(path, payloads)
    same(path, options)
    # bit flips only, correctly framed: the wire mostly stays parseable
    payloads = varied()
    flipped = bytearray(payloads[i])
    for _ in range(rng.randint(1, 2)):
        flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
    payloads[i] = bytes(flipped)
    write(path, payloads)
    same(path, options)
    # mutated framing
    path.write_bytes(mutate(b"".join(frame(p) for p in varied()), rng))
    same(path, options)


@needs_native
def test_fallback_forced_still_ingests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = make_sample(tmp_path / "data", shards=2, records=40, image_bytes=16)
    counts = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("SHARDCAT_NATIVE", flag)
        assert native.enabled() is (flag == "1")
        with Catalog(tmp_path / f"c{flag}.sqlite") as cat:
            cat.ingest(files, dataset="d").close()
            counts[flag] = cat.query("SELECT key, label, score FROM d ORDER BY key")
    assert counts["0"] == counts["1"] and len(counts["0"]) == 40


def test_reference_used_without_the_extension(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(native, "_native", None)
    assert not native.enabled()
    files = make_sample(tmp_path, shards=1, records=5, image_bytes=8)
    scan = FMT.scan_shard(files[0], {})
    assert scan.columns.keys == [f"rec_{i:09d}" for i in range(5)]


# -- GZIP TFRecords: the decompressed stream in chunks ------------------------------


def same_shard(path: Path, options: dict[str, Any]) -> None:
    """``scan_shard`` with the extension against the reference's (Format's own)."""

    def outcome(scan: Any) -> Any:
        try:
            s = scan(str(path), options)
        except CorruptRecordError as exc:
            return (type(exc), str(exc), exc.offset)
        c = s.columns
        return (
            c.keys,
            c.offsets,
            c.lengths,
            repr(sorted(c.fields.items())),
            s.compression,
            s.seek_kind,
        )

    want = outcome(lambda p, o: Format.scan_shard(FMT, p, o))
    assert outcome(FMT.scan_shard) == want


@needs_native
@pytest.mark.parametrize("options", OPTIONS)
def test_gzip_stream(
    tmp_path: Path, options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    need("indexed_gzip", why="shardcat[compressed]")
    monkeypatch.setattr(native, "_CHUNK", 1000)  # records straddle reads
    payloads = varied() * 20
    raw = b"".join(frame(p) for p in payloads)
    path = tmp_path / "v.tfrecord.gz"
    path.write_bytes(gzip.compress(raw))
    same_shard(path, options)
    for cut in (len(raw) - 3, len(raw) - 200, 5):  # truncated records
        path.write_bytes(gzip.compress(raw[:cut]))
        same_shard(path, options)
    damaged = bytearray(raw)
    damaged[2000] ^= 4
    path.write_bytes(gzip.compress(bytes(damaged)))
    same_shard(path, options)
    packed = gzip.compress(raw)
    for cut in (len(packed) - 10, len(packed) // 2):  # a broken gzip stream
        path.write_bytes(packed[:cut])
        same_shard(path, options)


# -- structured fuzzing: well-framed records of odd but plausible protobuf ---------


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(num: int, wt: int, body: bytes) -> bytes:
    tag = _varint(num << 3 | wt)
    return tag + _varint(len(body)) + body if wt == 2 else tag + body


class Wire:
    """Random Examples with unknown fields at every level, duplicates, packed and
    unpacked values, wrong wire types, map entries out of order or incomplete."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def unknown(self) -> bytes:
        r = self.rng
        wt = r.choice([0, 1, 2, 5])
        body = {
            0: _varint(r.getrandbits(r.choice([3, 40, 64]))),
            1: r.randbytes(8),
            2: r.randbytes(r.randint(0, 5)),
            5: r.randbytes(4),
        }[wt]
        return _field(r.choice([4, 5, 15, 16, 100, 2**20]), wt, body)

    def sometimes(self) -> bytes:
        return self.unknown() if self.rng.random() < 0.1 else b""

    def values(self, kind: int) -> bytes:
        r = self.rng
        n = r.choice([0, 1, 1, 1, 2, 3])
        if kind == 1:
            pool = [b"x", b"\xff", b"", "é".encode(), b"a" * 300]
            return b"".join(_field(1, 2, r.choice(pool)) + self.sometimes() for _ in range(n))
        if kind == 2:
            raw = [struct.pack("<f", r.choice([0.5, 0.1, r.random(), -0.0])) for _ in range(n)]
            if r.random() < 0.5:
                return _field(1, 2, b"".join(raw)) + self.sometimes()
            return b"".join(_field(1, 5, v) for v in raw)
        ints = [
            _varint(r.choice([0, -1, 2**63 - 1, -(2**63), r.getrandbits(40)])) for _ in range(n)
        ]
        if r.random() < 0.5:
            return _field(1, 2, b"".join(ints)) + self.sometimes()
        return b"".join(_field(1, 0, v) for v in ints)

    def feature(self) -> bytes:
        r = self.rng
        out = b""
        for _ in range(r.choice([0, 1, 1, 1, 2])):
            kind = r.choice([1, 2, 3])
            if r.random() < 0.97:
                out += _field(kind, 2, self.values(kind))
            else:
                out += _field(kind, 0, b"\x01")  # a wrong wire type
            out += self.sometimes()
        return out

    def entry(self, name: bytes) -> bytes:
        r = self.rng
        parts = [_field(1, 2, name), _field(2, 2, self.feature())]
        if r.random() < 0.5:
            parts.reverse()
        if r.random() < 0.03:
            parts.append(self.unknown())
        if r.random() < 0.03:
            parts.append(_field(2, 2, self.feature()))  # the value twice: merged
        if r.random() < 0.03:
            parts = parts[1:]
        return b"".join(parts)

    def record(self) -> bytes:
        r = self.rng
        names = r.sample([b"key", b"id", b"score", b"c", b"", b"\xff"], r.randint(0, 4))
        if names and r.random() < 0.05:
            names.append(r.choice(names))
        if b"key" not in names and r.random() < 0.8:
            names.append(b"key")
        r.shuffle(names)
        features = b"".join(_field(1, 2, self.entry(n)) + self.sometimes() for n in names)
        parts = [_field(1, 2, features)]
        if r.random() < 0.1:
            flist = _field(1, 2, _field(1, 2, b"fl") + _field(2, 2, _field(1, 2, self.feature())))
            parts.append(_field(2, 2, flist))
        if r.random() < 0.1:
            parts.insert(r.randrange(len(parts) + 1), self.unknown())
        return b"".join(parts)


@needs_native
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32 - 1))
def test_fuzz_structured_wire(tmp_path: Path, seed: int) -> None:
    wire = Wire(random.Random(seed))
    path = write(tmp_path / "w.tfrecord", [wire.record() for _ in range(4)])
    for options in OPTIONS:
        same(path, options)
