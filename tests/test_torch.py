"""RecordDataset with torch's DataLoader: workers (fork and spawn), samplers, transforms."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shardcat import RecordDataset, TFRecordRandomAccess, TFRecordWriter, make_example
from shardcat.pb2 import Example
from shardcat.testing.required import need

torch = need("torch", why="shardcat[torch]")
from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402 - after importorskip


@dataclass(frozen=True)
class Rec:
    key: str
    label: int
    score: float
    image: bytes
    vec: list[float]
    raw: bytes


def write_shards(directory: Path, counts: tuple[int, ...], seed: int = 0) -> list[Rec]:
    """Shards ``part-NN.tfrecord``; records in position order."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    keys = [f"s{v:06x}" for v in rng.sample(range(16**6), sum(counts))]
    recs = []
    for s, count in enumerate(counts):
        with TFRecordWriter(directory / f"part-{s:02d}.tfrecord") as writer:
            for _ in range(count):
                fields = {
                    "key": keys[len(recs)],
                    "label": rng.randrange(5),
                    "score": rng.randrange(8) / 8,
                    "image": rng.randbytes(rng.randrange(20, 60)),
                    "vec": [rng.randrange(-50, 50) / 2 for _ in range(3)],
                }
                raw = make_example(fields).SerializeToString()
                writer.write(raw)
                recs.append(Rec(raw=raw, **fields))
    return recs


@pytest.fixture
def data(tmp_path: Path) -> tuple[str, list[Rec]]:
    """(glob, records) for 23 + 17 + 31 = 71 records (odd, so samplers pad)."""
    recs = write_shards(tmp_path / "shards", (23, 17, 31))
    return str(tmp_path / "shards" / "part-*.tfrecord"), recs


def check_item(item: dict[str, Any], rec: Rec) -> None:
    assert set(item) == {"key", "label", "score", "image", "vec"}
    assert item["key"] == rec.key.encode()
    assert item["image"] == rec.image  # exact bytes
    assert item["label"] == rec.label  # single values unwrapped
    assert item["score"] == rec.score
    assert list(item["vec"]) == rec.vec  # several values stay a list


def as_list(batch: list[Any]) -> list[Any]:
    """A collate_fn that keeps the samples as they are."""
    return list(batch)


def describe(example: Any) -> tuple[bool, bytes, bytes]:
    """A transform: what it received (must be the decoded Example)."""
    return (
        isinstance(example, Example),
        bytes(example.features.feature["key"].bytes_list.value[0]),
        example.SerializeToString(deterministic=True),
    )


def test_every_record_once_with_workers(data: tuple[str, list[Rec]]) -> None:
    pattern, recs = data
    by_key = {r.key.encode(): r for r in recs}
    with TFRecordRandomAccess(pattern) as reader:
        dataset = RecordDataset(reader)
        assert len(dataset) == 71
        check_item(dataset[0], recs[0])
        check_item(dataset[-1], recs[-1])

        items = list(DataLoader(dataset, batch_size=None, num_workers=2))
        assert len(items) == 71
        assert Counter(i["key"] for i in items) == Counter(list(by_key))  # each exactly once
        for item, rec in zip(items, recs, strict=True):  # in order, too
            check_item(item, rec)

        batches = list(
            DataLoader(
                dataset,
                batch_size=8,
                num_workers=2,
                collate_fn=as_list,
                shuffle=True,
                generator=torch.Generator().manual_seed(0),
            )
        )
        assert [len(b) for b in batches] == [8] * 8 + [7]
        flat = [item for batch in batches for item in batch]
        assert sorted(i["key"] for i in flat) == sorted(by_key)
        assert [i["key"] for i in flat] != [r.key.encode() for r in recs]  # really shuffled
        for item in flat:
            check_item(item, by_key[item["key"]])
        # the parent's reader is untouched by its workers
        assert reader.get_raw(recs[5].key) == recs[5].raw


def test_where_keys(data: tuple[str, list[Rec]]) -> None:
    pattern, recs = data
    with TFRecordRandomAccess(pattern) as reader:
        keys = reader.where("label = 3")
        wanted = [r for r in recs if r.label == 3]
        assert keys == [r.key for r in wanted] and len(keys) > 5
        dataset = RecordDataset(reader, keys=keys)
        assert len(dataset) == len(wanted)
        items = list(DataLoader(dataset, batch_size=None, num_workers=2))
        assert len(items) == len(wanted)
        for item, rec in zip(items, wanted, strict=True):
            check_item(item, rec)
        assert {i["label"] for i in items} == {3}


@pytest.mark.parametrize("rank", [0, 1])
def test_distributed_sampler(data: tuple[str, list[Rec]], rank: int) -> None:
    pattern, recs = data
    with TFRecordRandomAccess(pattern) as reader:
        dataset = RecordDataset(reader)
        samplers = [
            DistributedSampler(dataset, num_replicas=2, rank=r, shuffle=True, seed=0)
            for r in (0, 1)
        ]
        indices = [list(s) for s in samplers]
        assert [len(i) for i in indices] == [36, 36]
        together = Counter(indices[0] + indices[1])
        assert set(together) == set(range(71))  # a partition of every position...
        assert sorted(together.values()) == [1] * 70 + [2]  # ...padded by one duplicate
        assert indices[0] != sorted(indices[0])  # shuffled

        loader = DataLoader(dataset, batch_size=None, num_workers=2, sampler=samplers[rank])
        items = list(loader)
        assert len(items) == 36
        for item, position in zip(items, indices[rank], strict=True):
            check_item(item, recs[position])


def test_transform_receives_the_example(data: tuple[str, list[Rec]]) -> None:
    pattern, recs = data
    with TFRecordRandomAccess(pattern) as reader:
        dataset = RecordDataset(reader, transform=describe)
        assert dataset[3] == (
            True,
            recs[3].key.encode(),
            Example.FromString(recs[3].raw).SerializeToString(deterministic=True),
        )
        keyed = RecordDataset(reader, keys=[recs[40].key, recs[2].key], transform=describe)
        assert [keyed[i][1] for i in (0, 1)] == [recs[40].key.encode(), recs[2].key.encode()]
        out = list(DataLoader(dataset, batch_size=None, num_workers=2))
        assert len(out) == 71
        for (is_example, key, canonical), rec in zip(out, recs, strict=True):
            assert is_example is True
            assert key == rec.key.encode()
            assert canonical == Example.FromString(rec.raw).SerializeToString(deterministic=True)


def test_spawn_worker(tmp_path: Path) -> None:
    recs = write_shards(tmp_path / "small", (4, 3), seed=1)
    with TFRecordRandomAccess(str(tmp_path / "small" / "part-*.tfrecord")) as reader:
        dataset = RecordDataset(reader)
        loader = DataLoader(
            dataset, batch_size=None, num_workers=1, multiprocessing_context="spawn"
        )
        items = list(loader)
        assert len(items) == 7
        for item, rec in zip(items, recs, strict=True):
            check_item(item, rec)
        assert not reader.closed
        assert reader.get_raw(recs[-1].key) == recs[-1].raw
