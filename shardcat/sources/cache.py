"""The node-local shard cache: whole remote shards on local disk, under a size cap,
shared by every process on the node (DataLoader workers included).

Off unless configured: :func:`configure_cache` (or ``SHARDCAT_CACHE_DIR`` and
``SHARDCAT_CACHE_BYTES`` in the environment, default cap 10 GiB). A remote
source (:class:`~shardcat.sources.remote.RemoteSource`) opening a shard looks
for its cached copy first and reads it with ``os.pread`` when present; when
absent it fetches the whole object once, in the background, while its reads go
to the store, and reads locally from then on.

**Names are identities.** A cached file is named after the URL *and* the ETag
(or version, or size and mtime) the catalog indexed, so a copy of another
version is never used; its size is checked when it is opened.

**Safe for concurrent processes.** A download goes to a temporary file in the
cache directory and is renamed into place (``os.replace``: atomic, no half file
is ever visible under the final name, and two processes finishing the same
shard both succeed: no ``FileExistsError``). One process downloads a given
shard at a time (an ``flock`` on its ``.lock`` file, released by the kernel if
the process dies). Room is made under an ``flock`` on the directory's
``.lock``: least recently used copies (by mtime, touched on every open) are
deleted until the cached files, the downloads in flight (their full size
reserved up front with ``ftruncate``) and the new one fit under the cap. A
reader holding a copy that gets evicted keeps reading it (its descriptor keeps
the unlinked file). A shard larger than the cap is never cached.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["CacheConfig", "cache_config", "configure_cache", "fill", "open_cached"]

_DEFAULT_CAP = 10 << 30
_TMP = ".part"


@dataclass(frozen=True)
class CacheConfig:
    directory: str
    max_bytes: int


_config: list[CacheConfig | None] = []


def configure_cache(
    directory: str | os.PathLike[str] | None, max_bytes: int = _DEFAULT_CAP
) -> None:
    """Cache whole remote shards in ``directory`` up to ``max_bytes`` (None: off)."""
    _config[:] = [None if directory is None else CacheConfig(os.fspath(directory), int(max_bytes))]


def cache_config() -> CacheConfig | None:
    """The cache in use: :func:`configure_cache`'s, else the environment's, else None."""
    if _config:
        return _config[0]
    directory = os.environ.get("SHARDCAT_CACHE_DIR")
    if not directory:
        return None
    return CacheConfig(directory, int(os.environ.get("SHARDCAT_CACHE_BYTES", _DEFAULT_CAP)))


def _name(url: str, identity: str) -> str:
    return hashlib.sha256(f"{url}\0{identity}".encode()).hexdigest()[:40]


def open_cached(config: CacheConfig, url: str, identity: str, size: int) -> int | None:
    """A descriptor on the cached copy of this version of ``url``, or None."""
    path = os.path.join(config.directory, _name(url, identity))
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    if os.fstat(fd).st_size != size:  # not ours: never served
        os.close(fd)
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # most recently used
    return fd


@contextlib.contextmanager
def _flock(path: str, blocking: bool) -> Iterator[bool]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


def _entries(directory: str) -> list[tuple[float, int, str]]:
    """(mtime, size, path) of the cached copies and downloads in flight."""
    out = []
    for name in os.listdir(directory):
        if name.endswith(".lock"):
            continue
        path = os.path.join(directory, name)
        with contextlib.suppress(FileNotFoundError):
            st = os.stat(path)
            out.append((st.st_mtime, st.st_size, path))
    return out


def _alive(tmp: str) -> bool:
    """Whether the process that writes the download ``tmp`` still runs."""
    try:
        pid = int(tmp.rsplit(".", 3)[-3])
        os.kill(pid, 0)
    except (ValueError, IndexError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _make_room(config: CacheConfig, size: int) -> bool:
    """Evict least recently used copies until ``size`` more bytes fit (call under
    the directory lock); False when they cannot."""
    entries = []
    for entry in _entries(config.directory):
        if entry[2].endswith(_TMP) and not _alive(entry[2]):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry[2])  # a dead process's download
            continue
        entries.append(entry)
    used = sum(e[1] for e in entries)
    for _, bytes_, path in sorted(e for e in entries if not e[2].endswith(_TMP)):
        if used + size <= config.max_bytes:
            break
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            used -= bytes_
    return used + size <= config.max_bytes


def fill(
    config: CacheConfig,
    url: str,
    identity: str,
    size: int,
    fetch: Callable[[int, int], bytes],
    chunk: int,
) -> int | None:
    """Download this version of ``url`` into the cache (``fetch(start, end)``: its
    bytes, checked) unless another process is at it or it does not fit; a
    descriptor on the copy, or None."""
    if size > config.max_bytes:
        return None
    os.makedirs(config.directory, exist_ok=True)
    final = os.path.join(config.directory, _name(url, identity))
    with _flock(final + ".lock", blocking=False) as mine:
        if not mine:
            return None  # another process downloads it
        done = open_cached(config, url, identity, size)
        if done is not None:
            return done
        tmp = f"{final}.{os.getpid()}.{threading.get_ident()}{_TMP}"
        with _flock(os.path.join(config.directory, ".lock"), blocking=True):
            if not _make_room(config, size):
                return None
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            os.ftruncate(fd, size)  # reserved: other processes count it
        try:
            at = 0
            while at < size:
                data = fetch(at, min(at + chunk, size))
                os.pwrite(fd, data, at)
                at += len(data)
            os.fsync(fd)
            os.replace(tmp, final)  # atomic: no half file under the final name
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return fd
