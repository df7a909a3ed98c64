"""DataLoader records/s with items as dicts (issue 31, item 2): ``RecordDataset``
without a ``transform`` (items ``{feature: value}``) and ``RecordSampler`` ``"full"`` /
``"block"``, 2 forked workers, batch 64, against tfd-utils' reader in a map-style
dataset giving the same dicts, every contender interleaved in rotating order.

``python -m benchmarks.loader_bench [--data DIR] [--rounds 3]``: the shards and
tfd-utils' index of :mod:`benchmarks.hotpath` (made there once: ``--prepare``).
Contenders: ``native`` (the items straight off the checked payloads' wire),
``python`` (the same reader opened with ``SHARDCAT_NATIVE=0``: decoded Examples
converted by ``to_dict``), ``tfd-utils`` (``get_record`` then the same conversion),
``no reads`` (the same items held in a list: what the DataLoader itself costs, the
ceiling of every contender's records/s), and where they are installed (``make
peers-venv``) litData, Mosaic streaming and webdataset (:mod:`benchmarks.loader_peers`)
on the same records. Every file is read once before each round (this VM drops an idle
page cache within about a minute).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import loader_peers
from benchmarks.hotpath import DEFAULT_DATA, KEY_FORMAT, quiet, tfd_dict, warm

BATCH, WORKERS = 64, 2


class TfdDicts:
    """tfd-utils' reader as a map-style dataset: item i is record i as a dict."""

    def __init__(self, pattern: str, index: Path, n: int) -> None:
        from tfd_utils import TFRecordRandomAccess

        with quiet():
            self.reader = TFRecordRandomAccess(pattern, index_file=str(index), use_pread=True)
            len(self.reader)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return tfd_dict(self.reader.get_record(KEY_FORMAT % i))


class NoReads:
    """The items held in a list: the DataLoader's own cost (fork, pickling, queues)."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        return [self.items[i] for i in indices]


def _loader(dataset: Any, shuffle: str) -> Callable[[], int]:
    from torch.utils.data import DataLoader

    from shardcat.torch import RecordSampler

    sampler = RecordSampler(dataset, 1, 0, seed=1, shuffle=shuffle)
    epoch = [0]

    def go() -> int:
        epoch[0] += 1
        sampler.set_epoch(epoch[0])
        loader = DataLoader(
            dataset, sampler=sampler, batch_size=BATCH, num_workers=WORKERS,
            collate_fn=list, multiprocessing_context="fork",
        )  # fmt: skip
        return sum(len(batch) for batch in loader)

    return go


def main(argv: list[str] | None = None) -> None:
    from shardcat import Catalog
    from shardcat.torch import RecordDataset

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    data = Path(args.data)
    pattern = str(data / "*.tfrecord")
    with tempfile.TemporaryDirectory(prefix="shardcat-loader-") as tmp:
        cat = Catalog(Path(tmp) / "c.sqlite")
        native = cat.ingest(pattern, "d")
        os.environ["SHARDCAT_NATIVE"] = "0"
        python = cat.dataset("d")
        del os.environ["SHARDCAT_NATIVE"]
        tfd = TfdDicts(pattern, data / "tfd.index", len(native))
        ours, reference = RecordDataset(native), RecordDataset(python)
        sample = [0, 7, len(native) - 1]
        if ours.__getitems__(sample) != [tfd[i] for i in sample]:
            raise SystemExit("the contenders' items differ")
        items = ours.__getitems__(list(range(len(native))))  # every record's item
        held = NoReads(items)
        contenders = (("native", ours), ("python", reference), ("tfd-utils", tfd))
        runs = {
            f"{name} {shuffle}": _loader(dataset, shuffle)
            for shuffle in ("full", "block")
            for name, dataset in (*contenders, ("no reads", held))
        }
        missing = loader_peers.available()
        if missing is None:
            runs.update(loader_peers.contenders(items, Path(tmp)))
        else:
            print(f"without the streaming peers ({missing}): make peers-venv")
        files = [*data.glob("*.tfrecord"), data / "tfd.index", *Path(tmp).rglob("*")]
        rates: dict[str, list[float]] = {name: [] for name in runs}
        names = list(runs)
        for r in range(args.rounds + 1):  # round 0 warms the page cache
            warm([f for f in files if f.is_file()])
            for name in names[r % len(names) :] + names[: r % len(names)]:
                start = time.perf_counter()
                got = runs[name]()
                if r:
                    rates[name].append(got / (time.perf_counter() - start))
        for name, values in rates.items():
            shuffle = "block" if name.endswith(" block") else "full"
            ratio = [v / t for v, t in zip(values, rates[f"tfd-utils {shuffle}"], strict=True)]
            print(
                f"{name:18s} {statistics.median(values):9,.0f} rec/s  x tfd-utils "
                f"{statistics.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})"
            )
        if missing is None:
            loader_peers.report(rates, ["native full", "native block"])
        native.close()
        python.close()
        cat.close()


if __name__ == "__main__":
    main()
