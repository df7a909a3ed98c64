"""The performance figures the READMEs state are one recorded full run's: the
tables of README.md and benchmarks/README.md are ``benchmarks/results/latest.json``
rendered, every row has its rounds and the spread of its ratio, and a target
missed says **no** (``python -m benchmarks --record`` re-records)."""

from __future__ import annotations

import json
import re

from benchmarks import record
from benchmarks.util import Row


def test_the_readme_tables_are_the_recorded_run() -> None:
    assert record.differences() == [], "re-render: python -m benchmarks.record"


def test_the_record_is_one_full_run_with_rounds_and_spread() -> None:
    env, rows = record.load()
    assert re.fullmatch(r"[0-9a-f]{7,40}", env["commit"]), env["commit"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", env["date"]), env["date"]
    assert env["machine"] and env["cpus"] >= 1
    benchmarks = {r.benchmark.split(".", 1)[0] for r in rows}
    assert benchmarks == {"1", "2", "3", "4", "5"}, "a full run has all five benchmarks"
    for row in rows:
        assert row.rounds is not None and row.rounds >= 3, row
        if row.spread is not None:  # the lowest and highest ratio of one round
            assert row.spread[0] <= row.spread[1], row


def test_a_missed_target_says_no() -> None:
    rows = [
        Row("b", "m", "s", 3.0, "other", 2.0, max_ratio=1.0, rounds=3, spread=(1.2, 1.8)),
        Row("b", "m", "s", 1.0, "other", 2.0, max_ratio=1.0, rounds=3, spread=(0.4, 0.6)),
        Row("b", "v", "ms", 250.0, "other", 1.0, max_value=200, rounds=3),
    ]
    env, _ = record.load()
    lines = record.table(env, rows, targets_only=True).splitlines()
    assert [line.rsplit("|", 2)[1].strip() for line in lines if line.startswith("| ")][2:] == [
        "**no**",
        "yes",
        "**no**",
    ]
    assert "| 1.50 (1.20-1.80) | 3 |" in lines[5]


def test_the_record_is_valid_json_rows() -> None:
    raw = json.loads(record.RECORD.read_text(encoding="utf-8"))
    fields = set(Row.__dataclass_fields__)
    assert all(set(r) == fields for r in raw["rows"])
