"""Byte sources behind a shard: where a reader's ``pread`` goes, and the proof
that the bytes are those of the version the catalog indexed.

A plain shard is read with ``os.pread`` on its file descriptor. Compressed
shards (gzip, bz2, xz) are read through a source that seeks in the
decompressed stream with seek points stored in the catalog; ``open_source``
picks one.

**File identity.** The catalog records, for each indexed version of a shard,
the identity of the file it was scanned from (:class:`Identity`: size, mtime,
inode, ctime, and a fingerprint of its first and last 64 KiB). A source is
opened only when the file still matches it: size and mtime must be equal; when
inode or ctime differ too (a copy, a ``chmod``, a rewrite whose mtime was put
back with ``touch -r``), the fingerprint decides. Every read then checks the
descriptor with ``fstat`` *after* ``pread``: a write to the file updates its
mtime/ctime before any byte changes, so bytes that changed under the read are
caught. A file that was deleted or replaced (``os.replace``) while open keeps
its old bytes behind the descriptor; those still match the indexed version and
are served. Anything else is a :class:`~shardcat.errors.StaleShardError`
naming the file and what changed.

**The interface.** Every source is a :class:`Source` (declared in
:mod:`shardcat.sources.rawio`, below both this module and
:mod:`shardcat.sources.compressed`, which implements it too, so neither
imports the other's sources): ``pread(length, offset)``, ``path`` for errors,
``check()``, ``unchecked`` and ``close()``. :class:`FileSource` reads a local
file; the compressed source reads a decompressed stream; :class:`CheckedSource`
puts the file check of a :class:`FileSource` behind any other source.

**Remote shards.** A shard stored as a URL (``s3://``, ``https://``...) is read
by :class:`~shardcat.sources.remote.RemoteSource` (``pread`` is one ranged
request, conditional on the indexed ETag; sessions kept per process);
``open_source`` picks it by the URL scheme, and a compressed remote shard
decompresses from a :class:`~shardcat.sources.remote_file.RemoteFile` over it.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import crc32c as _crc32c

from shardcat.errors import CorruptRecordError, MissingShardError, ShardIOError, StaleShardError
from shardcat.sources.compressed import open_compressed_source
from shardcat.sources.rawio import OPEN_FLAGS, Source, pread_all

__all__ = [
    "CheckedSource",
    "FileSource",
    "Identity",
    "fingerprint_fd",
    "fingerprint_file",
    "iter_extents",
    "mismatch",
    "open_file",
    "open_source",
    "read_extents",
]

_FINGERPRINT_SPAN = 64 * 1024
_CHUNK = 1 << 20
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def fingerprint_fd(fd: int, size: int) -> str:
    """CRC32C of the first and last 64 KiB: cheap evidence of identical content."""
    head = os.pread(fd, _FINGERPRINT_SPAN, 0)
    tail = b""
    if size > _FINGERPRINT_SPAN:
        start = max(size - _FINGERPRINT_SPAN, _FINGERPRINT_SPAN)
        tail = os.pread(fd, size - start, start)
    return f"{_crc32c.crc32c(head):08x}{_crc32c.crc32c(tail):08x}"


def fingerprint_file(path: str, size: int) -> str:
    fd = os.open(path, OPEN_FLAGS)
    try:
        return fingerprint_fd(fd, size)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Identity:
    """The file an indexed version of a shard was scanned from (None: not recorded,
    catalogs upgraded from schema version 2 until a sync records it)."""

    size: int
    mtime_ns: int
    ino: int | None
    ctime_ns: int | None
    fingerprint: str | None


def mismatch(want: Identity, st: os.stat_result, fingerprint: Callable[[], str]) -> str | None:
    """What makes the file behind ``st`` another version than ``want``; None when it
    is that version. Size and mtime must be equal; when inode or ctime differ too (a
    copy, a ``chmod``, a rewrite with its mtime put back), ``fingerprint()`` of the
    file decides. The one rule of both the ingest's sync and the readers."""
    if st.st_size != want.size:
        return f"its size is {st.st_size} bytes, the catalog indexed {want.size}"
    if st.st_mtime_ns != want.mtime_ns:
        return "it was modified (mtime differs)"
    if (
        (st.st_ino, st.st_ctime_ns) != (want.ino, want.ctime_ns)
        and want.fingerprint is not None
        and fingerprint() != want.fingerprint
    ):
        return "its content changed (fingerprint differs)"
    return None


class _Pread(Source):
    """``pread`` on a descriptor and nothing else (a :class:`FileSource` unchecked)."""

    __slots__ = ("fd", "path")

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path

    def pread(self, length: int, offset: int) -> bytes:
        return pread_all(self.fd, length, offset)

    def close(self) -> None:
        """The descriptor belongs to the :class:`FileSource` that made this."""


class FileSource(Source):
    """An uncompressed shard: ``os.pread`` on a descriptor. With an ``identity``
    (what :func:`open_file` gives) every read is followed by the ``fstat`` check of
    the module docstring; without one it is a bare ``pread``.

    Batches read through :attr:`unchecked` and call :meth:`check` once at the end:
    one ``fstat`` covers every read before it.
    """

    def __init__(
        self,
        fd: int,
        path: str,
        identity: Identity | None = None,
        st: os.stat_result | None = None,
    ) -> None:
        self.fd = fd
        self.path = path
        self.identity = identity
        self._unchecked = _Pread(fd, path)
        self._seen = None if st is None else (st.st_mtime_ns, st.st_ctime_ns, st.st_size)

    @property
    def unchecked(self) -> Source:
        return self._unchecked

    def pread(self, length: int, offset: int) -> bytes:
        data = pread_all(self.fd, length, offset)
        if self._seen is not None:  # check() inlined: this is every single read
            st = os.fstat(self.fd)
            if (st.st_mtime_ns, st.st_ctime_ns, st.st_size) != self._seen:
                self.recheck(st)
        return data

    def check(self) -> None:
        """Raise :class:`StaleShardError` if the file is no longer the indexed version."""
        if self._seen is not None:
            st = os.fstat(self.fd)
            if (st.st_mtime_ns, st.st_ctime_ns, st.st_size) != self._seen:
                self.recheck(st)

    def recheck(self, st: os.stat_result) -> None:
        """The descriptor's file changed since the last check: still the indexed
        version (unlinked, replaced, chmod), or a :class:`StaleShardError`."""
        if self.identity is None:
            return
        problem = mismatch(self.identity, st, lambda: fingerprint_fd(self.fd, st.st_size))
        if problem is not None:
            raise StaleShardError(
                f"{self.path} changed after it was indexed: {problem}; re-ingest it "
                "(catalog ingest, or reader.rebuild_index())",
                self.path,
            )
        self._seen = (st.st_mtime_ns, st.st_ctime_ns, st.st_size)

    def close(self) -> None:
        os.close(self.fd)


class CheckedSource(Source):
    """Another source (a compressed one) whose reads are followed by the file check
    of the :class:`FileSource` it reads from; ``inner`` owns the descriptor."""

    def __init__(self, inner: Source, file: FileSource) -> None:
        self.path = inner.path
        self._inner = inner
        self._file = file

    @property
    def unchecked(self) -> Source:
        return self._inner

    def pread(self, length: int, offset: int) -> bytes:
        data = self._inner.pread(length, offset)
        self._file.check()
        return data

    def check(self) -> None:
        self._file.check()

    def close(self) -> None:
        self._inner.close()  # owns the descriptor


def open_file(path: str, identity: Identity) -> FileSource:
    """Open ``path`` if it is still the indexed version ``identity``; else
    :class:`MissingShardError` (deleted), :class:`StaleShardError` (changed) or
    :class:`ShardIOError` (cannot be opened)."""
    try:
        fd = os.open(path, OPEN_FLAGS)
    except FileNotFoundError:
        raise MissingShardError(
            f"{path} no longer exists (deleted or moved after it was indexed); "
            "re-ingest the dataset to drop it",
            path,
        ) from None
    except OSError as exc:
        raise ShardIOError(f"{path}: cannot open: {exc.strerror or exc}", path) from None
    try:
        st = os.fstat(fd)
        source = FileSource(fd, path, identity, st)
        if (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns) != (
            identity.size,
            identity.mtime_ns,
            identity.ino,
            identity.ctime_ns,
        ):
            source.recheck(st)
    except BaseException:
        os.close(fd)
        raise
    return source


def open_source(
    path: str,
    identity: Identity,
    compression: str | None,
    load_seek_index: Callable[[], bytes | None],
    storage_options: Mapping[str, Any] | None = None,
) -> Source:
    """The source for a shard's indexed version; ``load_seek_index`` fetches its seek
    points when needed. Compressed shards read in decompressed-stream offsets (see
    :mod:`shardcat.sources.compressed`). A URL is read remotely, through fsspec
    with ``storage_options`` (see :mod:`shardcat.sources.remote`)."""
    if _URL.match(path) and not path.startswith("file://"):
        from shardcat.sources.remote import RemoteSource
        from shardcat.sources.remote_file import RemoteFile

        remote = RemoteSource(
            path, identity.size, identity.mtime_ns, identity.fingerprint, storage_options
        )
        if compression is None:
            return remote
        return open_compressed_source(RemoteFile(remote), path, compression, load_seek_index)
    checked = open_file(path, identity)
    if compression is None:
        return checked
    return CheckedSource(
        open_compressed_source(checked.fd, path, compression, load_seek_index), checked
    )


@contextlib.contextmanager
def shard_to_check(
    path: str,
    size: int | None,
    storage_options: Mapping[str, Any] | None = None,
    ranges: Sequence[tuple[int, int]] = (),
) -> Iterator[Source]:
    """The uncompressed shard at ``path`` (``size`` bytes; None: asked) as a source for checking
    a legacy index's entries against it: the local file, or for a URL a remote
    source (its size checked once) that fetches the ``(offset, length)`` ``ranges``
    about to be read as few merged requests (see
    :meth:`~shardcat.sources.remote.RemoteSource.prefetch`)."""
    if _URL.match(path) and not path.startswith("file://"):
        from shardcat.sources.remote import RemoteSource, remote_info

        if size is None:
            size = remote_info(path, storage_options).size
        remote = RemoteSource(path, size, 0, None, storage_options, use_cache=False)
        try:
            remote.prefetch(ranges)
            yield remote
        finally:
            remote.close()
        return
    fd = os.open(path, OPEN_FLAGS)
    try:
        yield FileSource(fd, path)
    finally:
        os.close(fd)


def read_extents(source: Source, extents: Sequence[Sequence[int]]) -> bytes:
    """The content of a record or member stored in pieces: ``extents`` lists
    ``(offset, length)`` in content order, offset -1 for a run of zeros (a hole
    of a sparse tar member); see :func:`iter_extents`."""
    return b"".join(iter_extents(source, extents))


def iter_extents(source: Source, extents: Sequence[Sequence[int]]) -> Iterator[bytes]:
    """:func:`read_extents` in pieces of at most 1 MiB, as they are read (a hole
    too), for content too large to hold. A length past the end of the file costs
    only the bytes that exist; a short read is a :class:`CorruptRecordError`
    naming ``source.path``."""
    path = source.path
    for at, length in extents:
        if at < -1 or length < 0:
            raise CorruptRecordError(path, max(at, 0), f"bad extent ({at}, {length})")
        done = 0
        while done < length:
            n = min(_CHUNK, length - done)
            data = bytes(n) if at == -1 else source.pread(n, at + done)
            if not data:
                raise CorruptRecordError(
                    path, at, f"truncated: the file ends after {done} of {length} bytes"
                )
            yield data
            done += len(data)
