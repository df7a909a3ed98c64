"""The byte source interface (:class:`Source`) and reading bytes through it
safely, for the format modules: ``pread`` of any length (looping over the
system call), ``pread`` that treats a short read as a truncated shard and
refuses lengths no read can serve, stream reads that never allocate a length
read off damaged data, the lines of text index files, and the flags shards
are opened with (:data:`OPEN_FLAGS`: never blocking).

:class:`Source` is declared here, at the bottom of the readers' imports, so
that every source (the local file and the checked wrapper in
:mod:`shardcat.sources.local`, the decompressed stream in
:mod:`shardcat.sources.compressed`) and every format can use it without
importing one another (the one place to import it from).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

from shardcat.errors import CorruptRecordError, ShardcatError

__all__ = [
    "OPEN_FLAGS",
    "READ_CHUNK",
    "Source",
    "index_lines",
    "pread_all",
    "pread_checked",
    "pread_exact",
    "read_full",
    "unreadable",
]

# How shards are opened: read-only, not inherited by exec'd programs, and never
# blocking (a FIFO put in a shard's place would block a plain open until a writer
# came; reads of a regular file ignore O_NONBLOCK).
OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)

# The most bytes one ``read`` asks a stream for: a length read off the data is
# never handed to a stream (or allocated) as one number; reads grow with the bytes
# that really arrive.
READ_CHUNK = 1 << 20


class Source(ABC):
    """Where a shard's bytes come from: ``pread(length, offset)`` and nothing else
    a format needs. ``path`` names the shard in errors.

    Sources that can tell whether the file is still the version the catalog
    indexed do so in :meth:`check` (and after every ``pread``); a batch reads
    through :attr:`unchecked` and calls :meth:`check` once at the end. A
    source owns what it opened: :meth:`close` releases it.
    """

    #: the shard, for errors
    path: str

    @abstractmethod
    def pread(self, length: int, offset: int) -> bytes:
        """Up to ``length`` bytes from ``offset`` (fewer only at the end of the data)."""

    def check(self) -> None:
        """Raise :class:`~shardcat.errors.StaleShardError` if the file is no longer the
        indexed version (default: nothing to check)."""
        return None

    @property
    def unchecked(self) -> Source:
        """The same bytes without the per-read check (default: this source)."""
        return self

    def close(self) -> None:
        """Release what the source holds (default: nothing)."""
        return None


def pread_all(fd: int, length: int, offset: int) -> bytes:
    """``os.pread`` of ``length`` bytes at ``offset``, looping until it has them all
    or the file ends: one ``pread`` may return fewer (Linux returns at most
    2,147,479,552 bytes per call). A read that needs more than one call holds the
    pieces and their join at once, so readers stream members that large instead
    (a format's ``read_chunks``: :mod:`shardcat.readers.record_view`)."""
    data = os.pread(fd, length, offset)
    if len(data) == length or not data:
        return data
    parts = [data]
    done = len(data)
    while done < length:
        more = os.pread(fd, length - done, offset + done)
        if not more:
            break
        parts.append(more)
        done += len(more)
    return b"".join(parts)


def pread_exact(source: Source, offset: int, length: int) -> bytes:
    """``source.pread`` that treats a short read as a truncated shard."""
    data = pread_checked(source, offset, length)
    if len(data) != length:
        raise CorruptRecordError(
            source.path, offset, f"expected {length} bytes, file ends after {len(data)}"
        )
    return data


def pread_checked(source: Source, offset: int, length: int) -> bytes:
    """``source.pread(length, offset)``, where a length or offset no read can serve
    (negative, or one of 2**63 from a damaged index, which ``os.pread`` would try
    to allocate) is a :class:`CorruptRecordError` instead of ``ValueError``,
    ``OverflowError`` or ``MemoryError``. The result may be short."""
    if length < 0 or offset < 0:
        raise CorruptRecordError(
            source.path, offset, f"cannot read {length} bytes at byte {offset}"
        )
    try:
        data = source.pread(length, offset)
    except ShardcatError:
        raise
    except (OverflowError, MemoryError, ValueError) as exc:
        raise unreadable(source.path, offset, length, exc) from None
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
