"""The loader benchmark's streaming peers (benchmarks/loader_peers.py: litData, Mosaic
streaming, webdataset) give exactly shardcat's ``RecordDataset`` items, shuffled.

The peers live in their own venv (``make peers-venv``; ``make test`` runs this module
there with ``SHARDCAT_TEST_PEERS=1``, where a missing peer fails in CI). In any other
venv this module is skipped: the project venv cannot hold them (Mosaic pins numpy
and google-cloud-storage below it).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

from benchmarks import loader_peers
from shardcat import Catalog, TFRecordWriter, make_example
from shardcat.testing.required import missing, need

why = loader_peers.available()
if why is not None:
    if os.environ.get("SHARDCAT_TEST_PEERS") == "1":
        missing(f"the streaming peers (make peers-venv): {why}")
    pytest.skip(f"the streaming peers run in their own venv: {why}", allow_module_level=True)
need("torch", why="shardcat[torch]")

from shardcat.torch import RecordDataset  # noqa: E402 - after the skip

COUNTS = (150, 157)  # two TFRecord shards, 307 records: batches of 64 and a remainder
Item = dict[str, Any]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Item], dict[str, Any]]:
    """shardcat's items (position order) and each peer's epoch over them."""
    root = tmp_path_factory.mktemp("peers")
    rng = random.Random(31)
    for s, count in enumerate(COUNTS):
        with TFRecordWriter(root / f"part-{s}.tfrecord") as writer:
            for i in range(count):
                fields = {
                    "key": f"k{s}-{i:04d}".encode(),
                    "label": rng.randrange(1000),
                    "image": rng.randbytes(rng.randrange(1, 3000)),
                }
                writer.write(make_example(fields).SerializeToString())
    with (
        Catalog(root / "c.sqlite") as cat,
        cat.ingest(str(root / "part-*.tfrecord"), "d") as reader,
    ):
        dataset = RecordDataset(reader)
        items = dataset.__getitems__(list(range(len(dataset))))
    return items, loader_peers.epochs(items, root / "out")


def keys(items: list[Item]) -> list[bytes]:
    return [item["key"] for item in items]


@pytest.mark.parametrize("peer", loader_peers.NAMES)
def test_a_peer_gives_shardcats_items(written: tuple[list[Item], Any], peer: str) -> None:
    items, epochs = written
    assert len(items) == sum(COUNTS)
    assert {type(v) for item in items for v in item.values()} == {bytes, int}
    batches = list(epochs[peer]())
    assert all(0 < len(batch) <= loader_peers.BATCH for batch in batches)
    got = sorted((item for batch in batches for item in batch), key=lambda item: item["key"])
    assert got == sorted(items, key=lambda item: item["key"])
    assert [type(item["image"]) for item in got] == [bytes] * len(items)  # not memoryviews
    assert [type(item["label"]) for item in got] == [int] * len(items)


@pytest.mark.parametrize("peer", loader_peers.NAMES)
def test_a_peer_shuffles_each_epoch(written: tuple[list[Item], Any], peer: str) -> None:
    items, epochs = written
    first, second = ([i for b in epochs[peer]() for i in b] for _ in range(2))
    assert sorted(keys(first)) == sorted(keys(second)) == sorted(keys(items))
    assert keys(first) != keys(items)
    assert keys(first) != keys(second)


def test_the_benchmark_counts_each_peers_records(tmp_path: Path) -> None:
    rng = random.Random(7)
    items = [
        {"key": f"r{i:03d}".encode(), "label": i % 3, "image": rng.randbytes(100)}
        for i in range(130)
    ]
    runs = loader_peers.contenders(items, tmp_path)
    assert sorted(runs) == sorted(loader_peers.NAMES)
    assert {name: run() for name, run in runs.items()} == dict.fromkeys(loader_peers.NAMES, 130)
