"""A remote shard as a file: :class:`RemoteFile`, a read-only file object for the
decompressors of compressed remote shards (``.tar.gz``, GZIP TFRecords...: they
seek to a stored seek point and read on from there, and each such run costs one
request of :data:`WINDOW` bytes rather than a download from the start), and
:func:`download` / :func:`downloaded`, a whole object streamed once into a local
file (what ingest scans, what convert reads)."""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

from shardcat.sources.remote import (
    STREAM_CHUNK,
    RemoteInfo,
    RemoteSource,
    listed_info,
    remote_info,
)

__all__ = ["WINDOW", "RemoteFile", "download", "downloaded"]


#: how much a compressed remote shard's file reads per request, from where the
#: decompressor seeks (its nearest seek point)
WINDOW = 1 << 20


class RemoteFile(io.RawIOBase):
    """A read-only file over a :class:`RemoteSource` for the decompressors of
    compressed shards: after a seek, one request of :data:`WINDOW` bytes (or what
    a read asks, if more) serves the reads that follow."""

    def __init__(self, source: RemoteSource) -> None:
        super().__init__()
        self.source = source
        self.size = source.size
        self._pos = 0
        self._buf = b""
        self._buf_at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            size = self.size - self._pos
        end = min(self._pos + size, self.size)
        if end <= self._pos:
            return b""
        if not (self._buf_at <= self._pos and end <= self._buf_at + len(self._buf)):
            stop = min(max(end, self._pos + WINDOW), self.size)
            self._buf, self._buf_at = self.source.fetch(self._pos, stop), self._pos
        data = self._buf[self._pos - self._buf_at : end - self._buf_at]
        self._pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def fileno(self) -> int:
        raise OSError("a remote shard has no file descriptor")

    def close(self) -> None:
        self._buf = b""
        super().close()


def download(
    url: str, target: str, options: Mapping[str, Any] | None = None, limit: int | None = None
) -> RemoteInfo:
    """Stream the object (its first ``limit`` bytes) into the local file ``target``
    with large sequential reads, one pass; returns the identity of the version read
    (every chunk is conditional on the ETag of the first)."""
    info = listed_info(url) or remote_info(url, options)
    source = RemoteSource(url, info.size, info.mtime_ns, info.fingerprint, options, use_cache=False)
    end = info.size if limit is None else min(limit, info.size)
    with open(target, "wb") as f:
        at = 0
        while at < end:
            stop = min(at + STREAM_CHUNK, end)
            f.write(source.fetch(at, stop))
            at = stop
    return info


@contextlib.contextmanager
def downloaded(
    url: str, options: Mapping[str, Any] | None = None, limit: int | None = None
) -> Iterator[tuple[str, RemoteInfo]]:
    """:func:`download` into a temporary file (named after the object), deleted on exit:
    ``(its path, the identity of the version read)``."""
    fd, tmp = tempfile.mkstemp(prefix="shardcat-", suffix="-" + url.rsplit("/", 1)[-1][-60:])
    os.close(fd)
    try:
        yield tmp, download(url, tmp, options, limit)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
