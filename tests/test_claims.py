"""Claim ownership: who is alive, who is dead, and what happens to a dead claim."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from shardcat.catalog.processes import is_dead as claim_is_dead
from shardcat.catalog.processes import owner_id


def test_own_claim_is_alive():
    assert not claim_is_dead(owner_id(), time.time(), lease=600)


def test_no_owner_is_dead():
    assert claim_is_dead(None, None, lease=600)


def test_exited_process_is_dead():
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from shardcat.catalog.processes import owner_id; print(owner_id())",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    owner = child.communicate()[0].strip()
    assert owner.startswith(f"{socket.gethostname()}:{child.pid}:")
    assert claim_is_dead(owner, time.time(), lease=600)


def test_killed_but_unreaped_child_is_dead():
    """A zombie still answers kill(pid, 0); its claim must not wait for the lease."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from shardcat.catalog.processes import owner_id; "
            "print(owner_id(), flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    owner = child.stdout.readline().strip()
    assert not claim_is_dead(owner, time.time(), lease=600)
    os.kill(child.pid, signal.SIGKILL)
    deadline = time.time() + 10
    while not claim_is_dead(owner, time.time(), lease=600) and time.time() < deadline:
        time.sleep(0.01)
    assert claim_is_dead(owner, time.time(), lease=600)  # before any wait()
    child.wait()


def test_reused_pid_is_dead():
    host, pid, _ = owner_id().split(":")
    assert claim_is_dead(f"{host}:{pid}:1", time.time(), lease=600)


def test_other_host_claim_expires_after_lease():
    owner = "some-other-host:1234:99"
    assert not claim_is_dead(owner, time.time() - 5, lease=600)
    assert claim_is_dead(owner, time.time() - 601, lease=600)


def test_switching_a_new_catalog_to_wal_waits_out_another_process(tmp_path):
    """Processes creating one new catalog at once: the WAL switch may fail at once
    with "database is locked" (no busy wait); it is retried, not raised."""
    import sqlite3

    from shardcat.catalog.engine import configure_writer

    class Contended:
        def __init__(self, conn: sqlite3.Connection) -> None:
            self.conn, self.refused = conn, 0

        def execute(self, sql: str):
            if sql == "PRAGMA journal_mode = WAL" and self.refused < 2:
                self.refused += 1
                raise sqlite3.OperationalError("database is locked")
            return self.conn.execute(sql)

    conn = sqlite3.connect(tmp_path / "new.sqlite")
    try:
        contended = Contended(conn)
        configure_writer(contended)  # type: ignore[arg-type]
        assert contended.refused == 2
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        conn.close()
