"""TensorBlob and TensorDB side by side with the tensorblob package and a raw numpy.memmap.

    python -m benchmarks.storage_bench            # full sizes
    python -m benchmarks.storage_bench --quick    # small sizes, a few seconds
    python -m benchmarks.storage_bench --step where   # the TensorDB rows only

Every measurement runs its contenders round-robin (A, B, C, A, B, C, ...) in
one process and reports medians, so a noisy neighbour slows all of them
alike. ``numpy.memmap`` of one flat file is the physical reference: no
blocks, no metadata, no bounds checks. The ratio column is shardcat's time
over the other's (below 1: shardcat is faster). The TensorDB write also runs
``sqlite``: raw ``sqlite3`` writing the same rows into the same ``rows`` table
(:func:`sqlite_floor_write`), the floor of a synchronous SQL mirror.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import util
from shardcat import TensorBlob, TensorDB
from shardcat.catalog.sqlite import value_groups

Contender = Callable[[], Any]


@dataclass(frozen=True)
class Config:
    rows: int = 100_000  # write / read / random access: rows of `dim` float32
    dim: int = 768
    block_size: int = 8192
    write_batch: int = 1024
    single_writes: int = 3_000
    random_reads: int = 20_000
    gather_rows: int = 512
    gathers: int = 100
    open_blocks: int = 10_000
    open_repeats: int = 15
    where_rows: int = 1_000_000
    db_writes: int = 5  # interleaved TensorDB writes of `where_rows` rows per contender
    repeats: int = 7


QUICK = Config(
    rows=10_000,
    dim=256,
    block_size=1024,
    single_writes=500,
    random_reads=2_000,
    gathers=20,
    open_blocks=1_000,
    open_repeats=5,
    where_rows=100_000,
    db_writes=3,
    repeats=3,
)


@dataclass
class Result:
    name: str
    unit: str
    values: dict[str, float] = field(default_factory=dict)  # contender -> seconds per unit
    scale: float = 1.0  # seconds per unit -> shown unit
    note: str = ""


def _tensorblob() -> Any:
    try:
        import tensorblob
    except ImportError:
        return None
    return tensorblob


def sqlite_floor_write(path: Path, columns: dict[str, torch.Tensor]) -> None:
    """What TensorDB's SQL mirror of a first write costs at the least, in raw ``sqlite3``.

    The same file settings (WAL, ``synchronous = NORMAL``) and ``rows`` table
    (``position`` as rowid, ``key`` with the partial unique index, one column
    per field), one transaction: the values as Python numbers, multi-row
    ``VALUES`` inserts, then one index build per field. No block files, no
    metadata tables, no checks.
    """
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        names = list(columns)
        types = ["REAL" if t.is_floating_point() else "INTEGER" for t in columns.values()]
        fields = "".join(f", {n} {t}" for n, t in zip(names, types, strict=True))
        conn.execute(f"CREATE TABLE rows (position INTEGER PRIMARY KEY, key TEXT{fields})")
        conn.execute("CREATE UNIQUE INDEX rows_key ON rows (key) WHERE key IS NOT NULL")
        conn.execute("BEGIN IMMEDIATE")
        values = [t.reshape(-1).tolist() for t in columns.values()]
        n = len(values[0])
        head = f"INSERT INTO rows (position, {', '.join(names)}) VALUES "
        for sql, groups in value_groups([range(n), *values], n):
            conn.executemany(head + sql, groups)
        for name in names:
            conn.execute(f"CREATE INDEX rows_{name} ON rows ({name})")
        conn.execute("COMMIT")
    finally:
        conn.close()


def round_robin(
    contenders: dict[str, Contender], repeats: int, made: list[Path] | None = None
) -> dict[str, float]:
    """Median seconds of each contender's call, interleaved (rotating the start, gc first).

    With ``made`` (paths the contenders write), each call starts untimed by
    deleting them and syncing, so no contender pays for another's dirty pages
    (the kernel throttles writers once enough are waiting for the disk).
    """

    def before_each() -> None:
        gc.collect()
        if made:
            _remove(made)
            os.sync()

    return util.round_robin(contenders, repeats, before_each, rotate=True)


def _remove(made: list[Path]) -> None:
    """Delete the files and directories in ``made``, and empty it."""
    for path in made:
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink()
    made.clear()


class Bench:
    def __init__(self, cfg: Config, root: Path) -> None:
        self.cfg = cfg
        self.root = root
        self.tb = _tensorblob()
        gen = torch.Generator().manual_seed(0)
        self.data = torch.randn(cfg.rows, cfg.dim, generator=gen)
        self.row_bytes = cfg.dim * 4
        self.results: list[Result] = []
        self._n = 0

    def fresh(self, name: str) -> Path:
        self._n += 1
        return self.root / f"{name}-{self._n}"

    def classes(self) -> dict[str, Any]:
        found: dict[str, Any] = {"shardcat": TensorBlob}
        if self.tb is not None:
            found["tensorblob"] = self.tb.TensorBlob
        return found

    # -- contenders writing ------------------------------------------------------------------

    def _write_blob(self, cls: Any, path: Path) -> None:
        cfg = self.cfg
        with cls.open(path, "w", dtype="float32", shape=cfg.dim, block_size=cfg.block_size) as b:
            for i in range(0, cfg.rows, cfg.write_batch):
                b.write(self.data[i : i + cfg.write_batch])

    def _write_memmap(self, path: Path) -> None:
        cfg = self.cfg
        mm = np.memmap(path, dtype=np.float32, mode="w+", shape=(cfg.rows, cfg.dim))
        src = self.data.numpy()
        for i in range(0, cfg.rows, cfg.write_batch):
            mm[i : i + cfg.write_batch] = src[i : i + cfg.write_batch]
        del mm

    def write_throughput(self) -> None:
        made: list[Path] = []

        def blob(cls: Any, name: str) -> Contender:
            def run() -> None:
                made.append(self.fresh(name))
                self._write_blob(cls, made[-1])

            return run

        def memmap() -> None:
            made.append(self.fresh("memmap").with_suffix(".f32"))
            self._write_memmap(made[-1])

        contenders = {n: blob(c, n) for n, c in self.classes().items()}
        contenders["memmap"] = memmap
        seconds = round_robin(contenders, self.cfg.repeats, made)
        mb = self.cfg.rows * self.row_bytes / 1e6
        self.results.append(
            Result(
                f"write {self.cfg.rows:,} x {self.cfg.dim} float32, {self.cfg.write_batch} a call",
                "ms/100MB",
                {k: v / mb * 100 for k, v in seconds.items()},
                1e3,
            )
        )
        _remove(made)

    def single_row_writes(self) -> None:
        n, cfg = self.cfg.single_writes, self.cfg
        rows = self.data[:n]

        def blob(cls: Any, name: str) -> Contender:
            def run() -> None:
                path = self.fresh(name)
                with cls.open(path, "w", dtype="float32", shape=cfg.dim) as b:
                    for i in range(n):
                        b.write(rows[i])
                shutil.rmtree(path)

            return run

        def memmap() -> None:
            path = self.fresh("memmap")
            mm = np.memmap(path, dtype=np.float32, mode="w+", shape=(n, cfg.dim))
            src = rows.numpy()
            for i in range(n):
                mm[i] = src[i]
            del mm
            path.unlink()

        contenders = {k: blob(c, k) for k, c in self.classes().items()}
        contenders["memmap"] = memmap
        seconds = round_robin(contenders, self.cfg.repeats)
        self.results.append(
            Result(
                "write one row at a time",
                "us/row",
                {k: v / n for k, v in seconds.items()},
                1e6,
                "both commit at close (shardcat: one SQLite transaction); no flush between rows",
            )
        )

    # -- contenders reading ------------------------------------------------------------------

    def reading(self) -> None:
        cfg = self.cfg
        opened: dict[str, Any] = {}
        for name, cls in self.classes().items():
            path = self.fresh(name)
            self._write_blob(cls, path)
            opened[name] = cls.open(path, "r")
        path = self.fresh("memmap")
        self._write_memmap(path)
        mm = np.memmap(path, dtype=np.float32, mode="r", shape=(cfg.rows, cfg.dim))
        try:
            self._sequential(opened, mm)
            self._random_rows(opened, mm)
            self._gather(opened, mm)
        finally:
            for b in opened.values():
                b.close()
            del mm

    def _sequential(self, opened: dict[str, Any], mm: np.memmap) -> None:
        cfg = self.cfg
        step = cfg.block_size

        def blob(b: Any) -> Contender:
            def run() -> None:
                for i in range(0, cfg.rows, step):
                    b[i : i + step]

            return run

        def memmap() -> None:
            for i in range(0, cfg.rows, step):
                torch.from_numpy(np.array(mm[i : i + step]))

        contenders = {k: blob(b) for k, b in opened.items()}
        contenders["memmap"] = memmap
        for c in contenders.values():
            c()  # warm the page cache and the block caches
        seconds = round_robin(contenders, cfg.repeats)
        mb = cfg.rows * self.row_bytes / 1e6
        self.results.append(
            Result(
                f"sequential read ({step}-row slices)",
                "ms/100MB",
                {k: v / mb * 100 for k, v in seconds.items()},
                1e3,
            )
        )

    def _random_rows(self, opened: dict[str, Any], mm: np.memmap) -> None:
        cfg = self.cfg
        picks = np.random.default_rng(1).integers(0, cfg.rows, cfg.random_reads).tolist()

        def blob(b: Any) -> Contender:
            def run() -> None:
                for i in picks:
                    b[i]

            return run

        def memmap() -> None:
            for i in picks:
                torch.from_numpy(np.array(mm[i]))

        contenders = {k: blob(b) for k, b in opened.items()}
        contenders["memmap"] = memmap
        seconds = round_robin(contenders, cfg.repeats)
        self.results.append(
            Result(
                "random single row blob[i]",
                "us/row",
                {k: v / len(picks) for k, v in seconds.items()},
                1e6,
            )
        )

    def _gather(self, opened: dict[str, Any], mm: np.memmap) -> None:
        cfg = self.cfg
        rng = np.random.default_rng(2)
        batches = [rng.integers(0, cfg.rows, cfg.gather_rows) for _ in range(cfg.gathers)]
        as_lists = [b.tolist() for b in batches]

        def blob(b: Any) -> Contender:
            def run() -> None:
                for idx in as_lists:
                    b[idx]

            return run

        def memmap() -> None:
            for idx in batches:
                torch.from_numpy(mm[idx])

        contenders = {k: blob(b) for k, b in opened.items()}
        contenders["memmap"] = memmap
        seconds = round_robin(contenders, cfg.repeats)
        n = cfg.gather_rows * cfg.gathers
        self.results.append(
            Result(
                f"batch gather blob[list of {cfg.gather_rows}]",
                "us/row",
                {k: v / n for k, v in seconds.items()},
                1e6,
            )
        )

    # -- opening ---------------------------------------------------------------------------

    def open_many_blocks(self) -> None:
        cfg = self.cfg
        block, dim = 16, 16
        n = cfg.open_blocks * block
        data = torch.randn(n, dim)
        paths: dict[str, Path] = {}
        for name, cls in self.classes().items():
            paths[name] = self.fresh(name)
            with cls.open(paths[name], "w", dtype="float32", shape=dim, block_size=block) as b:
                b.write(data)
        flat = self.fresh("memmap")
        data.numpy().tofile(flat)

        def blob(cls: Any, path: Path) -> Contender:
            def run() -> None:
                with cls.open(path, "r") as b:
                    b[n - 1]

            return run

        def memmap() -> None:
            mm = np.memmap(flat, dtype=np.float32, mode="r", shape=(n, dim))
            torch.from_numpy(np.array(mm[n - 1]))
            del mm

        contenders = {k: blob(c, paths[k]) for k, c in self.classes().items()}
        contenders["memmap"] = memmap
        seconds = round_robin(contenders, cfg.open_repeats)
        self.results.append(
            Result(
                f"open a blob of {cfg.open_blocks:,} blocks + read its last row",
                "ms",
                seconds,
                1e3,
                "memmap: one flat file",
            )
        )

    # -- SQL filtering ----------------------------------------------------------------------

    def where(self) -> None:
        cfg = self.cfg
        n = cfg.where_rows
        gen = torch.Generator().manual_seed(3)
        price = (torch.rand(n, 1, generator=gen) * 200).to(torch.float32)
        label = torch.randint(0, 10, (n, 1), generator=gen)
        schema = {
            "price": ("float32", 1, {"index": True}),
            "label": ("int64", 1, {"index": True}),
        }
        plain = {"price": ("float32", 1), "label": ("int64", 1)}
        made: list[Path] = []

        def ours_write() -> None:
            made.append(self.fresh("shardcat-db"))
            with TensorDB.open(made[-1], "w", schema=schema) as db:
                db.write({"price": price, "label": label})

        def theirs_write() -> None:
            made.append(self.fresh("tensorblob-db"))
            with self.tb.TensorDB.open(made[-1], "w", schema=plain) as t:
                t.write({"price": price, "label": label})

        def memmap_write() -> None:
            made.append(self.fresh("memmap"))
            made[-1].mkdir()
            price.numpy().tofile(made[-1] / "price")
            label.numpy().tofile(made[-1] / "label")

        def sqlite_write() -> None:
            made.append(self.fresh("sqlite") / "rows.sqlite")
            made[-1].parent.mkdir()
            sqlite_floor_write(made[-1], {"price": price, "label": label})
            made[-1] = made[-1].parent

        writers: dict[str, Contender] = {"shardcat": ours_write}
        if self.tb is not None:
            writers["tensorblob"] = theirs_write
        writers["memmap"] = memmap_write
        writers["sqlite"] = sqlite_write
        setup = round_robin(writers, cfg.db_writes, made)
        _remove(made)
        ours_write()
        db = TensorDB.open(made[-1], "r")
        theirs = None
        if self.tb is not None:
            theirs_write()
            theirs = self.tb.TensorDB.open(made[-1], "r")
        memmap_write()
        flat = {k: made[-1] / k for k in ("price", "label")}
        self.results.append(
            Result(
                f"write {n:,} rows of 2 scalar fields",
                "ms",
                setup,
                1e3,
                "shardcat also mirrors both into indexed SQL columns; sqlite: raw sqlite3 "
                "writing the same SQL rows (the floor of the mirror)",
            )
        )
        queries = {
            "price > 100 AND label = 3": lambda p, lab: (p > 100) & (lab == 3),
            # 199.75 is exact in float32: SQL compares doubles, torch/numpy float32
            "price > 199.75": lambda p, lab: p > 199.75,
        }
        try:
            for sql, mask in queries.items():
                expected = db.where(sql)
                contenders: dict[str, Contender] = {"shardcat": lambda s=sql: db.where(s)}
                if theirs is not None:

                    def tensorblob_user(m: Any = mask, t: Any = theirs) -> list[int]:
                        # what a tensorblob user does: read the columns, filter in torch
                        cols = t[0 : len(t)]
                        hit = m(cols["price"].view(-1), cols["label"].view(-1))
                        return hit.nonzero().view(-1).tolist()

                    contenders["tensorblob"] = tensorblob_user
                    _check_same("tensorblob", sql, tensorblob_user(), expected)

                def numpy_memmap(m: Any = mask) -> list[int]:
                    p = np.memmap(flat["price"], dtype=np.float32, mode="r")
                    lab = np.memmap(flat["label"], dtype=np.int64, mode="r")
                    return np.flatnonzero(m(p, lab)).tolist()

                contenders["memmap"] = numpy_memmap
                _check_same("memmap", sql, numpy_memmap(), expected)
                seconds = round_robin(contenders, cfg.repeats)
                self.results.append(
                    Result(
                        f"where({sql!r}) over {n:,} rows -> {len(expected):,}",
                        "ms",
                        seconds,
                        1e3,
                        "tensorblob: read columns + torch mask; memmap: numpy mask",
                    )
                )
        finally:
            db.close()
            if theirs is not None:
                theirs.close()

    # -- report ------------------------------------------------------------------------------

    def steps(self) -> dict[str, Callable[[], None]]:
        return {
            "write_throughput": self.write_throughput,
            "single_row_writes": self.single_row_writes,
            "reading": self.reading,
            "open_many_blocks": self.open_many_blocks,
            "where": self.where,  # TensorDB: the write and where()
        }

    def run(self, only: list[str] | None = None) -> list[Result]:
        for name, step in self.steps().items():
            if only and name not in only:
                continue
            print(f"... {step.__name__}", flush=True)
            step()
        return self.results


def _check_same(who: str, sql: str, got: list[int], expected: list[int]) -> None:
    if got != expected:
        diff = sorted(set(got) ^ set(expected))[:5]
        raise RuntimeError(
            f"{who} finds {len(got)} rows for {sql!r}, shardcat {len(expected)} (e.g. {diff})"
        )


def _ratio(ours: float, other: float | None) -> str:
    if other is None or other == 0:
        return "-"
    return f"{ours / other:.3g}"


def format_table(results: list[Result]) -> str:
    others = ["tensorblob", "memmap"]
    if any("sqlite" in r.values for r in results):
        others.append("sqlite")
    short = {"tensorblob": "tb", "memmap": "memmap", "sqlite": "sqlite"}
    header = ["benchmark", "unit", "shardcat", *others, *(f"sc/{short[o]}" for o in others)]
    lines = [header]
    for r in results:
        v = {k: x * r.scale for k, x in r.values.items()}
        line = [r.name, r.unit, f"{v['shardcat']:.1f}"]
        line += ["-" if v.get(o) is None else f"{v[o]:.1f}" for o in others]
        line += [_ratio(v["shardcat"], v.get(o)) for o in others]
        lines.append(line)
    out = ["| " + " | ".join(line) + " |" for line in lines]
    out.insert(1, "|" + "|".join(" --- " for _ in header) + "|")
    notes = [f"- {r.name}: {r.note}" for r in results if r.note]
    return "\n".join(out + (["", *notes] if notes else []))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--dir", help="where to write the blobs (default: a temp dir)")
    parser.add_argument(
        "--step",
        action="append",
        choices=["write_throughput", "single_row_writes", "reading", "open_many_blocks", "where"],
        help="run only this step (repeatable; default: all)",
    )
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else Config()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="storage-bench-") as tmp:
        bench = Bench(cfg, Path(tmp))
        if bench.tb is None:
            print("tensorblob is not installed (pip install tensorblob==0.3.0): shardcat vs memmap")
        results = bench.run(args.step)
    print()
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; medians; sc/x < 1: shardcat faster")
    print(format_table(results))


if __name__ == "__main__":
    main()
