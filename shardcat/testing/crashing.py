"""A format whose scan crashes the process scanning it, for the tests that a crashed
ingest worker (a local one, or a Ray task's) fails its shard, naming the signal,
and that no ingest retries a crash forever.

``crashtfrecord`` is TFRecord, used by name only (never detected), whose scan sends
its process ``SIGSEGV``. In the process named by ``$SHARDCAT_TEST_NO_CRASH_PID`` (a
test's own) it raises ``OSError`` instead: a crash there would end the test run.
"""

from __future__ import annotations

import faulthandler
import os
import signal
from typing import Any

from shardcat.formats.registry import known_formats, register_format
from shardcat.formats.tfrecord import TFRecordFormat

__all__ = ["NO_CRASH_PID", "CrashingTFRecord", "register_crashing_format"]

#: the environment variable naming the process that must not crash
NO_CRASH_PID = "SHARDCAT_TEST_NO_CRASH_PID"


class CrashingTFRecord(TFRecordFormat):
    NAME = "crashtfrecord"

    def sniff(self, head: bytes) -> bool:
        return False  # by name only

    def scan_shard(self, path: str, options: Any) -> Any:
        if os.environ.get(NO_CRASH_PID) == str(os.getpid()):
            raise OSError(f"{path}: crashtfrecord does not crash the test's own process")
        faulthandler.disable()  # a crash on purpose: no dump of the worker's stack
        os.kill(os.getpid(), signal.SIGSEGV)
        raise AssertionError("not reached")


def register_crashing_format() -> None:
    """Register ``crashtfrecord`` (a no-op when it is registered already)."""
    if CrashingTFRecord.NAME not in known_formats():
        register_format(CrashingTFRecord.NAME, CrashingTFRecord)
