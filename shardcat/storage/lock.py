"""The writer lock of a storage directory, and who owns what a writer leaves behind.

One writer at a time: a writable open takes an exclusive ``flock`` on the
directory (:func:`acquire`), held until it closes (:func:`release`). The
kernel drops a ``flock`` when its holder exits, so a killed writer's lock is
free at once, zombie or not. A forked child closes its copies of the parent's
lock descriptors, so the lock dies with the parent, not with the last child.

Where the filesystem has no ``flock`` (some network filesystems),
:func:`acquire` returns None: commits still check the storage's ``version``,
and the block files a writer reserved are recorded with their owner, so the
next writer deletes only those whose owner is gone (the liveness rule of
:mod:`shardcat.catalog.processes`, the same as the catalog's claims).
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

from shardcat.catalog.engine import fork_generation
from shardcat.errors import StorageBusyError

__all__ = ["acquire", "release"]

_LOCKS: set[int] = set()  # this process's writer locks (directory fds)


def acquire(directory: Path) -> int | None:
    """An exclusive ``flock`` on ``directory`` (None where the filesystem has none).

    Raises :class:`~shardcat.errors.StorageBusyError` while another writer holds it.
    """
    if fcntl is None:  # pragma: no cover - not POSIX
        return None
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StorageBusyError(
            errno.EWOULDBLOCK,
            f"{directory} is open for writing elsewhere (one writer at a time)",
        ) from None
    except OSError:  # e.g. some network filesystems: commits still check the version
        os.close(fd)
        return None
    _LOCKS.add(fd)
    return fd


def release(fd: int, generation: int) -> None:
    """Release the lock ``fd`` taken in fork generation ``generation`` (not a forked copy)."""
    if generation == fork_generation():  # a forked child closed its copy already
        _LOCKS.discard(fd)
        os.close(fd)


def _drop_inherited_locks() -> None:
    """In a forked child: close the parent's lock fds, so they die with the parent's."""
    for fd in _LOCKS:
        with contextlib.suppress(OSError):
            os.close(fd)
    _LOCKS.clear()


os.register_at_fork(after_in_child=_drop_inherited_locks)
