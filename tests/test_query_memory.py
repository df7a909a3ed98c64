"""A query's memory is bounded (issue 26): a value built past the budget and a result
that would hold more than it stop with a clear CatalogError, never a MemoryError;
``--csv``/``--json`` stream rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardcat import Catalog, CatalogError, TFRecordWriter, make_example

HUGE_VALUE = "SELECT hex(zeroblob(999999999))"
# SQLite's printf() gives NULL past the length limit instead of failing (and never
# builds the gigabyte): bounded, though not an error
HUGE_PRINTF = "SELECT printf('%.*c', 999999999, 'x')"
BLOB_ROWS = (
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
    "SELECT x, zeroblob(100000) FROM c"
)
MB = 2**20


@pytest.fixture
def built(tmp_path: Path) -> Path:
    with TFRecordWriter(tmp_path / "train.tfrecord") as writer:
        for i in range(20):
            writer.write(make_example({"key": f"k{i:02d}", "label": i % 4}))
    db = tmp_path / "cat.sqlite"
    with Catalog(db) as cat:
        cat.ingest(str(tmp_path / "train.tfrecord"), "train").close()
    return db


@pytest.mark.parametrize("sql", [HUGE_VALUE, BLOB_ROWS, f"SELECT count(*) FROM ({HUGE_VALUE})"])
def test_a_query_past_its_memory_budget_stops(built: Path, sql: str) -> None:
    with Catalog(built, readonly=True) as cat:
        with pytest.raises(CatalogError) as err:
            cat.query(sql, memory=16 * MB, timeout=30)
        assert str(err.value).startswith("query exceeded its memory limit of 16 MB; pass --memory")
        # the connection is as it was: a lookup and a long value work again
        assert cat.query("SELECT length(printf('%.*c', 20000000, 'x'))") == [(20000000,)]
        with cat.dataset("train") as reader:
            assert reader.get_feature("k05", "label") == 1


def test_the_default_budget_stops_a_gigabyte_value(built: Path) -> None:
    with Catalog(built, readonly=True) as cat:
        with pytest.raises(CatalogError, match="256 MB"):
            cat.query(HUGE_VALUE)
        assert cat.query(HUGE_PRINTF) == [(None,)]


def test_streamed_rows_hold_one_at_a_time(built: Path) -> None:
    sql = BLOB_ROWS.replace("FROM c", "FROM c LIMIT 2000")  # 200 MB in all
    with Catalog(built, readonly=True) as cat:
        with pytest.raises(CatalogError, match="memory limit"):
            cat.query(sql, memory=16 * MB)
        with cat.query_rows(sql, memory=16 * MB) as (columns, rows):
            assert columns == ["x", "zeroblob(100000)"]
            assert sum(len(blob) for _, blob in rows) == 2000 * 100000
        with pytest.raises(CatalogError, match="memory must be a positive number"):
            cat.query("SELECT 1", memory=0)
        assert cat.query("SELECT 1", memory=None) == [(1,)]


# The CLI, noting its own peak RSS (VmHWM: reset by exec, unlike ru_maxrss, which a
# child inherits from the forking test process) in the file $HWM names, at exit.
_MEASURED_CLI = """
import atexit, os, sys
def note():
    with open("/proc/self/status") as f:
        peak = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    with open(os.environ["HWM"], "a") as f:
        f.write(peak + "\\n")
atexit.register(note)
from shardcat.cli import main
sys.argv = ["catalog", *sys.argv[1:]]
main()
"""


def _cli(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _MEASURED_CLI, "query", *args, "-c", str(db)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HWM": str(db.with_name("peaks.txt"))},
    )


def test_cli_memory_stays_bounded(built: Path) -> None:
    start = time.monotonic()
    done = _cli(built, HUGE_VALUE, "--csv")
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error: query exceeded its memory limit of 256 MB"), done.stderr
    assert "Traceback" not in done.stderr
    printf = HUGE_PRINTF.removeprefix("SELECT ")
    done = _cli(built, f"SELECT {printf}, {printf}, {printf}", "--csv")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1] == ",,"  # three NULLs, not three gigabytes
    done = _cli(built, BLOB_ROWS, "--memory", "32")
    assert done.returncode == 1
    assert "memory limit of 32 MB" in done.stderr
    # streamed: rows are written as they come, until the time limit
    counted = BLOB_ROWS.replace("zeroblob(100000)", "length(zeroblob(100000))")
    done = _cli(built, counted, "--json", "--timeout", "2")
    assert done.returncode == 1
    assert "time limit of 2 s" in done.stderr
    done = _cli(built, "SELECT key, label FROM train ORDER BY key LIMIT 2", "--json")
    assert json.loads(done.stdout) == [{"key": "k00", "label": 0}, {"key": "k01", "label": 1}]
    peaks = [int(kb) for kb in built.with_name("peaks.txt").read_text().split()]
    assert len(peaks) == 5  # one per query process
    assert max(peaks) < 1.5 * 2**20, f"a query process grew to {max(peaks) / 2**10:.0f} MB"
    assert time.monotonic() - start < 240
