"""Process liveness: who owns a claim or a lock, and whether that owner is gone.

One helper for every place that must tell a live owner from a dead one (the
catalog's shard claims, the storage's pending block files). An owner is the
string ``host:pid:start-time`` (:func:`owner_id`); the start time is the
process's from ``/proc/<pid>/stat`` (``?`` where there is no ``/proc``).

An owner on this host is dead (:func:`is_dead`) when its pid is gone, when it
is a zombie (killed, not yet waited for: it still answers ``kill(pid, 0)``),
or when its pid now belongs to another process (a different start time: pid
reuse). An owner on another host cannot be asked: it is dead once its claim is
older than ``lease`` seconds, or at once when the claim has no time.

Only the standard library is used here: storage imports it without the
catalog's SQL layer.
"""

from __future__ import annotations

import os
import socket
import time

__all__ = ["alive", "is_dead", "owner_id"]

_UNKNOWN = ("?", "")  # no /proc (start time not known), or an owner written without one
_OWNER: dict[int, str] = {}  # pid -> owner_id() (a forked child has another pid)


def _proc_stat(pid: int) -> tuple[str, str]:
    """(state, start time) of a process from /proc; ("?", "?") where /proc is missing."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return "?", "?"
    return fields[0].decode(), fields[19].decode()


def owner_id() -> str:
    """This process as an owner: host, pid and start time (guards pid reuse)."""
    pid = os.getpid()
    found = _OWNER.get(pid)
    if found is None:
        found = _OWNER[pid] = f"{socket.gethostname()}:{pid}:{_proc_stat(pid)[1]}"
    return found


def _parse(owner: str) -> tuple[str, int | None, str]:
    """(host, pid or None when unreadable, start time) of an owner string."""
    host, _, rest = owner.partition(":")
    pid_text, _, started = rest.partition(":")
    return host, int(pid_text) if pid_text.isdigit() else None, started


def _local_is_dead(pid: int, started: str) -> bool:
    """Whether process ``pid`` of this host, started at ``started``, is gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, owned by another user
    state, now_started = _proc_stat(pid)
    # a zombie (killed, not yet waited for) is dead; a new start time means pid reuse
    return state in ("Z", "X") or (started not in _UNKNOWN and started != now_started)


def is_dead(owner: str | None, claimed_at: float | None, lease: float) -> bool:
    """Whether the claim of ``owner``, taken at ``claimed_at`` (epoch seconds), is dead.

    No owner: dead. This host: dead when the process is gone, a zombie, or its
    pid was reused. Another host: dead after ``lease`` seconds (at once
    without ``claimed_at``). An unreadable owner is dead.
    """
    if not owner:
        return True
    host, pid, started = _parse(owner)
    if host != socket.gethostname():
        return claimed_at is None or time.time() - claimed_at > lease
    if pid is None:
        return True
    return _local_is_dead(pid, started)


def alive(owner: str | None) -> bool:
    """Whether ``owner`` is a live process of this host (another host's never counts as alive).

    For owners that record no time (storage's pending block files): a process
    elsewhere cannot be asked, so what it owns is treated as abandoned, as a
    claim without a time is in :func:`is_dead`.
    """
    return not is_dead(owner, None, 0.0)
