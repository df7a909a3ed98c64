"""Readers reading while shards are rewritten and re-ingested: never wrong bytes,
never a missing key, never an exception that is not a ShardcatError, and a
ShardcatError only where the writer explains it (the shard it names was being
rewritten or re-ingested). Bounded by work, not time: ``ROUNDS`` re-ingests
(``SHARDCAT_CHURN_ROUNDS`` runs more), each reader reading at least ``MIN_READS``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardcat.testing.churn import expected_payload, run

ROUNDS = int(os.environ.get("SHARDCAT_CHURN_ROUNDS", "4"))
MIN_READS, READERS = 300, 2


def test_payloads_name_their_key_and_version():
    a, b = expected_payload("s0_00001", 3), expected_payload("s0_00001", 4)
    assert a.startswith(b"s0_00001|3|") and b.startswith(b"s0_00001|4|")
    assert a != b and expected_payload("s0_00001", 3) == a


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_readers_during_reingest_get_right_bytes_or_an_explained_error(tmp_path: Path, fmt: str):
    result = run(tmp_path, fmt=fmt, rounds=ROUNDS, readers=READERS, min_reads=MIN_READS)
    print(f"churn {fmt}: {result}")
    assert result["reingests"] == ROUNDS, result
    assert result["reads"] >= READERS * MIN_READS, result
    bad = {k: result[k] for k in ("wrong", "missing", "other", "unexplained")}
    assert bad == {"wrong": 0, "missing": 0, "other": 0, "unexplained": 0}, result


@pytest.mark.parametrize("fmt", ["tar", "tfrecord"])
def test_threads_sharing_one_reader_during_reingest(tmp_path: Path, fmt: str):
    # 16 threads share one reader (and its catalog) while another process re-ingests:
    # each call runs in its own snapshot, never another thread's (issue 26).
    result = run(tmp_path, fmt=fmt, rounds=ROUNDS, readers=1, threads=16, shards=6, min_reads=50)
    print(f"churn {fmt}, 16 threads: {result}")
    assert result["reingests"] == ROUNDS, result
    assert result["reads"] >= 16 * 50, result
    bad = {k: result[k] for k in ("wrong", "missing", "other", "unexplained")}
    assert bad == {"wrong": 0, "missing": 0, "other": 0, "unexplained": 0}, result
