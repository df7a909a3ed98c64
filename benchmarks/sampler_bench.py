"""Training-loop read throughput (issue 15): samples/s through a ``DataLoader`` over a
1M-record dataset, with ``RecordSampler`` (sequential, ``"block"``, ``"full"``) vs
torch's ``DistributedSampler`` over the same ``RecordDataset``, and vs tfd-utils'
reader wrapped in a map-style dataset, at ``num_workers`` 0 and 2; every read is
checked (the default), and ``RecordSampler block`` also runs with ``verify=False``.

Every contender is one rank of 4 (``num_replicas=4, rank=1``), batch 256, and
reads ``--samples`` samples per timed run; items are the decoded record's
``label`` (both readers decode the whole Example). The contenders run
interleaved (rotating order) for ``--rounds`` rounds after the files are warm;
the table has medians and ratios to ``DistributedSampler`` over the same
``RecordDataset`` at the same worker count, and to tfd-utils reading the same order
(every order runs over both readers: like against like).

The second table is the cost of the order alone (no reads) at 100M records:
seconds and memory (tracemalloc's peak) to the first index of an epoch, and
per-rank indices per second.

Data: 8 shards of 125,000 tiny records (a 20-character key and an int64
label), written once under ``benchmarks/data/sampler-1000000`` with the
catalog and tfd-utils' index beside them.

Run: ``python -m benchmarks.sampler_bench [--rounds 3] [--samples 100000]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.scale import SHARD, key_of, warm, write_shard
from benchmarks.util import print_table, quiet
from shardcat import Catalog
from shardcat.torch import RecordDataset, RecordSampler

DATA = Path(__file__).resolve().parent / "data"
RECORDS = 1_000_000
WORLD, RANK, BATCH = 4, 1, 256


def prepare() -> tuple[Path, Path, Path]:
    """(shard directory, catalog, tfd-utils index), made once."""
    directory = DATA / f"sampler-{RECORDS}"
    directory.mkdir(parents=True, exist_ok=True)
    for s in range(RECORDS // SHARD):
        path = directory / f"shard-{s:05d}.tfrecord"
        if not path.exists():
            write_shard(path, "sequential", s * SHARD, SHARD)
    catalog = DATA / f"sampler-{RECORDS}.sqlite"
    if not catalog.exists():
        with Catalog(catalog) as cat:
            cat.ingest(str(directory / "*.tfrecord"), "d", workers=2).close()
    return directory, catalog, DATA / f"sampler-{RECORDS}.tfd-index"


def label(example: Any) -> int:
    return int(example.features.feature["label"].int64_list.value[0])


class TfdDataset:
    """tfd-utils' reader as a map-style dataset: item i is record ``key_of(i)``."""

    def __init__(self, pattern: str, index: Path) -> None:
        from tfd_utils import TFRecordRandomAccess

        with quiet():  # use_pread: tfd-utils' mode for forked DataLoader workers
            self.reader = TFRecordRandomAccess(
                pattern, index_file=str(index), progress_interval=10**9, use_pread=True
            )
            len(self.reader)  # build (once) or load the index now

    def __len__(self) -> int:
        return RECORDS

    def __getitem__(self, i: int) -> int:
        return label(self.reader.get_record(key_of("sequential", i).decode()))


def contenders(
    reader: Any, unchecked: Any, tfd: TfdDataset, samples: int
) -> dict[str, Callable[[], int]]:
    """``unchecked``: the same dataset's reader with ``verify=False`` (trusting the
    bytes; ``reader`` checks every read, the default)."""
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    ours = RecordDataset(reader, transform=label)
    trusted = RecordDataset(unchecked, transform=label)
    assert [ours[i] for i in (0, 7, RECORDS - 1)] == [tfd[i] for i in (0, 7, RECORDS - 1)]
    runs: dict[str, Callable[[], int]] = {}
    epoch = [0]

    def run(dataset: Any, sampler: Any, workers: int) -> Callable[[], int]:
        def go() -> int:
            epoch[0] += 1
            sampler.set_epoch(epoch[0])
            loader = DataLoader(
                dataset, sampler=sampler, batch_size=BATCH, num_workers=workers,
                collate_fn=list, multiprocessing_context="fork" if workers else None,
            )  # fmt: skip
            got = 0
            for batch in loader:
                got += len(batch)
                if got >= samples:
                    break
            return got

        return go

    torch.manual_seed(0)
    for workers in (0, 2):
        # every order over both readers: each shardcat row is compared with tfd-utils
        # reading the same order (sequential with sequential, block with block ...)
        for dataset, prefix in ((ours, ""), (tfd, "tfd-utils + ")):
            for shuffle in (False, "block", "full"):
                sampler = RecordSampler(dataset, WORLD, RANK, seed=1, shuffle=shuffle)
                runs[f"{prefix}RecordSampler {shuffle or 'sequential'}, w={workers}"] = run(
                    dataset, sampler, workers
                )
            dist = DistributedSampler(dataset, WORLD, RANK, shuffle=True, seed=1)  # type: ignore[arg-type]
            runs[f"{prefix}DistributedSampler, w={workers}"] = run(dataset, dist, workers)
        block = RecordSampler(trusted, WORLD, RANK, seed=1, shuffle="block")
        runs[f"RecordSampler block verify=False, w={workers}"] = run(trusted, block, workers)
    return runs


def order_cost(n: int) -> list[tuple[str, str, str, str, str]]:
    """Seconds to the first index, the memory it took (tracemalloc's peak) and indices/s
    of rank 3 of 8, no reads, ``n`` records; torch's ``DistributedSampler`` at
    ``min(n, 10M)`` (it builds a Python list of all)."""
    import tracemalloc

    from torch.utils.data import DistributedSampler

    class Sized:
        def __init__(self, n: int) -> None:
            self.n = n

        def __len__(self) -> int:
            return self.n

        def shard_starts(self) -> list[int]:
            return list(range(0, self.n, SHARD))

    small = min(n, 10_000_000)
    samplers: list[tuple[str, int, Any]] = [
        (f"RecordSampler {shuffle or 'sequential'}", n, RecordSampler(Sized(n), 8, 3, seed=1,
         shuffle=shuffle)) for shuffle in (False, "block", "full")
    ]  # fmt: skip
    samplers.append(("DistributedSampler", small, DistributedSampler(Sized(small), 8, 3)))  # type: ignore[arg-type]
    rows = []
    for name, size, sampler in samplers:
        tracemalloc.start()
        start = time.perf_counter()
        it = iter(sampler)
        next(it)
        first = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        count, start = 0, time.perf_counter()
        for _ in it:
            count += 1
            if count >= 2_000_000:
                break
        rate = count / (time.perf_counter() - start)
        rows.append((name, f"{size:,}", f"{first:.3f}", f"{peak / 1e6:.1f}", f"{rate / 1e6:.1f}M"))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--samples", type=int, default=100_000)
    p.add_argument("--order-records", type=int, default=100_000_000)
    args = p.parse_args()
    directory, catalog, index = prepare()
    pattern = str(directory / "*.tfrecord")
    tfd = TfdDataset(pattern, index)
    warm(directory)
    for path in (catalog, index):
        with open(path, "rb") as f:
            while f.read(8 << 20):
                pass
    with (
        Catalog(catalog, readonly=True) as cat,
        cat.dataset("d") as reader,
        cat.dataset("d", verify=False) as unchecked,
    ):
        runs = contenders(reader, unchecked, tfd, args.samples)
        times: dict[str, list[float]] = {name: [] for name in runs}
        names = list(runs)
        for name in names:  # once untimed: forks, caches, the first order
            runs[name]()
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                start = time.perf_counter()
                got = runs[name]()
                times[name].append(got / (time.perf_counter() - start))
    rate = {name: statistics.median(t) for name, t in times.items()}
    rows = []
    for name in names:
        workers = name.rsplit("w=", 1)[1]
        base = rate[f"DistributedSampler, w={workers}"]
        # like against like: tfd-utils in the same order at the same worker count
        tfd_rate = rate[name if name.startswith("tfd-utils + ") else f"tfd-utils + {name}"]
        spread = f"{min(times[name]) / 1e3:.0f}-{max(times[name]) / 1e3:.0f}k"
        rows.append(
            (name, f"{rate[name] / 1e3:.0f}k", spread, f"{rate[name] / base:.2f}x",
             f"{rate[name] / tfd_rate:.2f}x")
        )  # fmt: skip
    head = f"{RECORDS:,} records, rank {RANK} of {WORLD}, batch {BATCH}"
    print(f"\n{head}, {args.samples:,} samples per run, median of {args.rounds}\n")
    print_table(
        ("contender", "samples/s", "range", "/ DistributedSampler", "/ tfd-utils, same order"),
        rows,
    )
    print("\nthe order alone, rank 3 of 8 (no reads)\n")
    print_table(
        ("sampler", "records", "s to first index", "MB to first index", "indices/s"),
        order_cost(args.order_records),
    )


if __name__ == "__main__":
    main()
