"""Ingest workers are forked only where forking is safe: beside another thread (or
Ray, or gRPC's threads) they start from a fork server instead, with the format
registered here and the storage options configured here, and the ingest gives the
same keys and bytes; a worker that crashes fails its shard, naming the signal,
and an ingest whose every worker crashes ends with an IngestError (never a round
of crashes after another). Every ingest runs under a deadline: a hang fails."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardcat import Catalog, IngestError
from shardcat.catalog.processes import START_METHOD_ENV, worker_start_method
from shardcat.formats import registry
from shardcat.formats.registry import register_format
from shardcat.formats.tfrecord import TFRecordFormat, TFRecordWriter, make_example
from shardcat.testing.crashing import NO_CRASH_PID, register_crashing_format
from shardcat.testing.ray import deadline

LIMIT = 120  # seconds an ingest may take before the test fails
SHARDS = 4
RECORDS = 40


class CopiedTFRecord(TFRecordFormat):
    """TFRecord under another name, registered here at run time only: a worker a
    fork server starts knows it only from what the ingest hands it."""

    NAME = "copiedtfrecord"

    def sniff(self, head: bytes) -> bool:
        return False

    def scan_shard(self, path: str, options: Any) -> Any:
        assert os.environ["SHARDCAT_TEST_SET_LATE"] == "here"  # the caller's environment
        return super().scan_shard(path, options)


def write_shards(root: Path, shards: int = SHARDS) -> dict[str, bytes]:
    root.mkdir(parents=True, exist_ok=True)
    truth = {}
    for s in range(shards):
        with TFRecordWriter(root / f"part-{s}.tfrecord") as w:
            for i in range(RECORDS):
                key = f"s{s}r{i:02d}"
                truth[key] = key.encode() * (1 + i % 5)
                w.write(make_example({"key": key, "data": truth[key]}))
    return truth


def contents(catalog: Path, dataset: str = "train") -> dict[str, bytes]:
    with Catalog(catalog) as cat, cat.dataset(dataset) as reader:
        return {k: reader.get_feature(k, "data") for k in reader.get_keys()}


@pytest.fixture
def a_thread() -> Iterator[threading.Thread]:
    """A thread of the caller's (not shardcat's), alive for the test."""
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="users-thread", daemon=True)
    thread.start()
    yield thread
    stop.set()
    thread.join()


_CHOICE = """
import os, threading
from shardcat.catalog.processes import START_METHOD_ENV, fork_hazards, worker_start_method
from shardcat.cli.common import progress_bar
stop = threading.Event()
assert fork_hazards() == [] and worker_start_method() == "fork"
for name in ("shardcat-pool-0", "fsspecIO"):  # shardcat's own; fsspec's, which is fork-aware
    threading.Thread(target=stop.wait, name=name, daemon=True).start()
assert fork_hazards() == [] and worker_start_method() == "fork"
import asyncio, fsspec.asyn  # fsspec's loop runs blocking calls (s3fs's) in its executor
async def in_executor():
    await asyncio.get_running_loop().run_in_executor(None, int)
fsspec.asyn.sync(fsspec.asyn.get_loop(), in_executor)
assert any(t.name.startswith("asyncio_") for t in threading.enumerate())
assert fork_hazards() == [], fork_hazards()
with progress_bar("ingest"):  # the CLI's progress bar and its refresh thread
    assert fork_hazards() == []
threading.Thread(target=stop.wait, name="users-thread", daemon=True).start()
assert fork_hazards() == ["threads users-thread"], fork_hazards()
assert worker_start_method() == "forkserver"
os.environ[START_METHOD_ENV] = "fork"
assert worker_start_method() == "fork"
os.environ[START_METHOD_ENV] = "spawn"
try:
    worker_start_method()
except ValueError as exc:
    assert str(exc) == "$SHARDCAT_WORKER_START must be fork or forkserver, not 'spawn'"
else:
    raise AssertionError("spawn taken")
print("checked")
"""


def test_fork_only_where_it_is_safe() -> None:
    """In a fresh process (this one may have run Ray already): forked while only
    shardcat's, fsspec's (its IO loop and that loop's executor) and the progress
    bar's threads run; a fork server beside
    another thread; the environment variable chooses."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != START_METHOD_ENV}
    done = subprocess.run(
        [sys.executable, "-c", _CHOICE], capture_output=True, text=True, timeout=LIMIT, env=env
    )
    assert (done.returncode, done.stdout) == (0, "checked\n"), done.stderr


def test_beside_a_thread_workers_start_from_a_fork_server(
    tmp_path: Path, a_thread: threading.Thread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The format registered here at run time and the environment as it is now reach
    the workers (set after the fork server started); every key and
    byte as a forked ingest gives; the workers' pids are not children forked from
    this process's state (they do not hold its thread)."""
    monkeypatch.delenv(START_METHOD_ENV, raising=False)
    registry.known_formats()  # (entry points read into the real registry first)
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))  # (this test's own)
    register_format(CopiedTFRecord.NAME, CopiedTFRecord)
    monkeypatch.setenv("SHARDCAT_TEST_SET_LATE", "here")  # after the fork server started
    assert worker_start_method() == "forkserver"
    truth = write_shards(tmp_path / "data")
    with deadline(LIMIT, "an ingest beside a thread"), Catalog(tmp_path / "c.sqlite") as cat:
        seen: list[Any] = []
        reader = cat.ingest(
            str(tmp_path / "data" / "*.tfrecord"),
            "train",
            format=CopiedTFRecord.NAME,
            workers=2,
            progress=lambda o, n: seen.append(o),
        )
        assert len(reader) == SHARDS * RECORDS
        reader.close()
    assert sorted(o.path for o in seen) == [f"data/part-{s}.tfrecord" for s in range(SHARDS)]
    assert contents(tmp_path / "c.sqlite") == truth
    # the same with fork asked for: the same catalog rows
    monkeypatch.setenv(START_METHOD_ENV, "fork")
    with deadline(LIMIT, "a forked ingest"), Catalog(tmp_path / "f.sqlite") as cat:
        cat.ingest(str(tmp_path / "data" / "*.tfrecord"), "train", workers=2).close()
    assert contents(tmp_path / "f.sqlite") == truth


def _states(catalog: Path) -> list[tuple[str, str, str | None]]:
    with sqlite3.connect(catalog) as conn:
        return conn.execute(
            "SELECT path, state, claim_owner FROM shardcat_shards ORDER BY path"
        ).fetchall()


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_workers_that_crash_fail_their_shards_naming_the_signal(
    tmp_path: Path, method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every worker segfaults in its scan: the ingest ends (no round of crashes
    after another) with an IngestError naming each shard and SIGSEGV; nothing is
    left claimed; the next ingest with a good format indexes them."""
    registry.known_formats()  # (entry points read into the real registry first)
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))  # (this test's own)
    register_crashing_format()
    monkeypatch.setenv(START_METHOD_ENV, method)
    monkeypatch.setenv(NO_CRASH_PID, str(os.getpid()))
    truth = write_shards(tmp_path / "data", 3)  # the last one too is scanned by a worker
    pattern = str(tmp_path / "data" / "*.tfrecord")
    catalog = tmp_path / "c.sqlite"
    with deadline(LIMIT, "an ingest whose workers crash"), Catalog(catalog) as cat:
        with pytest.raises(IngestError) as caught:
            cat.ingest(pattern, "train", format="crashtfrecord", workers=2)
        failures = sorted((f.path, f.error) for f in caught.value.failures)
        assert failures == [
            (
                f"data/part-{s}.tfrecord",
                f"data/part-{s}.tfrecord: its ingest worker died (signal SIGSEGV) indexing it",
            )
            for s in range(3)
        ]
        assert str(caught.value).endswith("indexing it (and 2 more failed shards)")
    assert _states(catalog) == []  # a first ingest that indexed nothing leaves no dataset
    with deadline(LIMIT, "the next ingest"), Catalog(catalog) as cat:
        cat.ingest(pattern, "train", format="tfrecord", workers=2).close()
    assert contents(catalog) == truth


def test_an_unguarded_script_beside_a_thread_gets_a_clear_error(tmp_path: Path) -> None:
    """A script without ``if __name__ == "__main__":`` whose process is not safe to
    fork: its fork-server workers re-run it and die; the ingest says so, once."""
    import subprocess
    import sys

    write_shards(tmp_path / "data", 2)
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import sys, threading\n"
        "from shardcat import Catalog\n"
        "threading.Thread(target=threading.Event().wait, daemon=True).start()\n"
        "with Catalog(sys.argv[1]) as cat:\n"
        "    cat.ingest(sys.argv[2], 'train', workers=2)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != START_METHOD_ENV}
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "c.sqlite"), str(tmp_path / "data/*")],
        capture_output=True,
        text=True,
        timeout=LIMIT,
        env=env,
    )
    assert done.returncode == 1
    assert done.stderr.rstrip().splitlines()[-1] == (
        "shardcat.errors.IngestError: every ingest worker died (exit code 1, exit code 1); "
        "started by a fork server (this process was not safe to fork: a script must guard "
        """its main code with 'if __name__ == "__main__":')"""
    )


def test_a_fork_server_s_worker_ends_with_the_process_that_started_it(tmp_path: Path) -> None:
    """Its parent is the fork server, so no PR_SET_PDEATHSIG: a thread watches the
    starting process (pid and start time); SIGKILL that process and the worker ends."""
    import signal
    import subprocess
    import sys
    import time

    from shardcat.catalog.processes import _proc_stat

    script = tmp_path / "starts.py"
    script.write_text(
        "import multiprocessing, os, time\n"
        "from shardcat.catalog.processes import end_with_parent\n"
        "def work(parent):\n"
        "    end_with_parent(parent)\n"
        "    time.sleep(120)\n"
        "if __name__ == '__main__':\n"
        "    ctx = multiprocessing.get_context('forkserver')\n"
        "    proc = ctx.Process(target=work, args=(os.getpid(),))\n"
        "    proc.start()\n"
        "    print(proc.pid, flush=True)\n"
        "    time.sleep(120)\n"
    )
    starter = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert starter.stdout is not None
        worker = int(starter.stdout.readline())
        time.sleep(1.0)  # (end_with_parent has run)
        assert _proc_stat(worker)[0] not in ("?", "Z", "X")  # working, not ended at once
        os.kill(starter.pid, signal.SIGKILL)
        starter.wait(30)
        ends = time.monotonic() + 15
        while _proc_stat(worker)[0] not in ("?", "Z", "X"):
            assert time.monotonic() < ends, "the worker outlived the process that started it"
            time.sleep(0.05)
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait()
