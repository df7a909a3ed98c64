"""shardcat.formats.tfrecord: framing, CRCs, scan/read/decode and writing.

The expected bytes come from an independent implementation of TensorFlow's
TFRecord framing written here from the format spec (``tf.io`` docs and
``tensorflow/core/lib/hash/crc32c.h``)::

    uint64 length                      little endian
    uint32 masked_crc32c(length)
    byte   data[length]
    uint32 masked_crc32c(data)

    masked_crc = ((crc >> 15) | (crc << 17)) + 0xa282ead8   (mod 2**32)

Only the core install is needed (the Makefile also runs this file against the
newest protobuf runtime).
"""

from __future__ import annotations

import os
import random
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import crc32c
import numpy as np
import pytest
from features import b, ex_bytes, f32, i64
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardcat.errors import CorruptRecordError, ShardcatError
from shardcat.formats import tfrecord
from shardcat.formats.base import Entry, Location
from shardcat.formats.tfrecord import TFRecordFormat, TFRecordWriter, make_example, masked_crc
from shardcat.pb2 import (
    Example,
    Feature,
    FeatureList,
    FeatureLists,
    Features,
    SequenceExample,
)
from shardcat.sources.local import FileSource

TFR = TFRecordFormat()
decode, describe, detect_options = TFR.decode, TFR.describe, TFR.detect_options
feature_list, scan, sniff, all_features = TFR.feature_list, TFR.scan, TFR.sniff, TFR.features

# -- independent TFRecord framing ----------------------------------------------

MASK_DELTA = 0xA282EAD8


def ref_masked_crc(data: bytes) -> int:
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) % 2**32


def ref_unmask(masked: int) -> int:
    rot = (masked - MASK_DELTA) % 2**32
    return ((rot >> 17) | (rot << 15)) % 2**32


def ref_frame(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return (
        length
        + struct.pack("<I", ref_masked_crc(length))
        + data
        + struct.pack("<I", ref_masked_crc(data))
    )


def ref_offsets(payloads: list[bytes]) -> list[int]:
    offsets, pos = [], 0
    for p in payloads:
        offsets.append(pos)
        pos += 8 + 4 + len(p) + 4
    return offsets


def write_raw(path: Path, payloads: list[bytes]) -> list[int]:
    """Write ``payloads`` with the independent framing; returns frame offsets."""
    path.write_bytes(b"".join(ref_frame(p) for p in payloads))
    return ref_offsets(payloads)


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def scan_until_error(path: Path, options: dict | None = None) -> tuple[list[Entry], Exception]:
    got: list[Entry] = []
    with pytest.raises(CorruptRecordError) as info:
        for entry in scan(str(path), options or {}):
            got.append(entry)
    return got, info.value


@pytest.fixture
def fd_of() -> Iterator:
    fds: list[int] = []

    def open_fd(path: Path) -> FileSource:
        fds.append(os.open(path, os.O_RDONLY))
        return FileSource(fds[-1], str(path))

    yield open_fd
    for fd in fds:
        os.close(fd)


# -- CRC -----------------------------------------------------------------------


def test_crc_variant_is_castagnoli() -> None:
    assert crc32c.crc32c(b"123456789") == 0xE3069283  # CRC-32C check value
    # RFC 3720 B.4 vectors (also in TensorFlow's crc32c_test.cc)
    assert crc32c.crc32c(bytes(32)) == 0x8A9136AA
    assert crc32c.crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc32c.crc32c(bytes(range(32))) == 0x46DD794E
    assert crc32c.crc32c(bytes(range(31, -1, -1))) == 0x113FDB5C


def test_masked_crc_matches_reference() -> None:
    assert ref_masked_crc(b"") == 0xA282EAD8  # crc32c(b"") == 0, so just the delta
    assert masked_crc(b"") == 0xA282EAD8
    rng = random.Random(1)
    for data in [b"", b"a", b"123456789", bytes(8), rng.randbytes(1000)]:
        assert masked_crc(data) == ref_masked_crc(data)
        assert masked_crc(memoryview(data)) == ref_masked_crc(data)
        assert ref_unmask(masked_crc(data)) == crc32c.crc32c(data)
    assert masked_crc(b"123456789") == ref_masked_crc(b"123456789")
    assert masked_crc(b"123456789") != 0xE3069283  # masking changes the value


def test_empty_payload_frame_bytes() -> None:
    frame = ref_frame(b"")
    assert len(frame) == 16
    assert frame[:8] == bytes(8)
    assert frame[8:12] == struct.pack("<I", ref_masked_crc(bytes(8)))
    assert frame[12:] == b"\xd8\xea\x82\xa2"  # 0xA282EAD8 little endian


# -- writer --------------------------------------------------------------------


def test_writer_is_byte_identical_to_reference(tmp_path: Path) -> None:
    rng = random.Random(7)
    payloads = [b"", b"\x00", rng.randbytes(1000), rng.randbytes(70000), b"x"]
    path = tmp_path / "w.tfrecord"
    with TFRecordWriter(path) as w:
        offsets = [w.write(p) for p in payloads]
    assert offsets == ref_offsets(payloads) == [0, 16, 33, 1049, 71065]
    assert path.read_bytes() == b"".join(ref_frame(p) for p in payloads)
    assert path.stat().st_size == 71065 + 17


def test_writer_accepts_messages_and_buffers(tmp_path: Path) -> None:
    ex = Example(features=Features(feature={"key": b(b"k")}))
    path = tmp_path / "m.tfrecord"
    w = TFRecordWriter(str(path))
    assert w.path == str(path)
    assert w.write(ex) == 0
    assert w.write(bytearray(b"ab")) == 16 + len(ex.SerializeToString())
    w.write_all([memoryview(b"cd"), b"e"])
    w.flush()
    w.close()
    serialized = ex.SerializeToString()
    expected = [serialized, b"ab", b"cd", b"e"]
    assert path.read_bytes() == b"".join(ref_frame(p) for p in expected)


# -- scan ----------------------------------------------------------------------


def test_scan_offsets_lengths_and_bytes_keys(tmp_path: Path) -> None:
    payloads = [
        ex_bytes(key=b(b"alpha")),
        ex_bytes(key=b("βeta".encode()), blob=b(b"\x00" * 300)),
        ex_bytes(key=b(b"")),
    ]
    path = tmp_path / "s.tfrecord"
    with TFRecordWriter(path) as w:
        for p in payloads:
            w.write(p)
    offsets = ref_offsets(payloads)
    assert offsets[1] == 12 + len(payloads[0]) + 4
    got = list(scan(str(path), {}))
    assert got == [
        Entry("alpha", offsets[0], len(payloads[0]), {}),
        Entry("βeta", offsets[1], len(payloads[1]), {}),
        Entry("", offsets[2], len(payloads[2]), {}),
    ]
    assert all(e.members == [] for e in got)


def test_scan_int64_and_float_keys(tmp_path: Path) -> None:
    payloads = [
        ex_bytes(id=i64(42)),
        ex_bytes(id=i64(-7)),
        ex_bytes(id=f32(0.5)),
        ex_bytes(id=f32(0.1)),
        ex_bytes(id=i64(2**63 - 1)),
    ]
    path = tmp_path / "k.tfrecord"
    write_raw(path, payloads)
    keys = [e.key for e in scan(str(path), {"key": "id"})]
    assert keys == ["42", "-7", "0.5", str(float(np.float32(0.1))), "9223372036854775807"]
    assert keys[3] == "0.10000000149011612"


def test_scan_key_none_keys_by_position(tmp_path: Path) -> None:
    payloads = [ex_bytes(key=b(b"a"), n=i64(1)), ex_bytes(n=i64(2))]
    path = tmp_path / "n.tfrecord"
    offsets = write_raw(path, payloads)
    got = list(scan(str(path), {"key": None}))
    # without a key feature, "key" is an ordinary field
    assert got == [
        Entry(None, offsets[0], len(payloads[0]), {"key": "a", "n": 1}),
        Entry(None, offsets[1], len(payloads[1]), {"n": 2}),
    ]
    bare = list(scan(str(path), {"key": None, "fields": False}))
    assert bare == [
        Entry(None, offsets[0], len(payloads[0])),
        Entry(None, offsets[1], len(payloads[1])),
    ]


def test_scan_missing_key_feature(tmp_path: Path) -> None:
    payloads = [ex_bytes(key=b(b"a")), ex_bytes(other=b(b"b")), ex_bytes(key=b(b"c"))]
    path = tmp_path / "m.tfrecord"
    offsets = write_raw(path, payloads)
    got, err = scan_until_error(path)
    assert [e.key for e in got] == ["a"]
    assert err.offset == offsets[1]
    assert err.path == str(path)
    msg = str(err)
    assert str(path) in msg
    assert f"at byte {offsets[1]}" in msg
    assert "'key'" in msg
    assert "no key feature" in msg
    # a custom key feature name shows up in the message
    _, err = scan_until_error(path, {"key": "sample_id"})
    assert err.offset == 0
    assert "'sample_id'" in str(err)


@pytest.mark.parametrize(
    ("feature", "problem"),
    [
        (b(b"\xff\xfe"), "is not valid UTF-8"),
        (b(), "is empty"),
        (i64(), "is empty"),
        (Feature(), "is empty"),
    ],
)
def test_scan_bad_key_values(tmp_path: Path, feature: Feature, problem: str) -> None:
    payloads = [ex_bytes(key=b(b"ok")), ex_bytes(key=feature)]
    path = tmp_path / "bad.tfrecord"
    offsets = write_raw(path, payloads)
    got, err = scan_until_error(path)
    assert [e.key for e in got] == ["ok"]
    assert err.offset == offsets[1]
    assert str(err) == f"{path}: at byte {offsets[1]}: key feature 'key' {problem}"


def test_scalar_field_rule(tmp_path: Path) -> None:
    payload = ex_bytes(
        key=b(b"k0"),
        label=i64(3),
        neg=i64(-(2**63)),
        flag=i64(1),
        score=f32(0.25),
        ratio=f32(0.1),
        name=b(b"hello"),
        blank=b(b""),
        text256=b(b"x" * 256),
        utf8_256=b(("é" * 128).encode()),
        # not fields:
        text257=b(b"x" * 257),
        utf8_258=b(("é" * 129).encode()),
        binary=b(b"\xff\x00"),
        multi_int=i64(1, 2),
        multi_float=f32(1.0, 2.0),
        multi_bytes=b(b"a", b"b"),
        empty_int=i64(),
        empty_float=f32(),
        empty_bytes=b(),
        nokind=Feature(),
    )
    path = tmp_path / "f.tfrecord"
    write_raw(path, [payload])
    (entry,) = scan(str(path), {})
    assert entry.key == "k0"
    assert entry.fields == {
        "label": 3,
        "neg": -(2**63),
        "flag": 1,
        "score": 0.25,
        "ratio": 0.1,  # the shortest decimal that is float32(0.1), not 0.10000000149011612
        "name": "hello",
        "blank": "",
        "text256": "x" * 256,
        "utf8_256": "é" * 128,
    }
    assert type(entry.fields["label"]) is int
    assert type(entry.fields["score"]) is float
    assert type(entry.fields["name"]) is str
    assert tfrecord.MAX_TEXT_FIELD == 256

    (no_fields,) = scan(str(path), {"fields": False})
    assert no_fields == Entry("k0", 0, len(payload), {})
    (keyed_by_label,) = scan(str(path), {"key": "label"})
    assert keyed_by_label.key == "3"
    assert "label" not in keyed_by_label.fields
    assert keyed_by_label.fields["key"] == "k0"


def test_scan_sequence_examples_use_the_context(tmp_path: Path) -> None:
    seq = SequenceExample(
        context=Features(feature={"key": b(b"clip"), "fps": f32(30.0)}),
        feature_lists=FeatureLists(feature_list={"frames": FeatureList(feature=[b(b"f0")])}),
    )
    raw = seq.SerializeToString()
    path = tmp_path / "seq.tfrecord"
    write_raw(path, [raw])
    assert list(scan(str(path), {})) == [Entry("clip", 0, len(raw), {"fps": 30.0})]


def test_empty_file_scans_to_nothing(tmp_path: Path) -> None:
    path = tmp_path / "empty.tfrecord"
    path.write_bytes(b"")
    assert list(scan(str(path), {})) == []
    assert list(scan(str(path), {"key": None, "fields": False})) == []


def test_scan_of_an_empty_payload_record(tmp_path: Path) -> None:
    # b"" is a valid (empty) Example: it has no key feature
    path = tmp_path / "e.tfrecord"
    write_raw(path, [b"", b""])
    assert list(scan(str(path), {"key": None})) == [Entry(None, 0, 0, {}), Entry(None, 16, 0, {})]
    _, err = scan_until_error(path)
    assert err.offset == 0
    assert "no key feature 'key'" in str(err)


# -- corruption ----------------------------------------------------------------


def _three(tmp_path: Path) -> tuple[Path, list[bytes], list[int]]:
    payloads = [ex_bytes(key=b(f"r{i}".encode()), v=b(b"v" * (10 + i))) for i in range(3)]
    path = tmp_path / "c.tfrecord"
    offsets = write_raw(path, payloads)
    return path, payloads, offsets


def test_data_crc_mismatch(tmp_path: Path) -> None:
    path, payloads, offsets = _three(tmp_path)
    flip(path, offsets[1] + 12 + len(payloads[1]) - 1)
    got, err = scan_until_error(path)
    assert [e.key for e in got] == ["r0"]
    assert isinstance(err, ValueError)
    assert isinstance(err, ShardcatError)
    assert err.path == str(path)
    assert err.offset == offsets[1]
    assert err.problem == "data CRC mismatch"
    assert str(err) == f"{path}: at byte {offsets[1]}: data CRC mismatch"


def test_data_crc_field_corrupted(tmp_path: Path) -> None:
    path, _, offsets = _three(tmp_path)
    flip(path, offsets[2] - 2)  # inside record 1's trailing data CRC
    _, err = scan_until_error(path)
    assert err.offset == offsets[1]
    assert err.problem == "data CRC mismatch"


@pytest.mark.parametrize("byte", [0, 7, 8, 11])
def test_length_crc_mismatch(tmp_path: Path, byte: int) -> None:
    path, _, offsets = _three(tmp_path)
    flip(path, offsets[1] + byte)  # the length or its CRC
    got, err = scan_until_error(path)
    assert len(got) == 1
    assert err.offset == offsets[1]
    assert str(err) == f"{path}: at byte {offsets[1]}: length CRC mismatch"


@pytest.mark.parametrize("keep", [12, 12 + 3, -1])
def test_truncated_last_record(tmp_path: Path, keep: int) -> None:
    path, payloads, offsets = _three(tmp_path)
    full = path.read_bytes()
    cut = len(full) - 1 if keep == -1 else offsets[2] + keep
    path.write_bytes(full[:cut])
    got, err = scan_until_error(path)
    assert [e.key for e in got] == ["r0", "r1"]
    assert err.offset == offsets[2]
    assert "truncated" in str(err)
    need = 16 + len(payloads[2])
    assert err.problem == f"truncated record: needs {need} bytes, file has {cut - offsets[2]} left"


@pytest.mark.parametrize("keep", [1, 5, 11])
def test_truncated_frame_header(tmp_path: Path, keep: int) -> None:
    path, _, offsets = _three(tmp_path)
    path.write_bytes(path.read_bytes()[: offsets[2] + keep])
    got, err = scan_until_error(path)
    assert len(got) == 2
    assert err.offset == offsets[2]
    assert err.problem == f"truncated frame header ({keep} of 12 bytes)"
    assert f"at byte {offsets[2]}: truncated frame header" in str(err)


@pytest.mark.parametrize("garbage", [b"\xff\xff\xff", b"\x0a\x05ab", b"\x0b"])
def test_payload_that_is_not_an_example(tmp_path: Path, garbage: bytes) -> None:
    good = ex_bytes(key=b(b"fine"))
    path = tmp_path / "g.tfrecord"
    with TFRecordWriter(path) as w:
        w.write(good)
        bad_at = w.write(garbage)
    got, err = scan_until_error(path)
    assert [e.key for e in got] == ["fine"]
    assert bad_at == 16 + len(good)
    assert err.offset == bad_at
    assert "not a tf.train.Example" in str(err)
    assert f"{path}: at byte {bad_at}: payload is not a tf.train.Example" in str(err)
    # with neither key nor fields nothing is parsed: framing alone is checked
    bare = list(scan(str(path), {"key": None, "fields": False}))
    assert bare == [Entry(None, 0, len(good)), Entry(None, bad_at, len(garbage))]


def test_scan_can_stop_early(tmp_path: Path) -> None:
    path, _, offsets = _three(tmp_path)
    gen = scan(str(path), {})
    assert next(gen).offset == offsets[0]
    gen.close()  # releases the mapping without error
    assert [e.key for e in scan(str(path), {})] == ["r0", "r1", "r2"]


# -- sniff ---------------------------------------------------------------------


def test_sniff() -> None:
    head = (ref_frame(ex_bytes(key=b(b"a"))) * 3)[:512]
    assert sniff(head) is True
    assert sniff(ref_frame(b"")) is True
    assert sniff(ref_frame(b"")[:12]) is True
    assert sniff(ref_frame(b"")[:11]) is False
    assert sniff(b"") is False
    assert sniff(b"PK\x03\x04" + bytes(60)) is False
    assert sniff(b"\x1f\x8b\x08\x00" + bytes(60)) is False
    bad = bytearray(head)
    bad[9] ^= 0x01
    assert sniff(bytes(bad)) is False


# -- read ----------------------------------------------------------------------


def test_read_returns_payloads_via_pread(tmp_path: Path, fd_of) -> None:
    path, payloads, offsets = _three(tmp_path)
    fd = fd_of(path)
    for off, p in zip(reversed(offsets), reversed(payloads), strict=True):
        assert TFR.read(fd, Location(off, len(p))) == p
        got = TFR.read(fd, Location(off, len(p)), verify=True)
        assert got == p
        assert isinstance(got, bytes)
    assert os.lseek(fd.fd, 0, os.SEEK_CUR) == 0  # pread: the file position never moves


def test_read_verify_detects_data_corruption(tmp_path: Path, fd_of) -> None:
    path, payloads, offsets = _three(tmp_path)
    flip(path, offsets[1] + 12)
    fd = fd_of(path)
    corrupted = TFR.read(fd, Location(offsets[1], len(payloads[1])))
    assert corrupted != payloads[1]
    assert corrupted[1:] == payloads[1][1:]
    with pytest.raises(CorruptRecordError) as info:
        TFR.read(fd, Location(offsets[1], len(payloads[1])), verify=True)
    assert info.value.offset == offsets[1]
    assert str(info.value) == f"{path}: at byte {offsets[1]}: data CRC mismatch"
    # the neighbours are fine
    assert TFR.read(fd, Location(offsets[2], len(payloads[2])), verify=True) == payloads[2]


def test_read_verify_detects_length_corruption(tmp_path: Path, fd_of) -> None:
    path, payloads, offsets = _three(tmp_path)
    flip(path, offsets[0] + 9)  # the length CRC
    fd = fd_of(path)
    with pytest.raises(CorruptRecordError) as info:
        TFR.read(fd, Location(offsets[0], len(payloads[0])), verify=True)
    assert info.value.offset == offsets[0]
    assert info.value.problem == "length CRC mismatch"


@pytest.mark.parametrize("delta", [-1, 1])
def test_read_verify_detects_a_length_other_than_the_catalogs(
    tmp_path: Path, fd_of, delta: int
) -> None:
    path, payloads, offsets = _three(tmp_path)
    fd = fd_of(path)
    with pytest.raises(CorruptRecordError) as info:
        TFR.read(fd, Location(offsets[0], len(payloads[0]) + delta), verify=True)
    assert info.value.offset == offsets[0]
    assert "length differs from the catalog" in str(info.value)


def test_read_short_read(tmp_path: Path, fd_of) -> None:
    path, payloads, offsets = _three(tmp_path)
    full = path.read_bytes()
    path.write_bytes(full[: offsets[2] + 12 + 5])
    fd = fd_of(path)
    with pytest.raises(CorruptRecordError) as info:
        TFR.read(fd, Location(offsets[2], len(payloads[2])))
    assert info.value.path == str(path)
    assert info.value.offset == offsets[2]  # the frame's offset, like every other error
    assert info.value.problem == f"truncated record: 5 of {len(payloads[2])} payload bytes"
    with pytest.raises(CorruptRecordError) as info:
        TFR.read(fd, Location(offsets[2], len(payloads[2])), verify=True)
    assert info.value.offset == offsets[2]
    assert info.value.problem == f"expected {16 + len(payloads[2])} bytes, file ends after 17"
    with pytest.raises(CorruptRecordError):
        TFR.read(fd, Location(len(full) + 100, 10))


# -- decode / detect_options -----------------------------------------------------


def _seq(with_lists: bool = True) -> SequenceExample:
    lists = {"frames": FeatureList(feature=[b(b"f0"), b(b"f1"), b(b"f2")])} if with_lists else {}
    return SequenceExample(
        context=Features(feature={"key": b(b"clip"), "n": i64(3)}),
        feature_lists=FeatureLists(feature_list=lists),
    )


def test_decode() -> None:
    raw = ex_bytes(key=b(b"a"), n=i64(1, 2))
    for options in ({}, {"message": "example"}):
        ex = decode(raw, options)
        assert isinstance(ex, Example)
        assert list(ex.features.feature["n"].int64_list.value) == [1, 2]
    seq = _seq()
    got = decode(seq.SerializeToString(), {"message": "sequence_example"})
    assert isinstance(got, SequenceExample)
    assert got == seq
    # an Example decoded as a SequenceExample keeps its features as context
    as_seq = decode(raw, {"message": "sequence_example"})
    assert as_seq.context == Example.FromString(raw).features


def test_detect_options(tmp_path: Path) -> None:
    cases = {
        "seq": ([_seq().SerializeToString(), ex_bytes(key=b(b"x"))], "sequence_example"),
        "ctx_only": ([_seq(with_lists=False).SerializeToString()], "example"),
        "example": ([ex_bytes(key=b(b"x")), _seq().SerializeToString()], "example"),
        "garbage": ([b"\xff\xff\xff"], "example"),
        "empty": ([], "example"),
    }
    for name, (payloads, message) in cases.items():
        path = tmp_path / f"{name}.tfrecord"
        write_raw(path, payloads)
        assert detect_options(str(path)) == {"message": message}, name
    short = tmp_path / "short.tfrecord"
    short.write_bytes(ref_frame(b"abc")[:7])
    assert detect_options(str(short)) == {"message": "example"}


# -- make_example and record helpers ---------------------------------------------


def _kind_values(ex: Example, name: str) -> tuple[str | None, list]:
    feature = ex.features.feature[name]
    kind = feature.WhichOneof("kind")
    return kind, list(getattr(feature, kind).value) if kind else []


def test_make_example_types() -> None:
    passthrough = f32(1.0, 2.0)
    ex = make_example(
        {
            "s": "héllo",
            "b": b"\x00\xff",
            "i": 5,
            "neg": -3,
            "t": True,
            "f": 0.5,
            "ints": [1, 2, 3],
            "mixed_num": [1, 2.5],
            "strs": ("a", b"b"),
            "np_i32": np.array([1, -2], dtype=np.int32),
            "np_f32": np.array([0.5, 1.5], dtype=np.float32),
            "np_2d": np.arange(4, dtype=np.int64).reshape(2, 2),
            "np_bool": np.array([True, False]),
            "np_str": np.array(["x", "yz"]),
            "np_scalar_i": np.int64(7),
            "np_scalar_f": np.float32(0.25),
            "empty": [],
            "feat": passthrough,
        }
    )
    assert isinstance(ex, Example)
    expected = {
        "s": ("bytes_list", ["héllo".encode()]),
        "b": ("bytes_list", [b"\x00\xff"]),
        "i": ("int64_list", [5]),
        "neg": ("int64_list", [-3]),
        "t": ("int64_list", [1]),
        "f": ("float_list", [0.5]),
        "ints": ("int64_list", [1, 2, 3]),
        "mixed_num": ("float_list", [1.0, 2.5]),
        "strs": ("bytes_list", [b"a", b"b"]),
        "np_i32": ("int64_list", [1, -2]),
        "np_f32": ("float_list", [0.5, 1.5]),
        "np_2d": ("int64_list", [0, 1, 2, 3]),
        "np_bool": ("int64_list", [1, 0]),
        "np_str": ("bytes_list", [b"x", b"yz"]),
        "np_scalar_i": ("int64_list", [7]),
        "np_scalar_f": ("float_list", [0.25]),
        "empty": ("int64_list", []),
        "feat": ("float_list", [1.0, 2.0]),
    }
    assert {name: _kind_values(ex, name) for name in ex.features.feature} == expected
    # the empty list still selects int64_list (an explicit, empty kind)
    assert ex.features.feature["empty"].HasField("int64_list")


@pytest.mark.parametrize("value", [{"a": 1}, None, [1, "a"], [b"x", 2.0], object()])
def test_make_example_rejects_unsupported_values(value: object) -> None:
    with pytest.raises(TypeError, match=r"cannot store .* in a tf.train.Feature"):
        make_example({"bad": value})


def test_feature_list_features_describe_on_examples() -> None:
    ex = Example(
        features=Features(
            feature={
                "key": b(b"k"),
                "label": i64(3),
                "score": f32(0.5),
                "tags": b(b"x", b"y"),
                "vec": f32(1.0, 2.0, 3.0),
                "none": i64(),
                "nokind": Feature(),
            }
        )
    )
    assert feature_list(ex, "key") == [b"k"]
    assert feature_list(ex, "label") == [3]
    assert feature_list(ex, "vec") == [1.0, 2.0, 3.0]
    assert feature_list(ex, "none") == []
    assert feature_list(ex, "nokind") is None
    assert feature_list(ex, "missing") is None
    assert all_features(ex) == {
        "key": [b"k"],
        "label": [3],
        "score": [0.5],
        "tags": [b"x", b"y"],
        "vec": [1.0, 2.0, 3.0],
        "none": [],
        "nokind": [],
    }
    desc = describe(ex)
    assert desc == {
        "key": "bytes",
        "label": "int64",
        "none": "int64[0]",
        "nokind": "empty",
        "score": "float",
        "tags": "bytes[2]",
        "vec": "float[3]",
    }
    assert list(desc) == sorted(desc)


def test_feature_list_features_describe_on_sequence_examples() -> None:
    seq = _seq()
    assert feature_list(seq, "key") == [b"clip"]
    assert feature_list(seq, "frames") is None  # feature lists are not context features
    assert all_features(seq) == {"key": [b"clip"], "n": [3]}
    assert describe(seq) == {"key": "bytes", "n": "int64", "frames": "sequence[3]"}


def test_make_example_writes_and_scans(tmp_path: Path) -> None:
    path = tmp_path / "mk.tfrecord"
    records = [
        {"key": f"k{i}", "label": i, "score": i / 4, "img": bytes([i]) * 300} for i in range(4)
    ]
    with TFRecordWriter(path) as w:
        offsets = [w.write(make_example(r)) for r in records]
    entries = list(scan(str(path), {}))
    assert [e.offset for e in entries] == offsets
    assert [e.key for e in entries] == ["k0", "k1", "k2", "k3"]
    assert [e.fields for e in entries] == [{"label": i, "score": i / 4} for i in range(4)]
    with open(path, "rb") as f:
        fd = f.fileno()
        for e, r in zip(entries, records, strict=True):
            got = decode(
                TFR.read(FileSource(fd, str(path)), Location(e.offset, e.length), verify=True), {}
            )
            assert all_features(got) == {
                "key": [r["key"].encode()],
                "label": [r["label"]],
                "score": [r["score"]],
                "img": [r["img"]],
            }


# -- hypothesis round trip ----------------------------------------------------------


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    records=st.lists(
        st.tuples(st.text(max_size=20), st.binary(max_size=600)),
        max_size=30,
        unique_by=lambda r: r[0],
    )
)
def test_round_trip(records: list[tuple[str, bytes]]) -> None:
    serialized = [make_example({"key": k, "data": p}).SerializeToString() for k, p in records]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rt.tfrecord")
        with TFRecordWriter(path) as w:
            offsets = [w.write(s) for s in serialized]
        with open(path, "rb") as f:
            assert f.read() == b"".join(ref_frame(s) for s in serialized)
        expected_offsets = ref_offsets(serialized)
        assert offsets == expected_offsets
        entries = list(scan(path, {}))
        assert [e.key for e in entries] == [k for k, _ in records]
        assert [e.offset for e in entries] == expected_offsets
        assert [e.length for e in entries] == [len(s) for s in serialized]
        for e, (_, payload) in zip(entries, records, strict=True):
            try:
                text = payload.decode("utf-8")
            except UnicodeDecodeError:
                text = None
            if text is not None and len(payload) <= 256:
                assert e.fields == {"data": text}
            else:
                assert e.fields == {}
        fd = os.open(path, os.O_RDONLY)
        try:
            for e, s, (k, p) in zip(entries, serialized, records, strict=True):
                assert TFR.read(FileSource(fd, str(path)), Location(e.offset, e.length)) == s
                raw = TFR.read(FileSource(fd, str(path)), Location(e.offset, e.length), verify=True)
                assert raw == s
                assert all_features(decode(raw, {})) == {"key": [k.encode()], "data": [p]}
        finally:
            os.close(fd)


def test_fields_follow_each_records_own_feature_kind(tmp_path: Path) -> None:
    """The per-shard kind cache must not carry one record's kind over to the next."""
    path = tmp_path / "kinds.tfrecord"
    values: list[object] = [1, "a", [1, 2], 2.5, [], b"\xff", 7]
    with TFRecordWriter(path) as w:
        for i, value in enumerate(values):
            w.write(make_example({"key": f"k{i}", "x": value}))
    fields = [e.fields for e in scan(str(path), {})]
    assert fields == [{"x": 1}, {"x": "a"}, {}, {"x": 2.5}, {}, {}, {"x": 7}]
