"""Hot-path latency of two shardcat trees side by side: a base revision vs a working tree.

``python -m benchmarks.versus --base f548e4c [--new TREE] [--rounds 5] [--out FILE]``

Checks the base revision out into a temporary ``git worktree`` (removed
afterwards), then runs :mod:`benchmarks.hotpath` (this tree's copy of the
script, so both sides measure the same way) alternately with
``PYTHONPATH=<base worktree>`` and ``PYTHONPATH=<new tree>``: base, new, base,
new, ..., each run a fresh interpreter that builds its own catalog with its
own schema and reads the same shards. Every run also times tfd-utils and the
raw ``sqlite3`` + ``pread`` + parse floor, so each tree gets ratios measured
inside its own process, and the contenders that do not change between the
trees (tfd-utils, the floor) show how much the machine moved between runs.

Prints a markdown table of medians over rounds: before, after, after/before
(and its range over the pairs of runs), each tree's ratio to tfd-utils and to
the floor; then the position/key ratio of each tree and the p90s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HOTPATH = Path(__file__).resolve().with_name("hotpath.py")


@dataclass(frozen=True)
class Line:
    """One table row: a measurement and what it is compared with inside its own run."""

    label: str
    name: str
    tfd: str | None
    floor: str | None


LINES = [
    Line("`get_feature(key, 'image')`", "get_feature", "tfd_get_feature", "raw_key"),
    Line("`get_record(key)`", "get_record", "tfd_get_record", "raw_key"),
    Line("`get_record_at(i)` (same records)", "get_record_at", "tfd_get_record", "raw_position"),
    Line("`get_many(keys)`, per key", "get_many", "tfd_get_record", "raw_key"),
    Line("`get_many_at(positions)`, per record", "get_many_at", "tfd_get_record", "raw_position"),
    Line("control: tfd-utils `get_feature`", "tfd_get_feature", None, None),
    Line("control: tfd-utils `get_record`", "tfd_get_record", None, None),
    Line("control: floor by key (sqlite3 + pread + parse)", "raw_key", None, None),
    Line("control: floor by position (`shard_id, ordinal`)", "raw_position", None, None),
]
POSITION_VS_KEY = [
    ("`get_record_at` / `get_record`", "get_record_at", "get_record"),
    ("`get_many_at` / `get_many`", "get_many_at", "get_many"),
    ("floor by position / floor by key", "raw_position", "raw_key"),
]
P90 = ["get_feature", "get_record", "get_record_at", "tfd_get_feature", "raw_key", "raw_position"]


def git(tree: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", "--no-optional-locks", "-C", str(tree), *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode:
        raise SystemExit(f"git {' '.join(args)} failed: {out.stderr.strip()}")
    return out.stdout.strip()


def describe(tree: Path) -> str:
    """The tree's commit (short hash and subject), and whether tracked files differ from it."""
    head = git(tree, "log", "-1", "--format=%h %s")
    dirty = git(tree, "status", "--porcelain", "--untracked-files=no")
    return head + (" (+ uncommitted changes)" if dirty else "")


def hotpath(tree: Path, args: argparse.Namespace, workdir: Path, *extra: str) -> dict[str, Any]:
    """One fresh interpreter running this tree's hotpath.py against the shardcat of ``tree``."""
    # -P (3.11+): keep the script's own folder off sys.path; the cwd holds nothing to import
    safe = ["-P"] if sys.version_info >= (3, 11) else []
    cmd = [args.python, *safe, str(HOTPATH), "--data", str(args.data), "--json", *extra]
    cmd += ["--calls", str(args.calls), "--rounds", str(args.inner_rounds)]
    cmd += ["--batches", str(args.batches)]
    # bytecode goes to the scratch folder: neither tree gets written to
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONPYCACHEPREFIX": str(workdir / "pyc")}
    out = subprocess.run(
        cmd, cwd=workdir, env=env, capture_output=True, text=True, check=False, timeout=900
    )
    if out.returncode:
        raise SystemExit(f"hotpath under {tree} failed:\n{out.stderr.strip()}")
    if "--prepare" in extra:
        return {}
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    where = Path(result["meta"]["shardcat_file"])
    if where != (tree / "shardcat").resolve():
        raise SystemExit(f"the run meant for {tree} imported shardcat from {where}")
    return result


def med(runs: list[dict[str, Any]], name: str, stat: str = "median_ns") -> float:
    return statistics.median(r[stat][name] for r in runs)


def us(ns: float) -> str:
    return f"{ns / 1e3:.2f} µs"


def x(ratio: float) -> str:
    return f"{ratio:.2f}"


def table(
    base_runs: list[dict[str, Any]],
    new_runs: list[dict[str, Any]],
    before: str,
    after: str,
) -> str:
    meta = new_runs[0]["meta"]
    out = [
        f"Hot path, before = `{before}`, after = `{after}`.",
        f"{meta['records']:,} records x {meta['image_bytes']} B image in {meta['shards']} "
        f"TFRecord shards, warm page cache; {len(base_runs)} rounds of one fresh process per "
        f"tree (before, after, before, ...); per run {meta['calls']:,} random records x "
        f"{meta['rounds']} rounds per single-call measurement, {meta['batches']} x "
        f"{meta['rounds']} batches of {meta['batch']:,}. Python {meta['python']}, "
        f"SQLite {meta['sqlite']}. Medians over rounds; ratios below 1 mean faster.",
        "",
        "| measurement | before | after | after / before | per round | before / tfd-utils "
        "| after / tfd-utils | before / floor | after / floor |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for line in LINES:
        b, a = med(base_runs, line.name), med(new_runs, line.name)
        pairs = [n["median_ns"][line.name] / o["median_ns"][line.name]
                 for o, n in zip(base_runs, new_runs, strict=True)]  # fmt: skip
        cells = [line.label, us(b), us(a), f"**{x(a / b)}**", f"{x(min(pairs))}-{x(max(pairs))}"]
        for ref in (line.tfd, line.floor):
            if ref is None:
                cells += ["", ""]
            else:
                cells += [x(b / med(base_runs, ref)), x(a / med(new_runs, ref))]
        out.append("| " + " | ".join(cells) + " |")
    out += [
        "",
        "tfd-utils column: `get_feature` against its `get_feature`, the others against its "
        "`get_record`. Floor: a plain `sqlite3` point query (by `dataset_id, key`, or by "
        "`shard_id, ordinal`) + `os.pread` + `Example.FromString`. Control rows run the same "
        "code in both trees: how far they move is the noise between runs.",
        "",
        "| position / key | before | after |",
        "| --- | ---: | ---: |",
    ]
    for label, pos, key in POSITION_VS_KEY:
        b = med(base_runs, pos) / med(base_runs, key)
        a = med(new_runs, pos) / med(new_runs, key)
        out.append(f"| {label} | {x(b)} | {x(a)} |")
    out += ["", "| p90 of single calls | before | after | after / before |",
            "| --- | ---: | ---: | ---: |"]  # fmt: skip
    for name in P90:
        b, a = med(base_runs, name, "p90_ns"), med(new_runs, name, "p90_ns")
        out.append(f"| `{name}` | {us(b)} | {us(a)} | {x(a / b)} |")
    return "\n".join(out) + "\n"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.versus",
        description="Hot-path latency, base revision vs a working tree, interleaved runs.",
    )
    p.add_argument("--base", default="f548e4c", help="revision to compare against")
    p.add_argument("--new", default=str(ROOT), help="tree to measure (default: this one)")
    p.add_argument("--rounds", type=int, default=5, help="runs per tree, interleaved")
    p.add_argument(
        "--data", default=str(ROOT / "benchmarks" / "data" / "hotpath-20000x1024b-4shards")
    )
    p.add_argument("--calls", type=int, default=5_000, help="per run: records per single pass")
    p.add_argument("--inner-rounds", type=int, default=3, help="per run: timed rounds")
    p.add_argument("--batches", type=int, default=20, help="per run: get_many batches a round")
    p.add_argument("--python", default=sys.executable, help="interpreter for the runs")
    p.add_argument("--out", help="also write the table to this file")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    new = Path(args.new).resolve()
    if not (new / "shardcat").is_dir():
        raise SystemExit(f"{new} holds no shardcat package")
    base_rev = git(ROOT, "rev-parse", "--verify", f"{args.base}^{{commit}}")
    before = git(ROOT, "log", "-1", "--format=%h %s", base_rev)
    after = describe(new)
    work = Path(tempfile.mkdtemp(prefix="shardcat-versus-"))
    base = work / "base"
    git(ROOT, "worktree", "add", "--detach", "--quiet", str(base), base_rev)
    try:
        print(f"before: {before}\nafter:  {after}", file=sys.stderr, flush=True)
        hotpath(new, args, work, "--prepare")  # shards + tfd-utils index, once
        base_runs: list[dict[str, Any]] = []
        new_runs: list[dict[str, Any]] = []
        for r in range(args.rounds):
            for label, tree, runs in (("before", base, base_runs), ("after", new, new_runs)):
                runs.append(hotpath(tree, args, work))
                got = runs[-1]["median_ns"]
                print(
                    f"round {r + 1}/{args.rounds} {label}: get_feature "
                    f"{got['get_feature'] / 1e3:.2f} µs, get_record_at "
                    f"{got['get_record_at'] / 1e3:.2f} µs",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        removed = subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
            capture_output=True,
            text=True,
            check=False,
        )
        shutil.rmtree(work, ignore_errors=True)
        if removed.returncode:
            print(
                f"could not remove the base worktree ({removed.stderr.strip()}); "
                "`git worktree prune` clears its entry",
                file=sys.stderr,
            )
    text = table(base_runs, new_runs, before, after)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
