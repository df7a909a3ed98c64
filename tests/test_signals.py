"""SIGTERM, SIGHUP and SIGKILL during an ingest (issue 27 item 1): the command says what
to run and exits with 143/129, its workers end with it (also when it is SIGKILLed), the
claims are given back, and a re-run finishes at once with the exact key set. A re-run
never waits silently: a live holder of claims is named, ``--wait-timeout`` bounds the
wait. Real ``catalog`` processes; each shard's scan is slowed so an ingest lasts a few
seconds without using the CPU."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardcat.catalog.processes import Stopped, _proc_stat, stopping_on_signals
from shardcat.sample import make_sample

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

SHARDS, RECORDS = 8, 80
KEYS = {f"rec_{i:09d}" for i in range(RECORDS)}
RERUN = "run the same command again to finish (shards already indexed are not read again)"

# Each command below starts as one from a terminal does, SIGHUP at its default (a test
# run under nohup would hand it down ignored, and an ignored SIGHUP is left so)
_TERMINAL = """
import signal
signal.signal(signal.SIGHUP, signal.SIG_DFL)
"""
_SLOW = (
    _TERMINAL
    + """
import faulthandler, signal, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)  # where it hangs, if it does
from shardcat.formats.tfrecord import TFRecordFormat
scan = TFRecordFormat.scan
def slow_scan(self, path, options):
    time.sleep(1.0)  # a whole ingest lasts ~4 s: time to stop it, even on a loaded machine
    return scan(self, path, options)
TFRecordFormat.scan = slow_scan  # forked workers inherit it
"""
)
_CLI = (
    _SLOW
    + """
from shardcat.cli import main
sys.argv = ["catalog", *sys.argv[1:]]
main()
"""
)
_LIBRARY = (
    _SLOW
    + """
from shardcat import Catalog
with Catalog(sys.argv[2]) as cat:
    cat.ingest(sys.argv[1], "train", workers=2)
print("finished")
"""
)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("SHARDCAT_CATALOG", "SHARDCAT_DEBUG")}


def _shards(db: Path) -> dict[str, int]:
    """How many shards are in each state (empty before the catalog exists)."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    except sqlite3.Error:
        return {}
    try:
        rows = conn.execute("SELECT state, count(*) FROM shardcat_shards GROUP BY state").fetchall()
    except sqlite3.Error:
        return {}
    finally:
        conn.close()
    return dict(rows)


def _keys(db: Path) -> list[str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [k for (k,) in conn.execute("SELECT key FROM train")]
    finally:
        conn.close()


def _children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] not in (b"Z", b"X"):
                found.append(int(entry))
    return found


def _gone(pids: list[int]) -> bool:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if all(_proc_stat(pid)[0] in ("?", "Z", "X") for pid in pids):
            return True
        time.sleep(0.05)
    return False


def _ended(proc: subprocess.Popen[str], workers: list[int]) -> tuple[str, str]:
    """Its output once it and its ``workers`` ended (a worker left would hold the pipes)."""
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGUSR1)  # where it hangs: a stack dump of each thread
        time.sleep(1)
        proc.kill()
        pytest.fail(f"it did not end: {proc.communicate(timeout=30)[1]}")
    if not _gone(workers):
        left = [pid for pid in workers if _proc_stat(pid)[0] not in ("?", "Z", "X")]
        pytest.fail(f"worker processes {left} outlived the command")
    return proc.communicate(timeout=30)


def _start(tmp_path: Path, script: str = _CLI) -> tuple[subprocess.Popen[str], list[str], Path]:
    """An ingest of 8 slow shards with 2 workers, once it committed a shard and its
    two workers run; returns the process, the CLI arguments and the catalog."""
    make_sample(tmp_path / "d", shards=SHARDS, records=RECORDS, image_bytes=16)
    db = tmp_path / "cat.sqlite"
    pattern = str(tmp_path / "d" / "*.tfrecord")
    args = ["ingest", pattern, "-d", "train", "-w", "2", "-c", str(db)]
    argv = args if script is _CLI else [pattern, str(db)]
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *argv],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a signal to the group would reach the workers too
    )
    deadline = time.monotonic() + 60
    while _shards(db).get("ready", 0) == 0 and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    while len(_children(proc.pid)) < 2 and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert proc.poll() is None, proc.communicate()  # still running, to be stopped
    return proc, args, db


def _rerun(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _CLI, *args, "--wait-timeout", "30"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_stops_ingest_its_workers_and_gives_claims_back(
    tmp_path: Path, signum: signal.Signals
) -> None:
    proc, args, db = _start(tmp_path)
    workers = _children(proc.pid)
    os.kill(proc.pid, signum)  # as `timeout`, Slurm, Kubernetes or a closed terminal do
    out, err = _ended(proc, workers)
    assert (proc.returncode, out, err) == (128 + signum, "", f"stopped by {signum.name}: {RERUN}\n")
    states = _shards(db)
    assert "indexing" not in states  # every claim given back
    assert 0 < states["ready"] < SHARDS
    done = _rerun(args)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"dataset train: {RECORDS} records in {SHARDS} shards (")
    assert sorted(_keys(db)) == sorted(KEYS)


def test_sigkill_of_the_command_ends_its_workers_and_the_rerun_finishes(tmp_path: Path) -> None:
    proc, args, db = _start(tmp_path)
    workers = _children(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)  # no cleanup of its own: the workers must notice
    _ended(proc, workers)
    assert proc.returncode == -signal.SIGKILL
    done = _rerun(args)
    assert done.returncode == 0, done.stderr
    assert "waiting for" not in done.stderr, done.stderr  # nothing held by a live process
    assert sorted(_keys(db)) == sorted(KEYS)
    assert _shards(db) == {"ready": SHARDS}


def test_sigterm_inside_catalog_ingest_in_a_python_program(tmp_path: Path) -> None:
    """A program that leaves SIGTERM at its default: the ingest stops its workers,
    gives the claims back, and the process exits with 143 as SIGTERM would."""
    proc, args, db = _start(tmp_path, _LIBRARY)
    workers = _children(proc.pid)
    os.kill(proc.pid, signal.SIGTERM)
    out, err = _ended(proc, workers)
    assert (proc.returncode, out) == (143, ""), err
    assert "Traceback" not in err
    assert "indexing" not in _shards(db)
    assert _rerun(args).returncode == 0
    assert sorted(_keys(db)) == sorted(KEYS)


def _owner_of(pid: int) -> str:
    return f"{socket.gethostname()}:{pid}:{_proc_stat(pid)[1]}"


def test_a_live_holder_is_named_and_wait_timeout_bounds_the_wait(tmp_path: Path) -> None:
    make_sample(tmp_path / "d", shards=2, records=20, image_bytes=16)
    db = tmp_path / "cat.sqlite"
    args = ["ingest", str(tmp_path / "d" / "*.tfrecord"), "-d", "train", "-c", str(db)]
    assert subprocess.run([sys.executable, "-c", _CLI, *args], env=_env()).returncode == 0
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with sqlite3.connect(db) as conn:  # another live process is indexing one shard
            conn.execute(
                "UPDATE shardcat_shards SET state = 'indexing', claim_owner = ?, claimed_at = ? "
                "WHERE id = (SELECT min(id) FROM shardcat_shards)",
                (_owner_of(holder.pid), time.time()),
            )
        conn.close()
        done = subprocess.run(
            [sys.executable, "-c", _CLI, *args, "--wait-timeout", "1.5"],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        named = f"1 shard held by {socket.gethostname()}:{holder.pid}"
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr.splitlines()[-1] == (
            f"error: gave up after waiting 1.5 s (--wait-timeout) for {named}; "
            "run the same ingest again once they are done, or stop them"
        )
    finally:
        holder.kill()
        holder.wait()
    done = _rerun(args)  # the holder is gone: its shard is taken over at once
    assert done.returncode == 0, done.stderr
    assert "waiting for" not in done.stderr
    assert len(_keys(db)) == 20


def test_the_wait_is_named_while_it_lasts(tmp_path: Path) -> None:
    """Without --wait-timeout the wait is named once (one warning line), then the
    ingest goes on as soon as the holder is gone."""
    make_sample(tmp_path / "d", shards=2, records=20, image_bytes=16)
    db = tmp_path / "cat.sqlite"
    args = ["ingest", str(tmp_path / "d" / "*.tfrecord"), "-d", "train", "-c", str(db)]
    assert subprocess.run([sys.executable, "-c", _CLI, *args], env=_env()).returncode == 0
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE shardcat_shards SET state = 'indexing', claim_owner = ?, claimed_at = ?",
            (_owner_of(holder.pid), time.time()),
        )
    conn.close()
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLI, *args],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert line == (
        f"warning: waiting for 2 shards held by {socket.gethostname()}:{holder.pid} (another "
        "ingest of this dataset; a process that ends gives its shards to this one; "
        "--wait-timeout bounds the wait)\n"
    )
    holder.kill()
    holder.wait()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.startswith("dataset train: 20 records in 2 shards (")


def test_stopping_on_signals_leaves_handlers_a_program_set(tmp_path: Path) -> None:
    def mine(signum: int, frame: object) -> None:
        raise AssertionError

    outside = {s: signal.signal(s, signal.SIG_DFL) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:  # from the default handlers, whatever an earlier test of this process left
        _handlers_a_program_set(mine)
    finally:
        for signum, handler in outside.items():
            signal.signal(signum, handler)


def _handlers_a_program_set(mine: object) -> None:
    before = signal.signal(signal.SIGTERM, mine)
    try:
        with stopping_on_signals():
            assert signal.getsignal(signal.SIGTERM) is mine
            assert signal.getsignal(signal.SIGHUP) is not signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
    with pytest.raises(Stopped) as stopped, stopping_on_signals(exit_after=False):
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(5)
    assert stopped.value.exit_code == 129
    with pytest.raises(SystemExit) as ended, stopping_on_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert ended.value.code == 143
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


_SLOW_CONVERT = """
import faulthandler, signal, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)
import shardcat.convert as convert
tar = convert.convert_tar
def slow_convert(*args, **kwargs):
    time.sleep(1.0)  # a whole ingest lasts ~4 s: time to stop it, even on a loaded machine
    return tar(*args, **kwargs)
convert.convert_tar = slow_convert  # the forked workers inherit it
from shardcat.cli import main
sys.argv = ["catalog", *sys.argv[1:]]
main()
"""


def test_sigterm_stops_convert_and_its_workers(tmp_path: Path) -> None:
    make_sample(tmp_path / "d", shards=8, records=80, image_bytes=16, format="tar")
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_CONVERT, "convert", str(tmp_path / "d"), "-o", out, "-w", "2"],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while len(_children(proc.pid)) < 2 and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    workers = _children(proc.pid)
    os.kill(proc.pid, signal.SIGTERM)
    _, err = _ended(proc, workers)
    assert (proc.returncode, err) == (
        143,
        "stopped by SIGTERM: run the same command again to finish\n",
    )


_SLOW_VERIFY = (
    _TERMINAL
    + """
import sys, time
from shardcat.readers.reader import Reader
def slow_verify(self, progress=None):
    print("verifying", flush=True)
    time.sleep(30)
Reader.verify = slow_verify
from shardcat.cli import main
sys.argv = ["catalog", *sys.argv[1:]]
main()
"""
)


def test_sighup_stops_verify(tmp_path: Path) -> None:
    make_sample(tmp_path / "d", shards=1, records=10, image_bytes=16)
    db = tmp_path / "cat.sqlite"
    ingest = ["ingest", str(tmp_path / "d" / "*.tfrecord"), "-d", "train", "-c", str(db)]
    assert subprocess.run([sys.executable, "-c", _CLI, *ingest], env=_env()).returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_VERIFY, "verify", "train", "-c", str(db)],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "verifying\n"
    os.kill(proc.pid, signal.SIGHUP)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (129, "", "stopped by SIGHUP\n")


def test_an_ignored_sighup_stays_ignored() -> None:
    """Under nohup (SIGHUP ignored, handed down to the command) a closed terminal
    stops nothing: only signals at their default are taken."""
    outside = {
        signal.SIGHUP: signal.signal(signal.SIGHUP, signal.SIG_IGN),
        signal.SIGTERM: signal.signal(signal.SIGTERM, signal.SIG_DFL),
    }
    try:
        with stopping_on_signals(exit_after=False):
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.1)  # (no Stopped)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        for signum, handler in outside.items():
            signal.signal(signum, handler)


def test_sigterm_stops_a_long_query(tmp_path: Path) -> None:
    """SQLite runs the statement; SIGTERM's Stopped, raised in its progress handler,
    ends it as Ctrl-C does, and is told apart from Ctrl-C."""
    make_sample(tmp_path / "d", shards=1, records=10, image_bytes=16)
    db = tmp_path / "cat.sqlite"
    ingest = ["ingest", str(tmp_path / "d" / "*.tfrecord"), "-d", "train", "-c", str(db)]
    assert subprocess.run([sys.executable, "-c", _CLI, *ingest], env=_env()).returncode == 0
    endless = (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    )
    script = _CLI.replace("main()", "print('ready', flush=True)\nmain()")
    proc = subprocess.Popen(
        [sys.executable, "-c", script, "query", endless, "--timeout", "60", "-c", str(db)],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    time.sleep(1)  # (the query started or not, the outcome is the same)
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (143, "", "stopped by SIGTERM\n")


_SWALLOWED = """
import os, signal, time
from shardcat.catalog.processes import Stopped, stopping_on_signals
class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)  # the handler runs in here, where Python cannot raise
try:
    with stopping_on_signals(exit_after=False):
        Finalized()
        for _ in range(3000):
            time.sleep(0.01)
        print("not stopped")
except Stopped as stop:
    print("stopped by", stop.signum)
"""


def test_a_stop_raised_where_python_cannot_raise_comes_again() -> None:
    """A stop that lands in a ``__del__`` (its exception ignored, as Python does) is
    delivered again once that code is left: an ingest never just goes on."""
    done = subprocess.run(
        [sys.executable, "-c", _SWALLOWED], env=_env(), capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "stopped by 15\n", "")
