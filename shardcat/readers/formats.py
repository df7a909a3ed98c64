"""The container-format interface and its registry.

A format is one module in ``shardcat.readers`` that knows bytes on disk and
nothing about SQL. It provides:

- ``NAME``, ``TITLE`` (for messages) and ``EXTENSIONS``;
- ``sniff(head: bytes) -> bool``: whether a file starting with ``head`` is in
  this format (formats are detected from content, extensions only break ties);
- ``detect_options(path) -> dict``: dataset options read off the first shard;
- ``scan(path, options) -> Iterator[Entry]``: walk one shard once, verifying
  framing and checksums, yielding one :class:`Entry` per record;
- ``key_rule(options) -> str``: how the dataset's records are keyed
  (``"position"`` for position keys; any other text is recorded as is);
- ``read(source, path, offset, length, verify) -> bytes``: one record's (or
  member's) payload through ``source.pread`` (a file descriptor's ``os.pread``
  for plain shards, a seekable decompressed stream for compressed ones);
- ``decode(raw, options)``: the user-facing record;
- ``PARTS``: True when records are made of separately stored members (tar:
  ``Entry.members``); a reader then reads one member per feature, and the
  record is ``{feature: bytes}``;
- ``feature_list(record, name) -> Sequence | None`` (no copy needed),
  ``describe(record) -> dict[str, str]`` (feature name -> type name) and
  ``features(record) -> dict[str, list]`` (feature name -> all its values);
- optional ``scan_stream(stream, path, options) -> Iterator[Entry]``: ``scan``
  over a binary stream read sequentially; formats that have it can be read
  from gzip/bz2/xz-compressed shards (ingest hands them the decompressed
  stream, which records seek points; offsets are decompressed offsets, see
  :mod:`shardcat.readers.compressed`);
- optional ``dali_index_lines(entries, options) -> Iterator[str]``: the lines
  (without newlines) of the DALI index file for one shard, given its
  :class:`Entry` rows in file order (``members`` filled for ``PARTS``
  formats); ``catalog export-index`` uses it.

- optional ``detect_dataset_options(files, given) -> dict``: options of a new
  dataset that only all its shards tell (RecordIO: ``.idx`` keys colliding
  across shards key the dataset by position); called once, when the dataset
  is created;
- optional ``field_types(options) -> dict[str, str]``: SQL columns (name ->
  ``integer``/``real``/``text``) every dataset with these options has, NULL
  where a record has no value (RecordIO's IRHeader columns).

Adding a format means adding its module and one line in ``_MODULES``.
"""

from __future__ import annotations

import importlib
import math
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

from shardcat.errors import CatalogError, CorruptRecordError, ShardcatError

__all__ = ["Entry", "Format", "detect_format", "get_format", "known_formats"]

# Scalar values that become SQL columns of a dataset's view.
Scalar = int | float | str


@dataclass(slots=True)
class Entry:
    """One record found by ``scan``.

    ``key`` is None for datasets keyed by position. ``members`` lists
    ``(feature, offset, length)`` for formats whose records are made of
    separately stored parts (tar samples); it stays empty for the others. A
    member stored in pieces adds a fourth item, its extents: ``((offset,
    length), ...)`` in content order, offset -1 for zeros (sparse tar members).
    """

    key: str | None
    offset: int
    length: int
    fields: dict[str, Scalar] = field(default_factory=dict)
    members: list[tuple[Any, ...]] = field(default_factory=list)


class Format(Protocol):
    NAME: str
    TITLE: str
    EXTENSIONS: tuple[str, ...]
    PARTS: bool

    def sniff(self, head: bytes) -> bool: ...

    def detect_options(self, path: str) -> dict[str, Any]: ...

    def scan(self, path: str, options: Mapping[str, Any]) -> Iterator[Entry]: ...

    def key_rule(self, options: Mapping[str, Any]) -> str: ...

    def read(self, source: Any, path: str, offset: int, length: int, verify: bool) -> bytes: ...

    def decode(self, raw: bytes, options: Mapping[str, Any]) -> Any: ...

    def feature_list(self, record: Any, name: str) -> Sequence[Any] | None: ...

    def describe(self, record: Any) -> dict[str, str]: ...

    def features(self, record: Any) -> dict[str, list[Any]]: ...


_MODULES = {
    "tfrecord": "shardcat.readers.tfrecord",
    "recordio": "shardcat.readers.recordio",
    "tar": "shardcat.readers.tar",
}

SNIFF_BYTES = 512


def known_formats() -> list[str]:
    return sorted(_MODULES)


def get_format(name: str) -> Format:
    """The format module registered under ``name`` (imported on first use)."""
    try:
        module: ModuleType = importlib.import_module(_MODULES[name])
    except KeyError:
        raise CatalogError(
            f"unknown format {name!r}; known formats: {', '.join(known_formats())}"
        ) from None
    return module  # type: ignore[return-value]


def detect_format(path: str) -> str:
    """Name of the format of the file at ``path``, from its first bytes (of the
    decompressed content for gzip/bz2/xz-compressed files)."""
    from shardcat.readers.compressed import read_head

    head = read_head(path, SNIFF_BYTES)
    matches = [name for name in known_formats() if get_format(name).sniff(head)]
    if len(matches) > 1:
        ext = [n for n in matches if path.endswith(get_format(n).EXTENSIONS)]
        matches = ext or matches
    if not matches:
        if not head:
            ext_match = [n for n in known_formats() if path.endswith(get_format(n).EXTENSIONS)]
            if ext_match:
                return ext_match[0]
        raise CatalogError(
            f"{path}: cannot tell the container format from its first {len(head)} bytes; "
            f"pass format= (one of {', '.join(known_formats())})"
        )
    return matches[0]


# The most bytes one ``read`` asks a stream for: a length read off the data is
# never handed to a stream (or allocated) as one number; reads grow with the bytes
# that really arrive.
READ_CHUNK = 1 << 20


def pread_exact(source: Any, path: str, offset: int, length: int) -> bytes:
    """``source.pread`` that treats a short read as a truncated shard."""
    data = pread_checked(source, path, offset, length)
    if len(data) != length:
        raise CorruptRecordError(
            path, offset, f"expected {length} bytes, file ends after {len(data)}"
        )
    return data


def pread_checked(source: Any, path: str, offset: int, length: int) -> bytes:
    """``source.pread(length, offset)``, where a length or offset no read can serve
    (negative, or one of 2**63 from a damaged index, which ``os.pread`` would try
    to allocate) is a :class:`CorruptRecordError` instead of ``ValueError``,
    ``OverflowError`` or ``MemoryError``. The result may be short."""
    if length < 0 or offset < 0:
        raise CorruptRecordError(path, offset, f"cannot read {length} bytes at byte {offset}")
    try:
        data: bytes = source.pread(length, offset)
    except ShardcatError:
        raise
    except (OverflowError, MemoryError, ValueError) as exc:
        raise unreadable(path, offset, length, exc) from None
    return data


def unreadable(path: str, offset: int, length: int, exc: BaseException) -> CorruptRecordError:
    """The error for a read of ``length`` bytes at ``offset`` that ``exc`` refused."""
    return CorruptRecordError(
        path, offset, f"cannot read {length} bytes at byte {offset} ({type(exc).__name__})"
    )


def read_full(stream: Any, size: int) -> bytes:
    """``size`` bytes from ``stream.read``, calling it until it has them all or it
    returns nothing (the end of the stream): fewer only at the end.

    The stream is asked for at most :data:`READ_CHUNK` bytes at a time, so a
    huge ``size`` read off damaged data costs only the bytes that exist (a
    buffered stream would allocate the whole ``size`` up front).
    """
    parts = []
    while size > 0:
        chunk = stream.read(min(size, READ_CHUNK))
        if not chunk:
            break
        parts.append(chunk)
        size -= len(chunk)
    return b"".join(parts)


_F32 = struct.Struct("<f")


def float32_shortest(value: float) -> float:
    """The shortest decimal that rounds to the same float32 (0.1 for float32(0.1)).

    A float32 has 6 to 9 significant decimal digits; ``g`` formatting drops
    trailing zeros, so 6 digits already give ``0.1`` or ``3.1``.
    """
    if value.is_integer() or not math.isfinite(value):
        return value
    for digits in (6, 7, 8, 9):
        text = float(f"{value:.{digits}g}")
        if _F32.unpack(_F32.pack(text))[0] == value:
            return text
    return value


def index_lines(path: str) -> Iterator[tuple[int, str]]:
    """(byte offset, stripped text) of each non-empty line of a text index file
    (MXNet ``.idx``, DALI ``tfrecord2idx``...); a line that is not UTF-8 raises
    :class:`CorruptRecordError` with its offset."""
    at = 0
    with open(path, "rb") as f:
        for raw in f:
            line_at, at = at, at + len(raw)
            try:
                text = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise CorruptRecordError(path, line_at, "index line is not UTF-8") from None
            if text:
                yield line_at, text
