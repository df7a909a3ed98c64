"""Process liveness and lifetime: who owns a claim or a lock, whether that owner is
gone, and how shardcat's worker processes end.

One helper for every place that must tell a live owner from a dead one (the
catalog's shard claims, the storage's pending block files). An owner is the
string ``host:pid:start-time`` (:func:`owner_id`); the start time is the
process's from ``/proc/<pid>/stat`` (``?`` where there is no ``/proc``).

An owner on this host is dead (:func:`is_dead`) when its pid is gone, when it
is a zombie (killed, not yet waited for: it still answers ``kill(pid, 0)``),
or when its pid now belongs to another process (a different start time: pid
reuse). An owner on another host cannot be asked: it is dead once its claim is
older than ``lease`` seconds, or at once when the claim has no time.

Lifetime: while shardcat works (an ingest, a conversion), SIGTERM and SIGHUP
stop it as Ctrl-C does (:func:`stopping_on_signals` raises :class:`Stopped`, a
``KeyboardInterrupt``, so every cleanup runs and claims are given back), and
its forked workers end with it, also when it is killed outright
(:func:`end_with_parent`).

Only the standard library is used here: storage imports it without the
catalog's SQL layer.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = [
    "START_METHOD_ENV",
    "STOP_SIGNALS",
    "Stopped",
    "TurnLock",
    "alive",
    "end_with_parent",
    "fork_hazards",
    "holder",
    "interruption",
    "is_dead",
    "owner_id",
    "stopping_on_signals",
    "stops_held",
    "tag_of",
    "worker_start_method",
]

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
    """(host, pid or None when unreadable, start time) of an owner string (a
    :func:`tag_of` after them is left out)."""
    host, _, rest = owner.partition(":")
    pid_text, _, rest = rest.partition(":")
    started = rest.partition(":")[0]
    return host, int(pid_text) if pid_text.isdigit() else None, started


def tag_of(owner: str | None) -> str:
    """What follows ``host:pid:start-time`` in an owner (``host:pid:start-time:tag``),
    else ``""``: one task attempt of a Ray ingest names itself there, as one process
    runs many attempts (see :mod:`shardcat.facade.ray_ingest`)."""
    return (owner or "").split(":", 3)[3] if (owner or "").count(":") >= 3 else ""


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


def holder(owner: str) -> str:
    """An owner as people name a process: ``host:pid``."""
    host, pid, _ = _parse(owner)
    return f"{host}:{pid if pid is not None else '?'}"


def alive(owner: str | None) -> bool:
    """Whether ``owner`` is a live process of this host (another host's never counts as alive).

    For owners that record no time (storage's pending block files): a process
    elsewhere cannot be asked, so what it owns is treated as abandoned, as a
    claim without a time is in :func:`is_dead`.
    """
    return not is_dead(owner, None, 0.0)


# -- lifetime ----------------------------------------------------------------------

#: The signals that stop shardcat's work as Ctrl-C (SIGINT) does.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_WATCH_SECONDS = 0.5
_AGAIN_SECONDS = 0.05


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived (``signum``): the work stops as on Ctrl-C.

    ``exit_code`` is the shell's code for that signal (143, 129).
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


_stopped_by: list[int] = []  # the stop signals that arrived (see interruption())
_held: list[int] = []  # the stop signals that came while held (see stops_held())
_holding = threading.local()


_taker: list[int] = []  # the pid whose stopping_on_signals took the stop signals


def _raise_stopped(signum: int, frame: Any) -> None:
    if _taker and os.getpid() != _taker[-1]:  # a child forked before it set its own
        _exit_on(signum, frame)
    _stopped_by.append(signum)
    if getattr(_holding, "depth", 0):
        _held.append(signum)
        return
    raise Stopped(signum)


@contextlib.contextmanager
def stops_held() -> Iterator[None]:
    """A stop signal that comes in here is raised at its end instead (around a fork:
    a stop between the fork and noting the child would leave a worker nobody stops)."""
    _holding.depth = getattr(_holding, "depth", 0) + 1
    try:
        yield
    finally:
        _holding.depth -= 1
        if not _holding.depth and _held:
            signum = _held[-1]
            _held.clear()
            raise Stopped(signum)


def interruption() -> KeyboardInterrupt:
    """The interruption to raise where one was swallowed (sqlite3 drops what its
    callbacks raise): :class:`Stopped` when a stop signal arrived, else Ctrl-C's."""
    return Stopped(_stopped_by[-1]) if _stopped_by else KeyboardInterrupt()


@contextlib.contextmanager
def stopping_on_signals(*, exit_after: bool = True) -> Iterator[None]:
    """For the duration, SIGTERM and SIGHUP raise :class:`Stopped` in this process
    (as SIGINT raises ``KeyboardInterrupt``), so the work unwinds: workers stopped,
    claims given back. Only signals left at their default are taken, and only in
    the main thread (a program's own handlers stay as they are).

    ``exit_after``: a :class:`Stopped` of a signal taken here ends the process once
    it has unwound to here, as that signal would have at once (``SystemExit``
    with 128 + the signal number). Without it, the :class:`Stopped` goes on.
    """
    taken = []
    if threading.current_thread() is threading.main_thread():
        taken = [s for s in STOP_SIGNALS if signal.getsignal(s) is signal.SIG_DFL]
    if not taken:
        yield
        return
    for sig in taken:
        signal.signal(sig, _raise_stopped)
    _stopped_by.clear()
    _taker.append(os.getpid())
    hook = sys.unraisablehook

    def swallowed(unraisable: Any) -> None:
        # Raised where Python cannot raise (a __del__, a GC callback): delivered again
        # in a moment, from another thread, once this code is left
        if isinstance(unraisable.exc_value, Stopped):
            again = threading.Timer(
                _AGAIN_SECONDS, os.kill, (os.getpid(), unraisable.exc_value.signum)
            )
            again.daemon = True
            again.start()
        else:
            hook(unraisable)

    sys.unraisablehook = swallowed
    try:
        yield
    except Stopped as exc:
        if exit_after and exc.signum in taken:
            raise SystemExit(exc.exit_code) from exc
        raise
    finally:
        sys.unraisablehook = hook
        _taker.pop()
        for sig in taken:
            signal.signal(sig, signal.SIG_DFL)


def _exit_on(signum: int, frame: Any) -> None:
    """A worker's end on a stop: its cleanups run (``SystemExit``), silently: the
    parent says the one line, and a stop that lands in a finalizer or in
    multiprocessing's start-up would print a traceback to the shared stderr."""
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    raise SystemExit(128 + signum)


def _parent_death_signal(signum: int) -> bool:
    """Ask Linux to send ``signum`` to this process when its parent ends."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes  # (in forked workers only: not on the import path of every command)

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int, started: str) -> None:
    while not _local_is_dead(parent, started):
        time.sleep(_WATCH_SECONDS)
    os.kill(os.getpid(), signal.SIGTERM)


def end_with_parent(parent: int) -> None:
    """In a worker started by process ``parent``: SIGINT, SIGTERM and SIGHUP end it
    with ``SystemExit`` (128 + the signal: its cleanups run, no traceback; the
    parent gives its claims back; a signal the parent ignored stays ignored), and
    so does the end of its parent, however it ended (SIGKILL too): Linux sends
    SIGTERM then (``PR_SET_PDEATHSIG``) to a forked worker; elsewhere, and in a
    worker a fork server started (whose parent is that server), a thread watching
    the parent's pid does. A parent gone already ends it at once."""
    for sig in (signal.SIGINT, *STOP_SIGNALS):
        if signal.getsignal(sig) is not signal.SIG_IGN:  # nohup, background jobs: kept
            signal.signal(sig, _exit_on)
    started = _proc_stat(parent)[1]
    if not (os.getppid() == parent and _parent_death_signal(signal.SIGTERM)):
        threading.Thread(target=_watch_parent, args=(parent, started), daemon=True).start()
    _holding.depth = 0  # (forked while its parent held stops)
    if _held:  # stopped already, between the fork and here
        raise SystemExit(128 + _held[-1])
    if _local_is_dead(parent, started):
        raise SystemExit(128 + signal.SIGTERM)


def fork_hazards() -> list[str]:
    """What makes forking this process unsafe, named (empty: it is safe). A fork
    copies the calling thread only, with every lock the others held at that moment:
    Python threads other than the caller (but :func:`_fork_aware` ones), Ray
    (initialized, or left behind by ``ray.shutdown()``: its gRPC threads keep
    running) and gRPC's threads, whose state a child must not use."""
    me = threading.current_thread()
    found = sorted(
        t.name for t in threading.enumerate() if t is not me and t.is_alive() and not _fork_aware(t)
    )
    hazards = [f"threads {', '.join(found)}"] if found else []
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", bool)():
        hazards.append("Ray is initialized")
    if any(name.startswith("grpc") for name in _native_thread_names()):
        hazards.append("gRPC's threads run (Ray, after ray.shutdown() too)")
    return hazards


def _native_thread_names() -> list[str]:
    """The kernel's name of each thread of this process (none where /proc is missing)."""
    names = []
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
    return names


def _fork_aware(thread: threading.Thread) -> bool:
    """Whether a thread is no fork hazard: shardcat's own idle pools (named
    ``shardcat-...``), fsspec's IO loop (``fsspecIO``) and its loop's executor
    threads (fsspec replaces that loop in a forked child), and rich's refresh of
    the CLI's progress bar (it only redraws that bar, which no worker touches)."""
    return (
        thread.name.startswith(("shardcat", "fsspecIO"))
        or type(thread).__module__ == "rich.live"
        or thread in _fsspec_executor_threads()
    )


def _fsspec_executor_threads() -> set[threading.Thread]:
    """The threads of fsspec's IO loop's default executor (where s3fs and its
    credential lookups run blocking calls), none when fsspec has no loop yet."""
    asyn = sys.modules.get("fsspec.asyn")
    loop = getattr(asyn, "loop", [None])[0]
    executor = getattr(loop, "_default_executor", None)
    return set(getattr(executor, "_threads", ()))


#: names how shardcat starts its worker processes: ``fork`` or ``forkserver``
#: (unset: ``fork`` when that is safe: see :func:`worker_start_method`)
START_METHOD_ENV = "SHARDCAT_WORKER_START"


def worker_start_method() -> str:
    """How shardcat starts its worker processes here: ``fork`` (fast: nothing to
    import or pickle) when that is safe (see :func:`fork_hazards`), else
    ``forkserver`` (each worker forked from a clean server process: a script must
    then guard its main code with ``if __name__ == "__main__":``);
    ``$SHARDCAT_WORKER_START`` chooses instead."""
    chosen = os.environ.get(START_METHOD_ENV)
    if chosen is None:
        return "forkserver" if fork_hazards() else "fork"
    if chosen not in ("fork", "forkserver"):
        raise ValueError(f"${START_METHOD_ENV} must be fork or forkserver, not {chosen!r}")
    return chosen


class TurnLock:
    """A lock that processes forked from its maker take turns at, released by the
    kernel when its holder dies (a POSIX record lock on an unlinked temporary file):
    a worker killed or crashed in its turn never leaves the others waiting forever,
    as a ``multiprocessing.Lock`` it held would. Per process, not per thread."""

    def __init__(self) -> None:
        import tempfile

        self._file = tempfile.TemporaryFile()  # noqa: SIM115  (unlinked; closed by close())

    def __enter__(self) -> TurnLock:
        import fcntl

        fcntl.lockf(self._file.fileno(), fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        import fcntl

        fcntl.lockf(self._file.fileno(), fcntl.LOCK_UN)

    def close(self) -> None:
        self._file.close()

    def __reduce__(self) -> tuple[Any, ...]:
        """For a worker a fork server starts: its own descriptor of the same file."""
        from multiprocessing.reduction import DupFd

        return (_turn_lock_on, (DupFd(self._file.fileno()),))


def _turn_lock_on(fd: Any) -> TurnLock:
    lock = TurnLock.__new__(TurnLock)
    lock._file = os.fdopen(fd.detach(), "r+b")
    return lock
