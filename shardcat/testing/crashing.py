"""A format whose scan crashes the process scanning it, for the tests that a crashed
ingest worker (a local one, or a Ray task's) fails its shard, naming the signal,
and that no ingest retries a crash forever.

``crashtfrecord`` is TFRecord, used by name only (never detected). Its scan leaves
``<shard>.crashing`` beside the shard, waits (up to :data:`GATHER_SECONDS`) until
every ``.tfrecord`` shard of that directory has one, so that every shard is claimed
by a live worker before the first crash, then sends itself ``SIGSEGV``. In the
process named by ``$SHARDCAT_TEST_NO_CRASH_PID`` (a test's own) it raises
``OSError`` instead: a crash there would end the test run.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from shardcat.formats.registry import known_formats, register_format
from shardcat.formats.tfrecord import TFRecordFormat

__all__ = ["GATHER_SECONDS", "NO_CRASH_PID", "CrashingTFRecord", "register_crashing_format"]

#: how long a scan waits for the scans of the other shards of its directory
GATHER_SECONDS = 60.0
#: the environment variable naming the process that must not crash
NO_CRASH_PID = "SHARDCAT_TEST_NO_CRASH_PID"


class CrashingTFRecord(TFRecordFormat):
    NAME = "crashtfrecord"

    def sniff(self, head: bytes) -> bool:
        return False  # by name only

    def scan_shard(self, path: str, options: Any) -> Any:
        if os.environ.get(NO_CRASH_PID) == str(os.getpid()):
            raise OSError(f"{path}: crashtfrecord does not crash the test's own process")
        Path(f"{path}.crashing").touch()
        shards = len(list(Path(path).parent.glob("*.tfrecord")))
        waited = time.monotonic() + GATHER_SECONDS
        while len(list(Path(path).parent.glob("*.crashing"))) < shards:
            if time.monotonic() > waited:
                break
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGSEGV)
        raise AssertionError("not reached")


def register_crashing_format() -> None:
    """Register ``crashtfrecord`` (a no-op when it is registered already)."""
    if CrashingTFRecord.NAME not in known_formats():
        register_format(CrashingTFRecord.NAME, CrashingTFRecord)
