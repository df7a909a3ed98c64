"""The one-pass gzip indexer (``shardcat.sources._inflate``) against the two-pass
fallback (Python's gzip, then indexed_gzip's ``build_full_index``): same bytes, same
seek points, same reads through the stored index, same errors on damaged input."""

from __future__ import annotations

import gzip
import os
import random
import struct
import zlib
from pathlib import Path

import pytest

from shardcat import Catalog, CorruptRecordError
from shardcat.formats.tfrecord import TFRecordWriter, make_example
from shardcat.sources import compressed
from shardcat.testing.required import CI, need, needs

need("indexed_gzip", why="shardcat[compressed]")
native = needs(compressed._INFLATE is not None, "the _inflate extension is built", extra=False)
_PREFIX = b"SCSK1zran\0"


def test_extension_is_built_on_ci():
    """CI must not silently fall back to the two-pass path."""
    if not CI:
        pytest.skip("only on CI")
    assert compressed._INFLATE is not None, "CI=true but shardcat.sources._inflate did not build"


def _text(size: int, seed: int) -> bytes:
    """Compressible words with a stretch of random bytes (stored blocks) in the middle."""
    rng = random.Random(seed)
    words = [bytes(rng.choices(b"abcdefghij", k=rng.randint(1, 8))) for _ in range(400)]
    text = b" ".join(rng.choices(words, k=size // 4))[:size]
    half = len(text) // 2
    return text[:half] + rng.randbytes(min(size // 10, 2 << 20)) + text[half:]


@pytest.fixture(scope="module")
def data_20mb() -> bytes:
    return _text(20_000_000, 1)


def _write(path: Path, data: bytes, level: int, members: int) -> None:
    step = max(1, len(data) // members)
    parts = [data[i * step : (i + 1) * step] for i in range(members - 1)]
    parts.append(data[(members - 1) * step :])
    path.write_bytes(b"".join(gzip.compress(part, level) for part in parts))


def _ingest(path: Path, fallback: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, bytes]:
    """(decompressed bytes, seek index blob) of one IndexingStream pass."""
    with monkeypatch.context() as patch:
        if fallback:
            patch.setattr(compressed, "_INFLATE", None)
        with compressed.IndexingStream(str(path), "gzip") as stream:
            assert stream._native is (not fallback)
            parts = []
            while chunk := stream.read(3 << 20):
                parts.append(chunk)
            index = stream.seek_index()
    assert index is not None and index[0] == "zran"
    return b"".join(parts), index[1]


def _points(blob: bytes) -> list[tuple[int, int, int, int]]:
    raw = zlib.decompress(blob[len(_PREFIX) :])
    assert raw[:6] == b"GZIDX\x01"
    (count,) = struct.unpack_from("<I", raw, 31)
    return [struct.unpack_from("<QQBB", raw, 35 + 18 * i) for i in range(count)]


def _source(path: Path, blob: bytes) -> compressed.CompressedSource:
    fd = os.open(path, os.O_RDONLY)
    return compressed.open_compressed_source(fd, str(path), "gzip", lambda: blob)


@native
@pytest.mark.parametrize("size", ["tiny", "empty", "20mb"])
@pytest.mark.parametrize("members", [1, 3])
@pytest.mark.parametrize("level", [1, 9])
def test_reads_through_both_indexes_agree(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    data_20mb: bytes,
    size: str,
    members: int,
    level: int,
):
    data = {"tiny": b"hello, gzip " * 9, "empty": b"", "20mb": data_20mb}[size]
    path = tmp_path / "x.gz"
    _write(path, data, level, members)
    got_native, blob_native = _ingest(path, False, monkeypatch)
    got_fallback, blob_fallback = _ingest(path, True, monkeypatch)
    assert got_native == got_fallback == data
    points = _points(blob_native)
    # the same points build_full_index makes: member starts, blocks every 1 MiB, the end
    assert points == _points(blob_fallback)
    if size == "20mb":
        assert len(points) >= 18  # 22 MB
    assert sum(1 for p in points if p[3] == 0) == members  # member starts have no window
    rng = random.Random(level * 10 + members)
    a, b = _source(path, blob_native), _source(path, blob_fallback)
    try:
        for _ in range(200 if size == "20mb" else 20):
            offset = rng.randrange(len(data) + 1)
            length = rng.choice([1, 100, 5000, 300_000])
            expected = data[offset : offset + length]
            assert a.pread(length, offset) == expected
            assert b.pread(length, offset) == expected
    finally:
        a.close()
        b.close()


def _tfrecord_gz(path: Path, n: int) -> None:
    plain = path.with_suffix(".plain")
    with TFRecordWriter(plain) as w:
        for i in range(n):
            w.write(make_example({"key": f"k{i:05d}", "image": os.urandom(300), "label": i % 7}))
    path.write_bytes(gzip.compress(plain.read_bytes(), 6))


def test_fallback_ingest_gives_the_same_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Without the extension (forced), ingest still works: same rows, a readable index."""
    path = tmp_path / "data" / "train.tfrecord"
    path.parent.mkdir()
    _tfrecord_gz(path, 6000)  # ~2 MB decompressed: more than one seek point
    query = 'SELECT key, "offset", length FROM shardcat_records_1 ORDER BY key'
    results = []
    for fallback in (False, True):
        with monkeypatch.context() as patch:
            if fallback or compressed._INFLATE is None:
                patch.setattr(compressed, "_INFLATE", None)
            with Catalog(tmp_path / f"c{fallback}.sqlite") as cat:
                with cat.ingest(path, "t") as reader:
                    assert reader.get_feature("k05999", "label") == 5999 % 7
                    assert reader.get_feature("k00003", "label") == 3
                    rows = cat.store.reader_connection().execute(query).fetchall()
                    (blob,) = (
                        cat.store.reader_connection()
                        .execute("SELECT data FROM shardcat_seek_indexes")
                        .fetchone()
                    )
                results.append((rows, _points(blob)))
    assert len(results[0][0]) == 6000
    assert results[0] == results[1]
    assert len(results[0][1]) >= 3


def _damage(good: bytes, how: str) -> bytes:
    if how == "truncated":
        return good[: len(good) * 2 // 3]
    if how == "flipped":
        bad = bytearray(good)
        bad[len(good) // 2] ^= 0x55
        return bytes(bad)
    if how == "crc":
        return good[:-8] + bytes(b ^ 0xFF for b in good[-8:-4]) + good[-4:]
    if how == "isize":
        (isize,) = struct.unpack("<I", good[-4:])
        return good[:-4] + struct.pack("<I", isize + 1)
    if how == "garbage":
        return good + b"junk after the member"
    if how == "gzip-magic-garbage":
        return good + b"\x1f\x8b\x08"
    raise AssertionError(how)


def _error_of(path: Path, fallback: bool, monkeypatch: pytest.MonkeyPatch) -> CorruptRecordError:
    with pytest.raises(CorruptRecordError) as err:
        _ingest(path, fallback, monkeypatch)
    return err.value


@native
@pytest.mark.parametrize(
    "how", ["truncated", "flipped", "crc", "isize", "garbage", "gzip-magic-garbage"]
)
def test_damaged_input_is_the_same_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data_20mb: bytes, how: str
):
    data = data_20mb[:6_000_000]
    path = tmp_path / "bad.gz"
    path.write_bytes(_damage(gzip.compress(data, 6), how))
    fast = _error_of(path, False, monkeypatch)
    slow = _error_of(path, True, monkeypatch)
    assert type(fast) is type(slow) is CorruptRecordError
    assert fast.path == slow.path == str(path)
    assert "gzip stream is corrupt or truncated" in str(fast)
    # decompressed offsets; the fallback's is where its last whole 4 MiB read ended,
    # the extension's where the good bytes end (it hands those over first)
    assert slow.offset <= fast.offset
    if how != "flipped":  # damaged deflate data may decode to other bytes before the check
        assert fast.offset <= len(data)
    if how in ("crc", "isize", "garbage", "gzip-magic-garbage"):
        assert fast.offset == len(data)  # every byte was good; the check after them failed


@native
def test_zero_padding_after_a_member_is_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Like Python's gzip module (and gzip(1)), zero bytes after a member are padding."""
    data = _text(200_000, 2)
    path = tmp_path / "padded.gz"
    path.write_bytes(gzip.compress(data) + bytes(1000) + gzip.compress(b"tail") + bytes(7))
    got_native, blob_native = _ingest(path, False, monkeypatch)
    got_fallback, blob_fallback = _ingest(path, True, monkeypatch)
    assert got_native == got_fallback == data + b"tail"
    assert _points(blob_native) == _points(blob_fallback)
    source = _source(path, blob_native)
    try:
        assert source.pread(10, len(data) - 6) == data[-6:] + b"tail"
    finally:
        source.close()
