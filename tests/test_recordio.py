"""shardcat.formats.recordio: dmlc framing, IRHeader, .idx keys, reader, DALI export.

The expected bytes come from an independent encoder written here from the
dmlc-core spec (``include/dmlc/recordio.h``)::

    uint32 magic   0xced7230a                       little endian
    uint32 lrecord cflag << 29 | length
    byte   data[length], zero padding to a multiple of 4

A payload is cut at every 4-byte aligned occurrence of the magic word (the
word itself dropped): pieces get cflag 1 (first), 2 (middle), 3 (last); a
payload without one is a single cflag-0 frame. ``GOLDEN_REC``/``GOLDEN_IDX``
are what MXNet 1.9.1's ``MXIndexedRecordIO.write_idx`` wrote for
``GOLDEN_PAYLOADS`` (keys 0, 10, 20, ...). The DALI index formats are
re-implemented here from DALI's ``tools/rec2idx.py`` (``<n>\\t<offset>`` per
record, ``n`` counting from 0, ``offset`` where the record's first frame
starts) and ``tools/tfrecord2idx`` (``<offset> <frame size>`` per frame).
"""

from __future__ import annotations

import json
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from shardcat import Catalog, CatalogError, IngestError, RecordIOReader, StaleShardError
from shardcat.cli import app
from shardcat.errors import CorruptRecordError, DuplicateKeyError
from shardcat.facade.export import export_index, index_name
from shardcat.formats import recordio_frames
from shardcat.formats.base import Location
from shardcat.formats.recordio import (
    IRHeader,
    IRRecord,
    RecordIOFormat,
    RecordIOWriter,
    encode,
    idx_path_for,
    pack,
    unpack,
)
from shardcat.formats.registry import detect_format
from shardcat.formats.tfrecord import TFRecordWriter, make_example
from shardcat.sources.local import FileSource

RIO = RecordIOFormat()
decode, describe, detect_options, features = (
    RIO.decode,
    RIO.describe,
    RIO.detect_options,
    RIO.features,
)
feature_list, key_rule, scan, sniff = RIO.feature_list, RIO.key_rule, RIO.scan, RIO.sniff

MAGIC = 0xCED7230A
M = struct.pack("<I", MAGIC)


# -- an independent implementation of the spec -----------------------------------


def spec_pieces(payload: bytes) -> list[bytes]:
    pieces, start = [], 0
    for i in range(0, len(payload) - len(payload) % 4, 4):
        if payload[i : i + 4] == M:
            pieces.append(payload[start:i])
            start = i + 4
    return [*pieces, payload[start:]]


def spec_frames(payload: bytes) -> bytes:
    pieces = spec_pieces(payload)
    out = b""
    for k, piece in enumerate(pieces):
        last = k == len(pieces) - 1
        cflag = 0 if len(pieces) == 1 else 1 if k == 0 else 3 if last else 2
        out += struct.pack("<II", MAGIC, cflag << 29 | len(piece))
        out += piece + b"\0" * (-len(piece) % 4)
    return out


def spec_records(data: bytes) -> list[tuple[int, bytes]]:
    """(offset of the first frame, payload) of every record, read as dmlc does."""
    out, pos = [], 0
    while pos < len(data):
        start, payload = pos, b""
        while True:
            magic, lrec = struct.unpack_from("<II", data, pos)
            assert magic == MAGIC
            n = lrec & ((1 << 29) - 1)
            payload += data[pos + 8 : pos + 8 + n]
            pos += 8 + n + (-n % 4)
            if lrec >> 29 in (0, 3):
                break
            payload += M
        out.append((start, payload))
    return out


def spec_rec2idx(data: bytes) -> str:
    return "".join(f"{n}\t{offset}\n" for n, (offset, _) in enumerate(spec_records(data)))


def spec_tfrecord2idx(data: bytes) -> str:
    lines, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack_from("<q", data, pos)
        lines.append(f"{pos} {8 + 4 + length + 4}\n")
        pos += 8 + 4 + length + 4
    return "".join(lines)


EDGE_PAYLOADS = [
    b"",
    b"a",
    b"ab",
    b"abc",
    b"abcd",
    b"abcde",
    M,  # the magic word alone: an empty first part and an empty last part
    M + M,  # first, middle and last part, all empty
    b"xyz" + M,  # unaligned: not cut
    b"wxyz" + M,  # aligned at the very end
    M + b"tail",  # aligned at the very start
    b"a" + M + b"bcd" + M,  # unaligned, then aligned at the end
    b"abcd" + M + b"efgh" + M + M + b"ij",
    bytes(range(256)) * 3,
]

GOLDEN_PAYLOADS = [
    b"",
    b"a",
    b"abcd",
    b"abcde",
    M,
    M + M,
    b"xyz" + M,
    b"wxyz" + M,
    M + b"tail",
    b"a" + M + b"bcd" + M,
    pack(IRHeader(0, 3, 7, 0), b"img"),
    pack(IRHeader(0, [1.5, -2, 0.1], 8, 0), b"jpg"),
]
GOLDEN_REC = bytes.fromhex(
    "0a23d7ce000000000a23d7ce01000000610000000a23d7ce04000000616263640a23d7ce0500000061"
    "626364650000000a23d7ce000000200a23d7ce000000600a23d7ce000000200a23d7ce000000400a23"
    "d7ce000000600a23d7ce0700000078797a0a23d7ce000a23d7ce040000207778797a0a23d7ce000000"
    "600a23d7ce000000200a23d7ce040000607461696c0a23d7ce08000020610a23d7ce6263640a23d7ce"
    "000000600a23d7ce1b000000000000000000404007000000000000000000000000000000696d67000a"
    "23d7ce270000000300000000000000080000000000000000000000000000000000c03f000000c0cdcc"
    "cc3d6a706700"
)
GOLDEN_IDX = (
    "0\t0\n10\t8\n20\t20\n30\t32\n40\t48\n50\t64\n60\t88\n70\t104\n80\t124\n90\t144\n"
    "100\t168\n110\t204\n"
)


def write_rec(path: Path, payloads: list[bytes], keys: list[str] | None = None) -> list[int]:
    with RecordIOWriter(path, idx_path="auto" if keys is not None else None) as w:
        return [w.write(p, None if keys is None else keys[i]) for i, p in enumerate(payloads)]


def read_at(path: Path, offset: int, length: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return RIO.read(FileSource(fd, str(path)), Location(offset, length))
    finally:
        os.close(fd)


# -- framing -----------------------------------------------------------------------


@pytest.mark.parametrize("payload", EDGE_PAYLOADS, ids=range(len(EDGE_PAYLOADS)))
def test_encode_matches_the_spec(payload: bytes):
    assert encode(payload) == spec_frames(payload)
    assert len(encode(payload)) % 4 == 0


def test_multi_part_frames_exactly():
    # b"abcd" M b"efgh" M M b"ij": parts abcd (1), efgh (2), "" (2), ij (3, padded)
    assert encode(b"abcd" + M + b"efgh" + M + M + b"ij") == (
        M + struct.pack("<I", 1 << 29 | 4) + b"abcd"
        + M + struct.pack("<I", 2 << 29 | 4) + b"efgh"
        + M + struct.pack("<I", 2 << 29 | 0)
        + M + struct.pack("<I", 3 << 29 | 2) + b"ij\0\0"
    )  # fmt: skip
    assert encode(b"") == M + b"\0\0\0\0"
    assert encode(b"xyz" + M) == M + struct.pack("<I", 7) + b"xyz" + M + b"\0"


def test_writer_matches_mxnet_golden_bytes(tmp_path: Path):
    path = tmp_path / "g.rec"
    with RecordIOWriter(path) as w:
        offsets = [w.write_idx(i * 10, p) for i, p in enumerate(GOLDEN_PAYLOADS)]
    assert path.read_bytes() == GOLDEN_REC
    assert (tmp_path / "g.idx").read_text() == GOLDEN_IDX
    assert offsets == [int(line.split("\t")[1]) for line in GOLDEN_IDX.splitlines()]


@pytest.mark.parametrize("payload", EDGE_PAYLOADS, ids=range(len(EDGE_PAYLOADS)))
def test_scan_and_read_reassemble_byte_exactly(tmp_path: Path, payload: bytes):
    path = tmp_path / "x.rec"
    payloads = [b"before", payload, b"after!!"]
    path.write_bytes(b"".join(spec_frames(p) for p in payloads))
    entries = list(scan(str(path), {"header": False}))
    sizes = [len(spec_frames(p)) for p in payloads]
    assert [e.offset for e in entries] == [0, sizes[0], sizes[0] + sizes[1]]
    assert [e.length for e in entries] == sizes
    assert [e.key for e in entries] == [None, None, None]
    assert [read_at(path, e.offset, e.length) for e in entries] == payloads


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.lists(
            st.sampled_from([M, b"\0", b"ab", b"\x0a\x23", b"\xd7\xce", b"q" * 5]), max_size=8
        ).map(b"".join),
        max_size=6,
    )
)
def test_roundtrip_arbitrary_payloads(tmp_path: Path, payloads: list[bytes]):
    path = tmp_path / "h.rec"
    offsets = write_rec(path, payloads)
    data = path.read_bytes()
    assert data == b"".join(spec_frames(p) for p in payloads)
    assert spec_records(data) == list(zip(offsets, payloads, strict=True))
    entries = list(scan(str(path), {"header": False}))
    assert [e.offset for e in entries] == offsets
    assert [read_at(path, e.offset, e.length) for e in entries] == payloads


def test_empty_file_has_no_records(tmp_path: Path):
    path = tmp_path / "empty.rec"
    path.write_bytes(b"")
    assert list(scan(str(path), {})) == []
    assert detect_options(str(path)) == {"idx": False, "header": True}
    assert detect_format(str(path)) == "recordio"  # by extension when there are no bytes


def test_sniff_and_detection_from_content(tmp_path: Path):
    assert sniff(encode(b"abc"))
    assert sniff(encode(M + b"x"))  # starts with a first part
    assert not sniff(encode(b"abc")[:7])
    assert not sniff(struct.pack("<II", MAGIC, 2 << 29 | 4))  # a middle part cannot start a file
    assert not sniff(b"\0" * 16)
    path = tmp_path / "no_extension"
    path.write_bytes(encode(b"payload"))
    assert detect_format(str(path)) == "recordio"


def test_too_large_payload_is_refused(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(recordio_frames, "MAX_LENGTH", 7)  # dmlc's limit is 2**29 - 1
    assert encode(b"1234567")
    with pytest.raises(ValueError, match="smaller than 2\\*\\*29 bytes, not 8"):
        encode(b"12345678")


# -- corruption ------------------------------------------------------------------------


def corrupt_scan(path: Path, data: bytes) -> CorruptRecordError:
    path.write_bytes(data)
    with pytest.raises(CorruptRecordError) as err:
        list(scan(str(path), {"header": False}))
    assert err.value.path == str(path)
    return err.value


def test_bad_magic_names_file_and_offset(tmp_path: Path):
    path = tmp_path / "bad.rec"
    frames = [encode(p) for p in (b"one", b"two!", b"three")]
    data = bytearray(b"".join(frames))
    data[len(frames[0])] ^= 0xFF
    err = corrupt_scan(path, bytes(data))
    assert err.offset == len(frames[0])
    assert "bad RecordIO magic 0xced723f5, expected 0xced7230a" in str(err)
    assert str(err).startswith(f"{path}: at byte {len(frames[0])}: ")


def test_bad_magic_inside_a_multi_part_record_names_the_record(tmp_path: Path):
    first = encode(b"ok")
    multi = bytearray(encode(b"abcd" + M + b"efgh"))
    multi[12] ^= 0x01  # the second frame's magic word
    err = corrupt_scan(tmp_path / "bad.rec", first + bytes(multi))
    assert err.offset == len(first)
    assert f"(frame at byte {len(first) + 12})" in str(err)


@pytest.mark.parametrize(
    ("frames", "message"),
    [
        ([(2, b"abcd"), (3, b"")], "record starts with continuation flag 2"),
        ([(3, b"")], "record starts with continuation flag 3"),
        ([(5, b"")], "record starts with continuation flag 5"),
        ([(1, b"abcd"), (0, b"x")], "multi-part record broken off: continuation flag 0"),
        ([(1, b"abcd"), (1, b"x")], "multi-part record broken off: continuation flag 1"),
    ],
)
def test_impossible_continuation_flags(
    tmp_path: Path, frames: list[tuple[int, bytes]], message: str
):
    good = encode(b"fine")
    bad = b"".join(
        struct.pack("<II", MAGIC, cflag << 29 | len(d)) + d + b"\0" * (-len(d) % 4)
        for cflag, d in frames
    )
    err = corrupt_scan(tmp_path / "bad.rec", good + bad)
    assert err.offset == len(good)
    assert message in str(err)


def test_truncation(tmp_path: Path):
    good = encode(b"fine")
    last = encode(b"0123456789")  # 8 + 12 bytes
    err = corrupt_scan(tmp_path / "t.rec", good + last[:-1])  # padding cut short
    assert err.offset == len(good)
    assert "truncated record: frame needs 20 bytes, file has 19 left" in str(err)
    err = corrupt_scan(tmp_path / "t.rec", good + last[:5])
    assert "truncated record: frame header needs 8 bytes, file has 5 left" in str(err)
    multi = encode(b"abcd" + M + b"efgh")
    err = corrupt_scan(tmp_path / "t.rec", good + multi[:12])  # the last part is missing
    assert err.offset == len(good)
    assert f"(frame at byte {len(good) + 12})" in str(err)


def test_read_checks_the_span_against_the_file(tmp_path: Path):
    path = tmp_path / "r.rec"
    path.write_bytes(encode(b"abcd" + M + b"efgh") + encode(b"next"))
    span = len(encode(b"abcd" + M + b"efgh"))
    assert read_at(path, 0, span) == b"abcd" + M + b"efgh"
    with pytest.raises(CorruptRecordError, match="does not end within the 12 bytes"):
        read_at(path, 0, 12)  # only the first part
    with pytest.raises(CorruptRecordError, match="at byte 4: bad RecordIO magic"):
        read_at(path, 4, 12)
    with pytest.raises(CorruptRecordError, match="expected 400 bytes, file ends after"):
        read_at(path, 0, 400)


# -- IRHeader ------------------------------------------------------------------------------


def test_pack_scalar_label_exact_bytes():
    payload = pack(IRHeader(5, 3.5, 42, 7), b"img")  # a number label forces flag 0
    assert payload == struct.pack("<IfQQ", 0, 3.5, 42, 7) + b"img"
    assert len(struct.pack("<IfQQ", 0, 0, 0, 0)) == 24
    header, data = unpack(payload)
    assert header == IRHeader(0, 3.5, 42, 7)
    assert data == b"img"
    assert pack(IRHeader(0, np.float32(2.5), 1, 0), b"") == struct.pack("<IfQQ", 0, 2.5, 1, 0)
    assert pack((0, 4, 1, 0), b"x") == struct.pack("<IfQQ", 0, 4.0, 1, 0) + b"x"


def test_pack_array_label_exact_bytes():
    payload = pack(IRHeader(0, [1.5, -2, 0.1], 8, 0), b"jpg")
    labels = struct.pack("<3f", 1.5, -2, 0.1)
    assert payload == struct.pack("<IfQQ", 3, 0.0, 8, 0) + labels + b"jpg"
    header, data = unpack(payload)
    assert header.flag == 3
    assert header.label.dtype == np.float32
    assert header.label.tolist() == list(struct.unpack("<3f", labels))
    assert (header.id, header.id2, data) == (8, 0, b"jpg")
    float64 = pack(IRHeader(0, np.array([[1, 2], [3, 4]], dtype=np.float64), 1, 0), b"")
    assert float64 == struct.pack("<IfQQ4f", 4, 0.0, 1, 0, 1, 2, 3, 4)
    assert pack(IRHeader(0, [], 1, 0), b"y") == struct.pack("<IfQQ", 0, 0.0, 1, 0) + b"y"


def test_unpack_refuses_short_payloads():
    with pytest.raises(ValueError, match="23 bytes cannot hold a 24-byte IRHeader"):
        unpack(b"\0" * 23)
    with pytest.raises(ValueError, match="flag 2 needs 32 bytes, the payload has 28"):
        unpack(struct.pack("<IfQQ", 2, 0, 0, 0) + b"abcd")


def test_record_view_with_header():
    payload = pack(IRHeader(0, 0.1, 3, 4), b"data")
    record = decode(payload, {"header": True})
    assert isinstance(record, IRRecord) and isinstance(record, bytes)
    assert record == payload
    assert record.header == IRHeader(0, struct.unpack("<f", struct.pack("<f", 0.1))[0], 3, 4)
    assert record.data == b"data"
    assert features(record) == {
        "flag": [0],
        "label": [np.float32(0.1).item()],
        "id": [3],
        "id2": [4],
        "data": [b"data"],
    }
    assert feature_list(record, "labels") is None
    assert describe(record) == {
        "data": "bytes",
        "flag": "uint32",
        "id": "uint64",
        "id2": "uint64",
        "label": "float32",
    }
    multi = decode(pack(IRHeader(0, [1, 2], 3, 0), b"z"), {})
    assert feature_list(multi, "labels") == [1.0, 2.0]
    assert feature_list(multi, "label") is None
    assert describe(multi)["labels"] == "float32[2]"
    assert pickle.loads(pickle.dumps(record)) == payload
    assert type(pickle.loads(pickle.dumps(record))) is IRRecord


def test_record_view_without_header():
    raw = decode(b"\xff\xd8\xff\xe0 raw jpeg", {"header": False})
    assert type(raw) is bytes
    assert features(raw) == {"data": [b"\xff\xd8\xff\xe0 raw jpeg"]}
    assert describe(raw) == {"data": "bytes"}
    short = decode(b"short", {"header": True})  # a header dataset, a record too short for one
    assert features(short) == {"data": [b"short"]}


@pytest.mark.parametrize(
    ("first", "header"),
    [
        (pack(IRHeader(0, 3, 1, 0), b"img"), True),
        (pack(IRHeader(0, [1, 2, 3], 1, 0), b""), True),
        (b"\xff\xd8\xff\xe0" + b"\0" * 100, False),  # a JPEG: flag 0xe0ffd8ff cannot fit
        (b"tiny", False),
        (struct.pack("<IfQQ", 0, float("nan"), 0, 0), False),
        (struct.pack("<IfQQ", 5, 0, 0, 0) + b"\0" * 19, False),  # 5 labels need 20 bytes
    ],
)
def test_header_detection(tmp_path: Path, first: bytes, header: bool):
    path = tmp_path / "d.rec"
    write_rec(path, [first, b"whatever"])
    assert detect_options(str(path)) == {"idx": False, "header": header}


# -- keys from .idx ---------------------------------------------------------------------------


def test_idx_keys_match_records_by_offset(tmp_path: Path):
    path = tmp_path / "k.rec"
    payloads = [b"a", M + b"b", b"c"]
    offsets = write_rec(path, payloads, ["zero", "one", "two"])
    assert (tmp_path / "k.idx").read_text() == "".join(
        f"{k}\t{o}\n" for k, o in zip(["zero", "one", "two"], offsets, strict=True)
    )
    # MXNet's index may list records in any order
    lines = (tmp_path / "k.idx").read_text().splitlines()
    (tmp_path / "k.idx").write_text("\n".join(reversed(lines)) + "\n\n")
    entries = list(scan(str(path), {"header": False}))
    assert [(e.key, e.offset) for e in entries] == list(
        zip(["zero", "one", "two"], offsets, strict=True)
    )
    assert key_rule({**detect_options(str(path)), "key": "key"}) == "mxnet-idx"
    assert key_rule({"idx": True, "key": None}) == "position"
    assert key_rule({"idx": False, "key": "key"}) == "position"
    assert [e.key for e in scan(str(path), {"key": None})] == [None] * 3
    assert [e.key for e in scan(str(path), {"idx": False})] == [None] * 3


def test_idx_problems_name_the_index_line(tmp_path: Path):
    path = tmp_path / "k.rec"
    idx = tmp_path / "k.idx"
    offsets = write_rec(path, [b"a", b"b"], ["x", "y"])
    idx.write_text(f"x\t{offsets[0]}\ny\t{offsets[1] + 4}\n")
    with pytest.raises(CorruptRecordError) as err:
        list(scan(str(path), {}))
    assert (err.value.path, err.value.offset) == (str(path), offsets[1])
    assert "record has no line in k.idx" in str(err.value)
    idx.write_text(f"x\t{offsets[0]}\ny\t{offsets[1]}\nz\t3\n")
    with pytest.raises(CorruptRecordError) as err:
        list(scan(str(path), {}))
    assert (err.value.path, err.value.offset) == (
        str(idx),
        len(f"x\t{offsets[0]}\ny\t{offsets[1]}\n"),
    )
    assert f"key 'z' points at byte 3, where no record of {path} starts" in str(err.value)
    idx.write_text("x\t0\nbroken line\n")
    with pytest.raises(CorruptRecordError, match="at byte 4: expected 'key<TAB>offset'"):
        list(scan(str(path), {}))
    idx.write_text("x\t0\ny\t0\n")
    with pytest.raises(CorruptRecordError, match="keys 'x' and 'y' both point at byte 0"):
        list(scan(str(path), {}))
    idx.unlink()
    with pytest.raises(CatalogError, match=r"no MXNet index k\.idx beside it"):
        list(scan(str(path), {"idx": True}))


# -- writer ------------------------------------------------------------------------------------


def test_writer_idx_options(tmp_path: Path):
    with RecordIOWriter(tmp_path / "a.rec") as w:
        assert w.idx_path == str(tmp_path / "a.idx")
        assert [w.write(b"x"), w.write(b"yy", "key"), w.write_idx(7, b"")] == [0, 12, 24]
        assert w.tell() == 32
    assert (tmp_path / "a.idx").read_text() == "0\t0\nkey\t12\n7\t24\n"
    with RecordIOWriter(tmp_path / "b.rec", idx_path=tmp_path / "elsewhere.txt") as w:
        w.write(b"x")
    assert (tmp_path / "elsewhere.txt").read_text() == "0\t0\n"
    with RecordIOWriter(tmp_path / "c.rec", idx_path=None) as w:
        w.write(b"x")
        with pytest.raises(ValueError, match=r"no \.idx"):
            w.write(b"x", "k")
    assert not (tmp_path / "c.idx").exists()
    with RecordIOWriter(tmp_path / "d.rec") as w:
        for bad in ("a\tb", "a\nb", " lead", ""):
            with pytest.raises(ValueError, match=r"an \.idx key must be"):
                w.write(b"x", bad)
    assert (tmp_path / "d.rec").read_bytes() == b""
    assert idx_path_for("dir/train.rec") == "dir/train.idx"
    assert idx_path_for("dir/train") == "dir/train.idx"


# -- catalog: keys, fields, reader ---------------------------------------------------------------


def labelled(n: int) -> list[bytes]:
    """IRHeader records: scalar labels, with every third one an array label."""
    out = []
    for i in range(n):
        label: object = [i, i + 0.5] if i % 3 == 2 else float(i % 4) + 0.1 * (i % 2)
        out.append(pack(IRHeader(0, label, 1000 + i, i % 2), bytes([i]) * i))
    return out


def test_sql_fields(tmp_path: Path):
    path = tmp_path / "f.rec"
    payloads = [*labelled(6), pack(IRHeader(0, float("nan"), 2**64 - 1, 2**63), b"big")]
    write_rec(path, payloads, [f"k{i}" for i in range(len(payloads))])
    with Catalog(tmp_path / "c.sqlite") as cat, cat.ingest(path, "rec") as reader:
        assert len(reader) == 7
        info = cat.info("rec")
        assert (info.format, info.key_rule) == ("recordio", "mxnet-idx")
        assert info.options["header"] is True and info.options["idx"] is True
        assert info.fields == {
            "flag": "integer",
            "label": "real",
            "id": "integer",
            "id2": "integer",
            "labels": "text",
        }
        rows = cat.query("SELECT key, position, flag, label, labels, id, id2 FROM rec")
        assert list(rows) == [
            ("k0", 0, 0, 0.0, None, 1000, 0),
            ("k1", 1, 0, 1.1, None, 1001, 1),
            ("k2", 2, 2, None, "[2.0, 2.5]", 1002, 0),
            ("k3", 3, 0, 3.1, None, 1003, 1),
            ("k4", 4, 0, 0.0, None, 1004, 0),
            ("k5", 5, 2, None, "[5.0, 5.5]", 1005, 1),
            ("k6", 6, 0, None, None, None, None),
        ]
        assert reader.where("label = 1.1") == ["k1"]  # the float32 reads as its short decimal
        assert cat.query(
            "SELECT key FROM rec WHERE json_extract(labels, '$[1]') > 3 ORDER BY key"
        ) == [("k5",)]
        assert json.loads(rows[2][4]) == [2.0, 2.5]


def test_reader_api_with_idx_keys(tmp_path: Path):
    payloads = labelled(9)
    keys = [f"img_{i}" for i in range(9)]
    write_rec(tmp_path / "part-0.rec", payloads[:5], keys[:5])
    write_rec(tmp_path / "part-1.rec", payloads[5:], keys[5:])
    with RecordIOReader(str(tmp_path / "*.rec"), max_workers=1) as reader:
        assert len(reader) == 9
        assert reader.get_keys() == keys
        assert "img_3" in reader and "img_99" not in reader
        for key, payload in zip(keys, payloads, strict=True):
            assert reader.get_record(key) == payload
        record = reader["img_4"]
        assert isinstance(record, IRRecord)
        assert record.header.id == 1004
        assert reader.get_feature("img_1", "label") == np.float32(1.1).item()
        assert reader.get_feature_list("img_2", "labels") == [2.0, 2.5]
        assert reader.get_feature("img_2", "label") is None
        assert reader.get_feature("img_3", "data") == bytes([3]) * 3
        assert reader.get_feature("img_3", "id2") == 1
        assert reader.get_record("missing") is None
        with pytest.raises(KeyError, match="'missing'"):
            reader["missing"]
        assert reader.get_many(["img_8", "img_0"]) == [payloads[8], payloads[0]]
        assert reader.get_many_at(slice(4, 6)) == payloads[4:6]
        stats = reader.get_stats()
        assert stats["total_records"] == 9
        assert stats["records_per_file"] == {"part-0.rec": 5, "part-1.rec": 4}
        assert (stats["format"], stats["key_rule"]) == ("recordio", "mxnet-idx")
        assert reader.describe()["label"] == "float32"
        assert reader.to_dict(reader["img_0"])["id"] == 1000
        assert reader.index_file == str(tmp_path / "shardcat.sqlite")
        clone = pickle.loads(pickle.dumps(reader))
        try:
            assert clone.get_record("img_7") == payloads[7]
            assert clone.rec_files == reader.rec_files
        finally:
            clone.close()


def test_position_keys_without_idx_continue_across_shards(tmp_path: Path):
    payloads = labelled(7)
    write_rec(tmp_path / "a.rec", payloads[:3])
    write_rec(tmp_path / "b.rec", payloads[3:])
    shards = [str(tmp_path / "a.rec"), str(tmp_path / "b.rec")]
    with RecordIOReader(shards, dataset="ab") as reader:
        assert reader.key_rule == "position"
        assert reader.get_keys() == [str(i) for i in range(7)]
        assert [reader[str(i)] for i in range(7)] == payloads
        assert reader.get_record(5) == payloads[5]
        assert reader.get_record("7") is None
        rows = reader.catalog.query("SELECT key, shard, id FROM ab ORDER BY position")
        assert [r[0] for r in rows] == [str(i) for i in range(7)]
        assert [r[2] for r in rows] == list(range(1000, 1007))


def test_key_by_position_overrides_idx_and_raw_payloads(tmp_path: Path):
    payloads = [b"\xff\xd8\xff\xe0jpeg-ish", M * 3, b""]
    write_rec(tmp_path / "raw.rec", payloads, ["x", "y", "z"])
    with RecordIOReader(tmp_path / "raw.rec", key_by_position=True, dataset="raw") as reader:
        assert reader.get_keys() == ["0", "1", "2"]
        assert reader.options["header"] is False
        assert [reader[k] for k in "012"] == payloads
        assert type(reader["0"]) is bytes
        assert reader.get_feature("1", "data") == M * 3
        assert reader.get_feature("1", "label") is None
        assert reader.describe() == {"data": "bytes"}
    with Catalog(reader.index_file, readonly=True) as cat:
        assert cat.info("raw").fields == {}
    labelled_payloads = labelled(3)
    write_rec(tmp_path / "forced.rec", labelled_payloads)
    with RecordIOReader(tmp_path / "forced.rec", header=False, dataset="forced") as reader:
        assert reader.get_feature("0", "data") == labelled_payloads[0]
    with Catalog(reader.index_file, readonly=True) as cat:
        assert cat.info("forced").fields == {}


def test_later_shard_without_idx_fails_alone(tmp_path: Path):
    write_rec(tmp_path / "a.rec", labelled(2), ["a0", "a1"])
    write_rec(tmp_path / "b.rec", labelled(2))
    with Catalog(tmp_path / "c.sqlite") as cat:
        with pytest.raises(IngestError) as err:
            cat.ingest(str(tmp_path / "*.rec"), "ds", workers=1)
        assert [f.path for f in err.value.failures] == ["b.rec"]
        assert "no MXNet index b.idx beside it" in str(err.value)
        with cat.dataset("ds") as reader:
            assert reader.get_keys() == ["a0", "a1"]


def test_duplicate_idx_keys_across_shards(tmp_path: Path):
    write_rec(tmp_path / "a.rec", [b"1", b"2"], ["0", "1"])
    write_rec(tmp_path / "b.rec", [b"3"], ["0"])
    with Catalog(tmp_path / "c.sqlite") as cat:
        # colliding .idx keys: keyed by position, the .idx key kept as a SQL column
        with (
            pytest.warns(UserWarning, match="collide"),
            cat.ingest(str(tmp_path / "*.rec"), "pos", workers=1) as r,
        ):
            assert r.get_keys() == ["0", "1", "2"]
            assert [r["0"], r["1"], r["2"]] == [b"1", b"2", b"3"]
            assert cat.query("SELECT idx_key FROM pos ORDER BY position") == [
                ("0",),
                ("1",),
                ("0",),
            ]
        # keyed by the .idx keys on request: a duplicate, or one kept by on_duplicate
        with pytest.raises(IngestError, match="duplicate key '0'"):
            cat.ingest(str(tmp_path / "*.rec"), "ds", options={"idx": True}, workers=1)
        with cat.ingest(
            str(tmp_path / "*.rec"), "ds2", options={"idx": True}, on_duplicate="last", workers=1
        ) as r:
            assert r.get_keys() == ["1", "0"]
            assert r["0"] == b"3"
    assert issubclass(DuplicateKeyError, ValueError)


# -- DALI index export --------------------------------------------------------------------------


def test_dali_index_lines():
    from shardcat.formats.base import Entry
    from shardcat.formats.tfrecord import TFRecordFormat

    entries = [Entry("a", 0, 20), Entry("b", 20, 44)]
    assert list(RIO.index_lines(entries, {})) == ["0\t0", "1\t20"]
    assert list(TFRecordFormat().index_lines(entries, {})) == ["0 36", "20 60"]


def test_export_recordio_like_rec2idx(tmp_path: Path):
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    write_rec(data / "x.rec", [*EDGE_PAYLOADS, *labelled(4)], [f"k{i}" for i in range(18)])
    write_rec(data / "sub" / "y.rec", labelled(3), ["y0", "y1", "y2"])
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(str(data / "**" / "*.rec"), "rec", workers=1).close()
        with pytest.raises(CatalogError, match=r"sub/y\.idx exists \(overwrite=True"):
            export_index(cat, "rec")  # beside the shards: MXNet's own .idx files are there
        out = tmp_path / "out"
        written = export_index(cat, "rec", out)
        assert written == [out / "sub" / "y.idx", out / "x.idx"]
        for shard, index in (
            (data / "x.rec", out / "x.idx"),
            (data / "sub" / "y.rec", out / "sub" / "y.idx"),
        ):
            assert index.read_text() == spec_rec2idx(shard.read_bytes())
        assert (out / "x.idx").read_text().startswith("0\t0\n1\t8\n2\t20\n")
        with pytest.raises(CatalogError, match="exists"):
            export_index(cat, "rec", out)
        assert export_index(cat, "rec", out, overwrite=True) == written
        written = export_index(cat, "rec", overwrite=True)
        assert written[1] == data / "x.idx"
        assert (data / "x.idx").read_text() == spec_rec2idx((data / "x.rec").read_bytes())


def test_export_tfrecord_like_tfrecord2idx(tmp_path: Path):
    for shard in range(2):
        with TFRecordWriter(tmp_path / f"train-{shard}.tfrecord") as w:
            for i in range(5 + shard):
                w.write(make_example({"key": f"r{shard}_{i}", "v": b"x" * (i * 7)}))
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(str(tmp_path / "*.tfrecord"), "tf", workers=1).close()
        written = export_index(cat, "tf")
        assert written == [tmp_path / "train-0.idx", tmp_path / "train-1.idx"]
        for shard in range(2):
            tf_bytes = (tmp_path / f"train-{shard}.tfrecord").read_bytes()
            assert (tmp_path / f"train-{shard}.idx").read_text() == spec_tfrecord2idx(tf_bytes)
        os.utime(tmp_path / "train-1.tfrecord", ns=(1, 1))
        with pytest.raises(StaleShardError, match=r"train-1\.tfrecord changed"):
            export_index(cat, "tf", tmp_path / "o")


def test_index_name():
    assert index_name("/d/train.rec", (".rec",)) == "train.idx"
    assert index_name("/d/train-00000-of-01024", (".tfrecord",)) == "train-00000-of-01024.idx"
    assert index_name("/d/a.tar.gz", (".tar", ".tar.gz")) == "a.idx"
    assert index_name("/d/.rec", (".rec",)) == ".rec.idx"


def test_export_index_cli(tmp_path: Path):
    write_rec(tmp_path / "x.rec", labelled(5), [str(i) for i in range(5)])
    runner = CliRunner()
    catalog = str(tmp_path / "c.sqlite")
    result = runner.invoke(app, ["ingest", str(tmp_path / "x.rec"), "-d", "rec", "-c", catalog])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["export-index", "rec", "-c", catalog])
    assert result.exit_code == 1
    assert "x.idx exists (--force replaces it)" in result.output
    out = tmp_path / "dali"
    result = runner.invoke(app, ["export-index", "rec", "-c", catalog, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert str(out / "x.idx") in result.output
    assert "wrote 1 index file(s)" in result.output
    assert (out / "x.idx").read_text() == spec_rec2idx((tmp_path / "x.rec").read_bytes())
    result = runner.invoke(app, ["export-index", "nope", "-c", catalog])
    assert result.exit_code == 1
    assert "no dataset 'nope'" in result.output
    result = runner.invoke(app, ["export-index", "--help"])
    assert "rec2idx" in result.output and "tfrecord2idx" in result.output


def test_directory_of_rec_and_idx_files(tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    write_rec(data / "a.rec", labelled(2), ["a0", "a1"])
    offsets = write_rec(data / "b.rec", labelled(3), ["b0", "b1", "b2"])
    with RecordIOReader(data) as reader:  # the .idx files hold keys, they are no shards
        assert reader.get_keys() == ["a0", "a1", "b0", "b1", "b2"]
        assert reader.get_stats()["records_per_file"] == {"a.rec": 2, "b.rec": 3}
        with Catalog(reader.index_file) as cat:
            written = export_index(cat, reader.dataset, data, overwrite=True)
        assert written == [data / "a.idx", data / "b.idx"]
    assert (data / "b.idx").read_text() == "".join(f"{n}\t{o}\n" for n, o in enumerate(offsets))
    # The .rec files did not change, so nothing is re-read: an .idx is not watched.
    with RecordIOReader(data) as reader:
        assert reader.get_keys() == ["a0", "a1", "b0", "b1", "b2"]
        with pytest.raises(IngestError, match="duplicate key '0'"):
            reader.rebuild_index()  # rec2idx numbers every file from 0


def test_export_of_the_mxnet_golden_file(tmp_path: Path):
    (tmp_path / "g.rec").write_bytes(GOLDEN_REC)
    (tmp_path / "g.idx").write_text(GOLDEN_IDX)
    with Catalog(tmp_path / "c.sqlite") as cat:
        with cat.ingest(tmp_path / "g.rec", "g") as reader:
            assert reader.get_keys() == [str(i * 10) for i in range(12)]
            assert [reader[k] for k in reader.get_keys()] == GOLDEN_PAYLOADS
        (index,) = export_index(cat, "g", tmp_path / "dali")
    offsets = [line.split("\t")[1] for line in GOLDEN_IDX.splitlines()]
    assert index.read_text() == "".join(f"{n}\t{o}\n" for n, o in enumerate(offsets))
