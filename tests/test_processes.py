"""The process-liveness helper shared by catalog claims and storage locks."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator

import pytest

from shardcat.catalog.processes import alive, is_dead, owner_id

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0].decode()


def _fork_owner(*, linger: bool) -> tuple[int, str]:
    """Fork a child that reports its owner_id(), then exits or sleeps; (pid, owner)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read_fd)
            os.write(write_fd, owner_id().encode() + b"\n")
            os.close(write_fd)
            if linger:
                time.sleep(600)
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as f:
        owner = f.readline().decode().strip()
    return pid, owner


@pytest.fixture
def lingering() -> Iterator[tuple[int, str]]:
    """A live child process and its owner string; killed and waited for afterwards."""
    pid, owner = _fork_owner(linger=True)
    try:
        yield pid, owner
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # pragma: no cover - already gone
            pass
        os.waitpid(pid, 0)


def test_owner_is_host_pid_and_start_time() -> None:
    host, pid, started = owner_id().split(":")
    assert host == socket.gethostname()
    assert int(pid) == os.getpid()
    assert started  # "?" where there is no /proc
    assert owner_id() == owner_id()


def test_this_process_is_alive() -> None:
    assert alive(owner_id())
    assert not is_dead(owner_id(), time.time(), lease=600)
    assert not is_dead(owner_id(), None, lease=600)


@needs_fork
def test_a_live_child_is_alive_and_has_its_own_owner(lingering: tuple[int, str]) -> None:
    pid, owner = lingering
    assert owner != owner_id()
    assert owner.startswith(f"{socket.gethostname()}:{pid}:")
    assert alive(owner)
    assert not is_dead(owner, time.time(), lease=600)


@needs_fork
def test_a_waited_for_child_is_dead() -> None:
    pid, owner = _fork_owner(linger=False)
    os.waitpid(pid, 0)
    assert is_dead(owner, time.time(), lease=600)
    assert not alive(owner)


@needs_fork
@needs_proc
def test_a_zombie_child_is_dead(lingering: tuple[int, str]) -> None:
    """A zombie (killed, not yet waited for) still answers kill(pid, 0): it is dead anyway."""
    pid, owner = lingering
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while _state(pid) != "Z":
        assert time.monotonic() < deadline, "the child never became a zombie"
        time.sleep(0.01)
    os.kill(pid, 0)  # the pid still answers
    assert is_dead(owner, time.time(), lease=600)  # before any wait()
    assert not alive(owner)


@needs_proc
def test_a_reused_pid_is_dead() -> None:
    host, pid, started = owner_id().split(":")
    other_start = str(int(started) + 1)
    assert is_dead(f"{host}:{pid}:{other_start}", time.time(), lease=600)
    assert not alive(f"{host}:{pid}:{other_start}")


def test_an_owner_without_a_start_time_is_judged_by_its_pid() -> None:
    host, pid, _ = owner_id().split(":")
    assert alive(f"{host}:{pid}")  # an owner written before start times were recorded
    assert alive(f"{host}:{pid}:?")  # written where there is no /proc


def test_another_hosts_claim_is_dead_only_after_the_lease() -> None:
    owner = "another-host.invalid:12345:999"
    assert not is_dead(owner, time.time() - 5, lease=600)
    assert is_dead(owner, time.time() - 601, lease=600)
    assert is_dead(owner, None, lease=600)  # no time: nothing to wait for
    assert not alive(owner)  # another host's process is never known to be alive


@pytest.mark.parametrize("owner", [None, "", socket.gethostname(), f"{socket.gethostname()}:x:1"])
def test_no_owner_or_an_unreadable_one_is_dead(owner: str | None) -> None:
    assert is_dead(owner, time.time(), lease=600)
    assert not alive(owner)


def test_a_turn_held_by_a_killed_worker_passes_on() -> None:
    # a forked ingest worker that died in its turn (SIGKILL, or a segfault in an
    # extension) left its siblings waiting forever on a multiprocessing.Lock
    import select

    from shardcat.catalog.processes import TurnLock

    lock = TurnLock()
    holder = os.fork()
    if holder == 0:  # takes its turn and dies in it
        lock.__enter__()
        os.kill(os.getpid(), signal.SIGKILL)
    os.waitpid(holder, 0)
    read_end, write_end = os.pipe()
    waiter = os.fork()
    if waiter == 0:
        with lock:
            os.write(write_end, b"my turn")
        os._exit(0)
    ready, _, _ = select.select([read_end], [], [], 30)
    try:
        assert ready and os.read(read_end, 16) == b"my turn"
    finally:
        if not ready:
            os.kill(waiter, signal.SIGKILL)
        os.waitpid(waiter, 0)
        os.close(read_end)
        os.close(write_end)
        lock.close()
