"""Byte sources behind a shard: where a reader's ``pread`` goes.

A plain shard is read with ``os.pread`` on its file descriptor. Compressed
shards (gzip, bz2) are read through a source that seeks in the decompressed
stream with seek points stored in the catalog; ``open_source`` picks one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Protocol

__all__ = ["FileSource", "Source", "open_source"]


class Source(Protocol):
    def pread(self, length: int, offset: int) -> bytes: ...

    def close(self) -> None: ...


class FileSource:
    """An uncompressed shard: ``os.pread`` on a descriptor (safe to share after fork)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def pread(self, length: int, offset: int) -> bytes:
        return os.pread(self.fd, length, offset)

    def close(self) -> None:
        os.close(self.fd)


def open_source(
    fd: int, path: str, compression: str | None, load_seek_index: Callable[[], bytes | None]
) -> Source:
    """The source for a shard; ``load_seek_index`` fetches its seek points when needed.

    Compressed shards read in decompressed-stream offsets (see
    :mod:`shardcat.readers.compressed`); the source owns ``fd`` either way.
    """
    if compression is None:
        return FileSource(fd)
    from shardcat.readers.compressed import open_compressed_source

    return open_compressed_source(fd, path, compression, load_seek_index)
