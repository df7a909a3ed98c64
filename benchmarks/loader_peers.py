"""The loader benchmark's streaming peers (issue 31): litData, Mosaic streaming and
webdataset, each fed the benchmark's records through its own writer once per run and
read back shuffled by its own dataset, 2 DataLoader workers, batches of 64, items the
dicts ``RecordDataset`` gives (``{"key": bytes, "label": int, "image": bytes}``).

They live in their own venv (``make peers-venv``, the ``peers`` extra; see
benchmarks/README.md): Mosaic pins numpy and google-cloud-storage below the project
venv's, and both pull PyPI's torchvision, a CUDA build that cannot load beside the CPU
torch. ``import streaming`` imports its torchvision datasets (``streaming.vision``),
so :func:`mosaic` stands an empty module in for that one subpackage.

- litData: ``optimize`` (one worker, 1 MB chunks) into ``root/litdata``, then its
  ``StreamingDataset(shuffle=True)`` and ``StreamingDataLoader``, as its docs show.
  1 MB, not the docs' 64 MB: 20,000 records of 1 KB would make one chunk, which 2
  workers read at about 6k records/s against 39-70k with 1 MB chunks (21 of them).
  Byte fields come back as memoryviews, which a worker cannot pickle to the main
  process (torch's DataLoader then hangs), so the batch's collate makes them bytes.
- Mosaic: ``MDSWriter`` (columns ``bytes``/``int``/``bytes``) into ``root/mosaic``, its
  ``StreamingDataset(local=..., shuffle=True, batch_size=64)`` (no remote) in a torch
  ``DataLoader``, as its docs show.
- webdataset: ``ShardWriter`` tar shards (one per 5,000 records) into ``root/webdataset``,
  ``WebDataset(shardshuffle=...)`` + ``shuffle(1000)`` + ``batched(64)`` in its
  ``WebLoader``: shards split between the workers, a sample buffer for the order.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import statistics
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

BATCH, WORKERS = 64, 2
FORK = "fork"  # as shardcat's contenders; litData's optimize would set "spawn" process-wide
LITDATA_CHUNK = "1MB"
WDS_PER_SHARD, WDS_BUFFER = 5000, 1000
NAMES = ("litdata", "mosaic", "webdataset")
Item = dict[str, Any]
Epoch = Callable[[], Iterable[list[Item]]]
"""One epoch's batches (a new shuffled order each call)."""


@contextlib.contextmanager
def _hushed() -> Iterator[None]:
    """Keep the writers' progress bars and notes off the benchmark's output."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def mosaic() -> types.ModuleType:
    """``streaming`` (Mosaic), without its torchvision datasets (see the module doc)."""
    if "streaming" not in sys.modules:
        sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
    return importlib.import_module("streaming")


def available() -> str | None:
    """None when every peer imports; else why not (the first ImportError)."""
    try:
        importlib.import_module("litdata")
        importlib.import_module("webdataset")
        mosaic()
    except ImportError as exc:
        return str(exc)
    return None


def _same(item: Item) -> Item:
    return item


def _bytes_batch(items: list[Item]) -> list[Item]:
    """litData's items with its memoryviews as bytes (what the other contenders give)."""
    return [{k: bytes(v) if isinstance(v, memoryview) else v for k, v in i.items()} for i in items]


def _litdata(records: Sequence[Item], out: Path) -> Epoch:
    import litdata

    with _hushed():
        litdata.optimize(
            fn=_same, inputs=list(records), output_dir=str(out), chunk_bytes=LITDATA_CHUNK,
            num_workers=1, mode="overwrite", verbose=False, start_method=FORK,
        )  # fmt: skip
    dataset = litdata.StreamingDataset(str(out), shuffle=True)
    loader = litdata.StreamingDataLoader(
        dataset, batch_size=BATCH, num_workers=WORKERS, collate_fn=_bytes_batch,
        multiprocessing_context=FORK,
    )  # fmt: skip
    return lambda: loader


def _mosaic(records: Sequence[Item], out: Path) -> Epoch:
    from torch.utils.data import DataLoader

    streaming = mosaic()
    columns = {"key": "bytes", "label": "int", "image": "bytes"}
    with streaming.MDSWriter(out=str(out), columns=columns) as writer:
        for record in records:
            writer.write(record)
    dataset = streaming.StreamingDataset(local=str(out), shuffle=True, batch_size=BATCH)
    return lambda: DataLoader(
        dataset, batch_size=BATCH, num_workers=WORKERS, collate_fn=list,
        multiprocessing_context=FORK,
    )  # fmt: skip


def _from_tars(samples: list[dict[str, Any]]) -> list[Item]:
    """A batch of webdataset's samples as items (in the batch's collate: ``map`` would
    keep its ``__key__``)."""
    return [{"key": s["key"], "label": int(s["label.cls"]), "image": s["image"]} for s in samples]


def _webdataset(records: Sequence[Item], out: Path) -> Epoch:
    import webdataset as wds

    out.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(out / "%05d.tar"), maxcount=WDS_PER_SHARD, verbose=0) as writer:
        for n, record in enumerate(records):
            writer.write(
                {"__key__": f"{n:09d}", "key": record["key"], "label.cls": record["label"],
                 "image": record["image"]}
            )  # fmt: skip
    urls = [str(p) for p in sorted(out.glob("*.tar"))]
    dataset = (
        wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False)
        .shuffle(WDS_BUFFER)
        .batched(BATCH, collation_fn=_from_tars)
    )
    return lambda: wds.WebLoader(
        dataset, batch_size=None, num_workers=WORKERS, multiprocessing_context=FORK
    )


def epochs(records: Sequence[Item], root: Path) -> dict[str, Epoch]:
    """Each peer's epoch over ``records``, written under ``root`` by the peer's own writer."""
    makers = {"litdata": _litdata, "mosaic": _mosaic, "webdataset": _webdataset}
    return {name: make(records, root / name) for name, make in makers.items()}


def one_epoch(epoch: Epoch) -> list[Item]:
    """Every item of one epoch, ordered by key (to compare with the records)."""
    return sorted((item for batch in epoch() for item in batch), key=lambda item: item["key"])


def contenders(records: Sequence[Item], root: Path) -> dict[str, Callable[[], int]]:
    """The benchmark's runs: one epoch each, counting the records it gave; each peer's
    first epoch must give exactly ``records``."""

    def counted(epoch: Epoch) -> Callable[[], int]:
        return lambda: sum(len(batch) for batch in epoch())

    runs = epochs(records, root)
    expected = sorted(records, key=lambda item: item["key"])
    for name, epoch in runs.items():
        if one_epoch(epoch) != expected:
            raise SystemExit(f"{name}'s items differ from shardcat's")
    return {name: counted(epoch) for name, epoch in runs.items()}


def report(rates: dict[str, list[float]], ours: Sequence[str]) -> None:
    """Each of ``ours``' records/s over each peer's in the same round: median (spread)."""
    for name in ours:
        cells = []
        for peer in NAMES:
            ratio = [a / b for a, b in zip(rates[name], rates[peer], strict=True)]
            cells.append(
                f"x {peer} {statistics.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})"
            )
        print(f"{name:18s} " + "  ".join(cells))
