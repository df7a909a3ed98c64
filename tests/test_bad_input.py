"""Bad input gets a ``ShardcatError`` naming the file and the byte offset, never
another exception type and never an allocation of a size read off the data:
damaged lengths (TFRecord, RecordIO, tar), damaged compressed streams and seek
indexes, and what ``catalog extract``/``get`` write and print."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import random
import struct
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardcat import Catalog, CorruptRecordError, IngestError, TFRecordWriter, make_example
from shardcat.cli import app
from shardcat.facade.records import safe_name
from shardcat.formats.base import Location
from shardcat.formats.recordio import IRHeader, RecordIOWriter, pack
from shardcat.formats.tar import TarFormat
from shardcat.formats.tfrecord import TFRecordFormat, masked_crc
from shardcat.sources import compressed
from shardcat.sources.rawio import Source, pread_exact, read_full
from shardcat.testing.required import needs

needs_compressed = needs(
    all(
        __import__("importlib").util.find_spec(m) is not None
        for m in ("indexed_gzip", "indexed_bzip2", "xz")
    ),
    "shardcat[compressed]",
)


def write_tfrecord(path: Path, n: int = 3, size: int = 40) -> tuple[list[bytes], list[int]]:
    """``n`` records keyed ``k0``..; returns their payloads and frame offsets."""
    payloads, offsets = [], []
    with TFRecordWriter(path) as w:
        for i in range(n):
            raw = make_example({"key": f"k{i}", "data": bytes([65 + i]) * size}).SerializeToString()
            offsets.append(w.write(raw))
            payloads.append(raw)
    return payloads, offsets


def set_length(data: bytearray, offset: int, length: int, crc_ok: bool = True) -> None:
    """Overwrite the TFRecord frame length at ``offset`` (with its CRC recomputed)."""
    struct.pack_into("<Q", data, offset, length)
    if crc_ok:
        struct.pack_into("<I", data, offset + 8, masked_crc(bytes(data[offset : offset + 8])))


def ingest_failure(tmp_path: Path, path: Path, fmt: str) -> str:
    """The message an ingest of ``path`` fails with (into a fresh catalog)."""
    with Catalog(tmp_path / "c.sqlite") as cat, pytest.raises(IngestError) as info:
        cat.ingest(path, "d", format=fmt)
    (failure,) = info.value.failures
    # (a bad record's error ends saying how to index the other records: test_bad_records)
    return str(failure.error).removesuffix(" (on_bad_record='skip' indexes the other records)")


def _payload_data(n: int = 300_000) -> bytes:
    """``n`` mildly compressible bytes (hex digits), the same on every call."""
    return random.Random(2).randbytes(n // 2 + 1).hex().encode()[:n]


TAR, TFR = TarFormat(), TFRecordFormat()


class PreadSource(Source):
    """``os.pread`` on a file, as a reader's plain source does."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.fd = os.open(path, os.O_RDONLY)

    def pread(self, length: int, offset: int) -> bytes:
        return os.pread(self.fd, length, offset)

    def close(self) -> None:
        os.close(self.fd)


# -- 1. no declared length is trusted beyond the bytes that exist -----------------


@pytest.mark.parametrize("length", [2**63, 2**64 - 1, 2**40])
def test_tfrecord_detect_options_checks_the_length_crc(tmp_path: Path, length: int) -> None:
    path = tmp_path / "a.tfrecord"
    write_tfrecord(path)
    data = bytearray(path.read_bytes())
    set_length(data, 0, length, crc_ok=False)  # a flipped bit: the CRC no longer matches
    path.write_bytes(data)
    assert TFR.detect_options(str(path)) == {"message": "example"}
    message = ingest_failure(tmp_path, path, "tfrecord")
    assert message == f"{path}: at byte 0: length CRC mismatch"


@pytest.mark.parametrize("length", [2**63, 2**64 - 1, 2**40, 10_000])
@pytest.mark.parametrize("at", [0, 1])
def test_tfrecord_crc_valid_length_past_the_end(tmp_path: Path, length: int, at: int) -> None:
    path = tmp_path / "a.tfrecord"
    _, offsets = write_tfrecord(path)
    data = bytearray(path.read_bytes())
    set_length(data, offsets[at], length)
    path.write_bytes(data)
    left = len(data) - offsets[at]
    problem = f"truncated record: needs {length + 16} bytes, file has {left} left"
    assert TFR.detect_options(str(path)) == {"message": "example"}
    with pytest.raises(CorruptRecordError) as info:
        list(TFR.scan(str(path), {}))
    assert (info.value.path, info.value.offset, info.value.problem) == (
        str(path),
        offsets[at],
        problem,
    )
    assert ingest_failure(tmp_path, path, "tfrecord") == f"{path}: at byte {offsets[at]}: {problem}"


@needs_compressed
@pytest.mark.parametrize("how", ["gzip", "bz2", "xz"])
@pytest.mark.parametrize("length", [2**63, 2**40])
def test_compressed_tfrecord_crc_valid_length_past_the_end(
    tmp_path: Path, how: str, length: int
) -> None:
    plain = tmp_path / "a.tfrecord"
    _, offsets = write_tfrecord(plain)
    data = bytearray(plain.read_bytes())
    set_length(data, offsets[1], length)
    path = tmp_path / f"a.tfrecord.{how}"
    path.write_bytes({"gzip": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}[how](data))
    assert TFR.detect_options(str(path)) == {"message": "example"}
    left = len(data) - offsets[1]  # the whole stream was read, in bounded chunks
    assert ingest_failure(tmp_path, path, "tfrecord") == (
        f"{path}: at byte {offsets[1]}: truncated record: needs {length + 16} bytes, "
        f"file has {left} left"
    )


def test_tfrecord_detect_options_with_a_good_first_record(tmp_path: Path) -> None:
    path = tmp_path / "a.tfrecord"
    write_tfrecord(path)
    assert TFR.detect_options(str(path)) == {"message": "example"}
    (tmp_path / "empty.tfrecord").write_bytes(b"")
    assert TFR.detect_options(str(tmp_path / "empty.tfrecord")) == {"message": "example"}


@pytest.mark.parametrize("length", [2**63, 2**40])
def test_tfrecord_read_with_an_impossible_length(tmp_path: Path, length: int) -> None:
    """A length from a damaged (e.g. legacy) index is an error, not an allocation."""
    path = tmp_path / "a.tfrecord"
    _, offsets = write_tfrecord(path)
    source = PreadSource(path)
    try:
        for verify in (False, True):
            with pytest.raises(CorruptRecordError) as info:
                TFR.read(source, Location(offsets[1], length), verify)
            assert (info.value.path, info.value.offset) == (str(path), offsets[1])
        with pytest.raises(CorruptRecordError) as info:
            pread_exact(source, 5, length)
        assert info.value.problem.startswith(f"cannot read {length} bytes at byte 5 (")
        with pytest.raises(CorruptRecordError, match="cannot read -1 bytes at byte 5"):
            pread_exact(source, 5, -1)
        with pytest.raises(CorruptRecordError, match="length differs from the catalog"):
            TFR.read(source, Location(offsets[1], -1), verify=True)
    finally:
        source.close()


def test_read_full_asks_for_bounded_chunks(tmp_path: Path) -> None:
    data = bytes(range(256)) * 5000  # 1.28 MB: more than one chunk
    path = tmp_path / "x.gz"
    path.write_bytes(gzip.compress(data))
    with gzip.open(path, "rb") as f:  # a buffered stream would allocate 2**62 bytes at once
        assert read_full(f, 2**62) == data
    asked: list[int] = []

    class Recording(io.BytesIO):
        def read(self, size: int | None = -1) -> bytes:
            asked.append(-1 if size is None else size)
            return super().read(size)

    assert read_full(Recording(data), 2**70) == data
    assert max(asked) <= 1 << 20 and asked[-1] > 0
    assert read_full(io.BytesIO(data), 10) == data[:10]


@needs_compressed
@pytest.mark.parametrize("how", ["gzip", "bz2", "xz"])
def test_indexing_stream_reads_huge_sizes_in_bounded_chunks(tmp_path: Path, how: str) -> None:
    data = _payload_data()
    path = tmp_path / f"x.{how}"
    path.write_bytes({"gzip": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}[how](data))
    with compressed.IndexingStream(str(path), how) as stream:
        assert stream.read(10) == data[:10]
        assert stream.read(2**80) == data[10:]  # a tar base-256 size field can say 2**80
        assert stream.pos == len(data)
    with compressed.IndexingStream(str(path), how) as stream:
        assert stream.skip(2**80) == len(data)
        assert stream.read(2**63) == b""


def _tar_with_long_name(member_size: int = 3000) -> tuple[bytes, int]:
    """A GNU tar whose first member has a long name (a ``././@LongLink`` header at
    byte 0); returns it and the offset of the second sample's header."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for name, data in (("d" * 120 + "/s0.bin", b"x" * member_size), ("s1.bin", b"y" * 10)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        second = tf.getmembers()[1].offset
    return raw, second


def _set_tar_size(data: bytearray, header: int, field: bytes) -> None:
    data[header + 124 : header + 136] = field
    block = data[header : header + 512]
    block[148:156] = b" " * 8
    data[header + 148 : header + 156] = b"%06o\0 " % sum(block)


@needs_compressed
@pytest.mark.parametrize("how", ["none", "gzip", "bz2", "xz"])
@pytest.mark.parametrize(
    "size_field",
    [
        b"\x80" + (2**80).to_bytes(11, "big"),
        b"\x80" + (2**40).to_bytes(11, "big"),
        b"%012o" % (8**12 - 1),
    ],
    ids=["base256-2**80", "base256-2**40", "octal-max"],
)
@pytest.mark.parametrize("header", ["longlink", "member"])
def test_tar_size_field_past_the_end(
    tmp_path: Path, how: str, size_field: bytes, header: str
) -> None:
    raw, second = _tar_with_long_name()
    data = bytearray(raw)
    _set_tar_size(data, 0 if header == "longlink" else second, size_field)
    path = tmp_path / f"a.tar{'' if how == 'none' else '.' + how}"
    compress = {"none": bytes, "gzip": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}
    path.write_bytes(compress[how](bytes(data)))
    message = ingest_failure(tmp_path, path, "tar")
    offset = 0 if header == "longlink" else second
    assert message.startswith(f"{path}: at byte {offset}: ")
    assert "truncated" in message


def test_recordio_length_word_past_the_end(tmp_path: Path) -> None:
    path = tmp_path / "a.rec"
    with RecordIOWriter(path, idx_path=None) as w:
        offsets = [w.write(pack(IRHeader(0, float(i), i, 0), b"z" * 30)) for i in range(3)]
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, offsets[1] + 4, (1 << 29) - 1)  # whole record, 2**29 - 1 bytes
    path.write_bytes(data)
    left = len(data) - offsets[1]
    assert ingest_failure(tmp_path, path, "recordio") == (
        f"{path}: at byte {offsets[1]}: truncated record: frame needs {8 + (1 << 29)} bytes, "
        f"file has {left} left"
    )


# -- 2. library exceptions become CorruptRecordError ---------------------------------


def _source(path: Path, how: str, blob: bytes | None = None) -> compressed.CompressedSource:
    fd = os.open(path, os.O_RDONLY)
    return compressed.open_compressed_source(fd, str(path), how, lambda: blob)


@needs_compressed
def test_damaged_xz_read_is_a_corrupt_record_error(tmp_path: Path) -> None:
    data = _payload_data()
    packed = bytearray(lzma.compress(data))
    packed[len(packed) // 2] ^= 0x55
    path = tmp_path / "a.xz"
    path.write_bytes(packed)
    source = _source(path, "xz")  # python-xz raises XZError, a plain Exception
    try:
        with pytest.raises(CorruptRecordError) as info:
            source.pread(1000, len(data) - 1000)
    finally:
        source.close()
    assert (info.value.path, info.value.offset) == (str(path), len(data) - 1000)
    assert info.value.problem.startswith("xz stream is corrupt or truncated: ")


@needs_compressed
@pytest.mark.parametrize("how", ["gzip", "bz2", "xz"])
def test_truncated_compressed_source_is_a_corrupt_record_error(tmp_path: Path, how: str) -> None:
    data = _payload_data()
    compress = {"gzip": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}[how]
    packed = compress(data)
    path = tmp_path / f"a.{how}"
    path.write_bytes(packed[:10])
    try:
        source = _source(path, how)
    except CorruptRecordError as exc:  # xz: python-xz reads the index at open
        assert (exc.path, exc.offset) == (str(path), 0)
        assert exc.problem.startswith(f"cannot open the {how} stream: ")
        return
    try:
        data_read = source.pread(100, 0)
    except CorruptRecordError as exc:
        assert (exc.path, exc.offset) == (str(path), 0)
    else:
        assert data_read == b""  # indexed_gzip: a short read; the format reports it
    finally:
        source.close()


@pytest.mark.parametrize(
    ("how", "damage", "error"),
    [
        ("gzip", "flip", "zlib.error"),
        ("gzip", "cut", "EOFError"),
        ("xz", "flip", "LZMAError"),
        ("xz", "cut", "EOFError"),
        ("bz2", "flip", "OSError"),
    ],
)
def test_open_stream_errors_name_the_shard(
    tmp_path: Path, how: str, damage: str, error: str
) -> None:
    """open_stream (tar scans of compressed archives, convert, DALI export) turns the
    standard library's decompression errors into CorruptRecordError."""
    compress = {
        "gzip": lambda d: gzip.compress(d, mtime=0),
        "bz2": bz2.compress,
        "xz": lzma.compress,
    }
    packed = bytearray(compress[how](_payload_data(200_000)))
    if damage == "flip":
        packed[20] ^= 0x55  # inside the first compressed block
    else:
        del packed[len(packed) // 2 :]
    path = tmp_path / f"a.{how}"
    path.write_bytes(packed)
    with compressed.open_stream(str(path)) as f, pytest.raises(CorruptRecordError) as info:
        while f.read(4096):  # the offset is where the good bytes end
            pass
    assert info.value.path == str(path)
    assert info.value.offset >= 0
    assert info.value.problem.startswith(f"{how} stream is corrupt or truncated: ")
    if damage == "cut":  # the head of a truncated stream is still there
        assert info.value.offset > 0
        assert compressed.read_head(str(path), 512) == _payload_data(200_000)[:512]


@needs_compressed
def test_tar_scan_of_a_damaged_tar_gz(tmp_path: Path) -> None:
    raw, _ = _tar_with_long_name(200_000)
    packed = bytearray(gzip.compress(raw, mtime=0))
    packed[20] ^= 0x55
    path = tmp_path / "a.tar.gz"
    path.write_bytes(packed)
    with pytest.raises(CorruptRecordError) as info:
        list(TAR.scan(str(path), {}))
    assert info.value.path == str(path)


def _bz2_shard(tmp_path: Path) -> tuple[Path, bytes, bytes]:
    """A bz2 file of several blocks, its content and its stored seek index blob."""
    rng = random.Random(3)
    data = rng.randbytes(1_500_000) + bytes(2_000_000)
    path = tmp_path / "a.bz2"
    path.write_bytes(bz2.compress(data))
    with compressed.IndexingStream(str(path), "bz2") as stream:
        index = stream.seek_index()
    assert index is not None and index[0] == "bz2-blocks"
    return path, data, index[1]


_BZ2_PREFIX = b"SCSK1bz2\0"


@needs_compressed
def test_bz2_seek_index_round_trip(tmp_path: Path) -> None:
    path, data, blob = _bz2_shard(tmp_path)
    assert blob.startswith(_BZ2_PREFIX) and (len(blob) - len(_BZ2_PREFIX)) % 16 == 4
    legacy = blob[:-4]  # written before the CRC was added: still read
    for stored in (blob, legacy, None):
        source = _source(path, "bz2", stored)
        try:
            assert source.pread(1000, 1_200_000) == data[1_200_000:1_201_000]
        finally:
            source.close()


@needs_compressed
@pytest.mark.parametrize(
    "damage", ["flip-offset", "truncate", "odd-length", "backwards", "past-the-end", "first"]
)
def test_damaged_bz2_seek_index(tmp_path: Path, damage: str) -> None:
    path, _, blob = _bz2_shard(tmp_path)
    body = bytearray(blob[len(_BZ2_PREFIX) :])
    pairs = [struct.unpack_from("<QQ", body, i) for i in range(0, len(body) - 4, 16)]
    assert len(pairs) >= 2
    if damage == "flip-offset":  # the decompressed offset of block 1, CRC left as it was
        body[16 + 8] ^= 0x01
    elif damage == "truncate":
        del body[-7:]
    elif damage == "odd-length":  # legacy layout (no CRC) with half a pair more
        body = body[:-4] + bytes(8)
    else:
        if damage == "backwards":
            pairs[0], pairs[1] = pairs[1], pairs[0]
        elif damage == "past-the-end":
            pairs[-1] = (path.stat().st_size * 8 + 8, pairs[-1][1])
        else:
            pairs[0] = (40, 0)
        body = bytearray(b"".join(struct.pack("<QQ", *p) for p in pairs))  # legacy, no CRC
    with pytest.raises(CorruptRecordError) as info:
        source = _source(path, "bz2", _BZ2_PREFIX + bytes(body))
        try:
            source.pread(1000, 1_200_000)
        finally:
            source.close()
    assert (info.value.path, info.value.offset) == (str(path), 0)
    assert "bz2 seek index of this shard is damaged" in info.value.problem


@needs_compressed
@pytest.mark.parametrize("damage", ["zlib", "index"])
def test_damaged_gzip_seek_index(tmp_path: Path, damage: str) -> None:
    import zlib

    data = _payload_data(3_000_000)
    path = tmp_path / "a.gz"
    path.write_bytes(gzip.compress(data, mtime=0))
    with compressed.IndexingStream(str(path), "gzip") as stream:
        index = stream.seek_index()
    assert index is not None
    prefix = b"SCSK1zran\0"
    inner = bytearray(index[1][len(prefix) :])
    if damage == "zlib":
        inner[len(inner) // 2] ^= 0xFF  # zlib's Adler-32 catches it
    else:
        inner = bytearray(zlib.compress(zlib.decompress(bytes(inner))[:30]))
    with pytest.raises(CorruptRecordError) as info:
        _source(path, "gzip", prefix + bytes(inner)).close()
    assert (info.value.path, info.value.offset) == (str(path), 0)
    assert "seek index of this shard is damaged" in info.value.problem


# -- 3. catalog extract / get ---------------------------------------------------------


runner = CliRunner()


def _catalog_with(tmp_path: Path, features: dict[str, object], key: str = "k1") -> Path:
    shard = tmp_path / "s" / "a.tfrecord"
    shard.parent.mkdir()
    with TFRecordWriter(shard) as w:
        w.write(make_example({"key": key, **features}))
    catalog = tmp_path / "c.sqlite"
    with Catalog(catalog) as cat:
        cat.ingest(shard, "d").close()
    return catalog


def test_extract_feature_names_cannot_escape_the_output_dir(tmp_path: Path) -> None:
    blob = b"\xff\xfebinary" * 40  # not UTF-8: written to a .bin file
    catalog = _catalog_with(
        tmp_path,
        {"/../../pwned": blob, "..": blob + b"1", "a\0b": blob + b"2", "a/b": blob + b"3"},
        key="k\0/../x",
    )
    out = tmp_path / "deep" / "out"
    result = runner.invoke(app, ["extract", "d", "k\0/../x", "-c", str(catalog), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {
        "k__.._x_.._0.bin": blob + b"1",
        "k__.._x__.._.._pwned_0.bin": blob,
        "k__.._x_a_b_0.bin": blob + b"2",
        "k__.._x_a_b_0~2.bin": blob + b"3",  # the same name once sanitized: not overwritten
        "k__.._x_key_0.txt": b"k\0/../x",  # every bytes value is a file
    }
    assert [p for p in tmp_path.rglob("*") if p.is_file() and out not in p.parents] == [
        p for p in tmp_path.rglob("*") if p.is_file() and p.parent in (tmp_path, tmp_path / "s")
    ]
    assert not list(tmp_path.rglob("pwned*"))
    assert f"a\\x00b[0]: 321 bytes -> {out / 'k__.._x_a_b_0.bin'}" in result.output
    assert "\0" not in result.output


def test_safe_name() -> None:
    assert safe_name("/../../pwned") == "_.._.._pwned"
    assert safe_name("..") == ".."
    assert safe_name("a\0b c\x1b") == "a_b_c_"
    assert safe_name("x" * 300) == "x" * 100
    assert safe_name("ünï-cödé_1.2") == "ünï-cödé_1.2"


def test_extract_and_get_show_control_characters(tmp_path: Path) -> None:
    evil = "\x1b]0;owned\x07\x1b[2J"
    catalog = _catalog_with(
        tmp_path, {"caption": f"hi {evil}", f"n{evil}": 7, "image": b"\xff\xd8\xff"}
    )
    out = tmp_path / "out"
    result = runner.invoke(app, ["extract", "d", "k1", "-c", str(catalog), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output
    assert "caption[0] (text): hi \\x1b]0;owned\\x07\\x1b[2J" in result.output
    assert "n\\x1b]0;owned\\x07\\x1b[2J: [7]" in result.output
    # redirected (not a terminal): get writes the exact bytes
    got = runner.invoke(app, ["get", "d", "k1", "caption", "-c", str(catalog)])
    assert got.exit_code == 0 and got.stdout_bytes == f"hi {evil}".encode()
    missing = runner.invoke(app, ["get", "d", "k1", "nope", "-c", str(catalog)])
    assert missing.exit_code == 1
    assert "\x1b" not in missing.output and "n\\x1b]0;owned" in missing.output


def test_get_on_a_terminal_shows_control_characters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from shardcat.cli import records

    catalog = _catalog_with(tmp_path, {"caption": "hi \x1b[2J\x9b1m"})
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    records.get("d", "k1", "caption", catalog=catalog)
    assert capsys.readouterr().out == "hi \\x1b[2J\\x9b1m\n"
