"""RecordIO framing (dmlc-core ``recordio.h``/``recordio.cc``; the layout is in
:mod:`shardcat.formats.recordio`): walking the frames of one logical record,
joining its parts, finding the next sound record after a damaged one
(:func:`resync`), encoding a payload as dmlc's writer does, and
:class:`RecordIOWriter`, which writes ``.rec`` files and their MXNet ``.idx``."""

from __future__ import annotations

import os
import struct
from typing import IO, Any, Literal

from shardcat.errors import CorruptRecordError
from shardcat.formats.mxnet_idx import idx_path_for

__all__ = [
    "HEADER",
    "LENGTH_MASK",
    "MAGIC",
    "MAX_LENGTH",
    "Parts",
    "RecordIOWriter",
    "encode",
    "join_parts",
    "padded",
    "resync",
    "walk_frames",
]

MAGIC = 0xCED7230A
HEADER = 8  # magic + lrecord
MAX_LENGTH = (1 << 29) - 1
LENGTH_MASK = (1 << 29) - 1
FRAME = struct.Struct("<II")
_MAGIC_BYTES = struct.pack("<I", MAGIC)

Parts = list[tuple[int, int]]  # (offset of the data, length) of each frame


def padded(n: int) -> int:
    return (n + 3) & ~3


def walk_frames(buf: Any, pos: int, size: int, path: str, base: int = 0) -> tuple[int, Parts]:
    """Walk the frames of the logical record starting at ``buf[pos]``.

    Returns the end of its last frame and its parts. Offsets in errors are
    ``base + `` buffer positions; the error's offset is the record's start.
    """
    start = pos
    parts: Parts = []
    while True:
        where = "" if pos == start else f" (frame at byte {base + pos})"
        if pos + HEADER > size:
            raise CorruptRecordError(
                path,
                base + start,
                f"truncated record: frame header needs {HEADER} bytes, "
                f"file has {size - pos} left{where}",
            )
        magic, lrecord = FRAME.unpack_from(buf, pos)
        if magic != MAGIC:
            raise CorruptRecordError(
                path,
                base + start,
                f"bad RecordIO magic 0x{magic:08x}, expected 0x{MAGIC:08x}{where}",
            )
        cflag, length = lrecord >> 29, lrecord & LENGTH_MASK
        if not parts and cflag not in (0, 1):
            raise CorruptRecordError(
                path,
                base + start,
                f"record starts with continuation flag {cflag} (expected 0 = whole record "
                "or 1 = first part)",
            )
        if parts and cflag not in (2, 3):
            raise CorruptRecordError(
                path,
                base + start,
                f"multi-part record broken off: continuation flag {cflag} where a middle (2) "
                f"or last (3) part must follow{where}",
            )
        end = pos + HEADER + padded(length)
        if end > size:
            raise CorruptRecordError(
                path,
                base + start,
                f"truncated record: frame needs {end - pos} bytes, file has {size - pos} left"
                + where,
            )
        parts.append((pos + HEADER, length))
        pos = end
        if cflag in (0, 3):
            return pos, parts


def resync(buf: Any, start: int, size: int) -> int:
    """The first offset after ``start``, at 4-byte alignment, where the magic word
    starts a record whose frames walk soundly (a whole record, or a first part and
    its continuation); ``size`` when there is none. dmlc's writer cuts the aligned
    magic words out of payloads, so aligned ones start frames."""
    at = padded(start + 1)
    while True:
        at = buf.find(_MAGIC_BYTES, at)
        if at < 0:
            return size
        if at % 4 == 0:
            try:
                walk_frames(buf, at, size, "")
                return at
            except CorruptRecordError:
                pass  # a middle or last part, or a damaged record: look further
        at = padded(at + 1)


def join_parts(buf: Any, parts: Parts) -> bytes:
    """The payload of a record from its parts (re-inserting the magic word between them)."""
    if len(parts) == 1:
        offset, length = parts[0]
        return bytes(buf[offset : offset + length])
    return _MAGIC_BYTES.join(bytes(buf[o : o + n]) for o, n in parts)


def encode(payload: bytes | bytearray | memoryview) -> bytes:
    """The frames dmlc's ``RecordIOWriter::WriteRecord`` writes for one payload."""
    data = bytes(payload)
    n = len(data)
    if n > MAX_LENGTH:
        raise ValueError(f"RecordIO records must be smaller than 2**29 bytes, not {n:,}")
    out: list[bytes] = []
    done = 0
    i = data.find(_MAGIC_BYTES)
    while i != -1:
        if i % 4:  # only aligned occurrences are cut out (the word cannot overlap itself)
            i = data.find(_MAGIC_BYTES, i + 1)
            continue
        out += (FRAME.pack(MAGIC, (2 if out else 1) << 29 | (i - done)), data[done:i])
        done = i + 4
        i = data.find(_MAGIC_BYTES, done)
    out += (
        FRAME.pack(MAGIC, (3 if out else 0) << 29 | (n - done)),
        data[done:],
        bytes(padded(n) - n),
    )
    return b"".join(out)


# -- writing -------------------------------------------------------------------------


class RecordIOWriter:
    """Writes ``.rec`` files (and their ``.idx``) as MXNet's ``MXIndexedRecordIO`` does.

    ``idx_path``: ``"auto"`` (default) writes the index beside the file (same
    stem, ``.idx``), a path writes it there, None writes none. ``write``
    frames a payload exactly like dmlc's writer and adds a ``key<TAB>offset``
    line; the key defaults to the record's number (0, 1, ...), so a writer fed
    ``write(payload)`` produces what ``write_idx(i, payload)`` does.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        idx_path: str | os.PathLike[str] | Literal["auto"] | None = "auto",
    ) -> None:
        self.path = os.fspath(path)
        self.idx_path = (
            idx_path_for(self.path)
            if idx_path == "auto"
            else (None if idx_path is None else os.fspath(idx_path))
        )
        self.count = 0
        self._file: IO[bytes] = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        self._idx: IO[str] | None = None
        if self.idx_path is not None:
            try:
                self._idx = open(self.idx_path, "w", encoding="utf-8", newline="\n")  # noqa: SIM115
            except BaseException:
                self._file.close()
                raise

    def tell(self) -> int:
        """Where the next record's first frame will start."""
        return self._file.tell()

    def write(self, payload: bytes | bytearray | memoryview, key: Any = None) -> int:
        """Append one record; returns the byte offset of its first frame."""
        frames = encode(payload)
        if key is not None and self._idx is None:
            raise ValueError("this writer writes no .idx, so a key would be lost")
        text = str(self.count if key is None else key)
        if self._idx is not None and (
            not text or text != text.lstrip() or any(c in text for c in "\t\r\n")
        ):
            raise ValueError(
                f"an .idx key must be non-empty, without tabs, line breaks or leading "
                f"spaces: {text!r}"
            )
        offset = self._file.tell()
        self._file.write(frames)
        if self._idx is not None:
            self._idx.write(f"{text}\t{offset}\n")
        self.count += 1
        return offset

    def write_idx(self, key: Any, payload: bytes | bytearray | memoryview) -> int:
        """``MXIndexedRecordIO.write_idx`` argument order: key first."""
        return self.write(payload, key)

    def flush(self) -> None:
        self._file.flush()
        if self._idx is not None:
            self._idx.flush()

    def close(self) -> None:
        self._file.close()
        if self._idx is not None:
            self._idx.close()

    def __enter__(self) -> RecordIOWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
