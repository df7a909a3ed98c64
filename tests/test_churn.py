"""Readers reading while shards are rewritten and re-ingested: never wrong bytes,
never a missing key, never another exception (``SHARDCAT_CHURN_SECONDS`` runs longer)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardcat.testing.churn import expected_payload, run

SECONDS = float(os.environ.get("SHARDCAT_CHURN_SECONDS", "3"))


def test_payloads_name_their_key_and_version():
    a, b = expected_payload("s0_00001", 3), expected_payload("s0_00001", 4)
    assert a.startswith(b"s0_00001|3|") and b.startswith(b"s0_00001|4|")
    assert a != b and expected_payload("s0_00001", 3) == a


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_readers_during_reingest_get_right_bytes_or_a_stale_error(tmp_path: Path, fmt: str):
    result = run(tmp_path, fmt=fmt, seconds=SECONDS, readers=2)
    print(f"churn {fmt}: {result}")
    assert result["reingests"] >= 2, result
    assert result["ok"] > 1000, result
    assert (result["wrong"], result["missing"], result["other"]) == (0, 0, 0), result


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_threads_sharing_one_reader_during_reingest(tmp_path: Path, fmt: str):
    # 16 threads share one reader (and its catalog) while another process re-ingests:
    # each call runs in its own snapshot, never another thread's.
    result = run(tmp_path, fmt=fmt, seconds=SECONDS, readers=1, threads=16, shards=6)
    print(f"churn {fmt}, 16 threads: {result}")
    assert result["reingests"] >= 2, result
    assert result["ok"] > 500, result
    assert (result["wrong"], result["missing"], result["other"]) == (0, 0, 0), result
