"""Mixture: weighted mixtures of streams sampled by RecordSampler — exact per-epoch counts,
proportions within rounding, repeat/choose, the same order for any world size, elastic
resume, StatefulDataLoader exactness, and streams over real catalogs (a where subset,
another catalog)."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardcat import Catalog, SamplerError, SamplerStateError, TFRecordWriter, make_example
from shardcat.testing.required import need
from shardcat.torch import Mixture, RecordDataset, RecordSampler, Stream


def streams3(**kw: Any) -> list[Stream]:
    """Three plain streams: 60 a-items, 30 b-items, 10 c-items (lists are datasets)."""
    sizes = {"a": 60, "b": 30, "c": 10}
    return [Stream([f"{n}{i}" for i in range(size)], name=n, **kw) for n, size in sizes.items()]


def ranks(dataset: Any, world: int, **kw: Any) -> list[RecordSampler]:
    return [RecordSampler(dataset, num_replicas=world, rank=r, **kw) for r in range(world)]


def interleave(per_rank: list[list[Any]]) -> list[Any]:
    return [p[k] for k in range(len(per_rank[0])) for p in per_rank]


def take(sampler: RecordSampler, k: int) -> list[Any]:
    it = iter(sampler)
    return [next(it) for _ in range(k)]


def items(mixture: Mixture, pairs: list[tuple[int, int]]) -> list[str]:
    return [value for _, value in mixture.__getitems__(pairs)]


def test_weights_give_exact_counts_every_epoch() -> None:
    mixture = Mixture(
        [
            Stream(s.dataset, weight=w, name=s.name)
            for s, w in zip(streams3(), (0.5, 0.3, 0.2), strict=True)
        ],
        epoch_size=1000,
    )
    assert mixture.counts == [500, 300, 200] and len(mixture) == 1000
    sampler = RecordSampler(mixture, seed=3)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        pairs = list(sampler)
        assert Counter(s for s, _ in pairs) == {0: 500, 1: 300, 2: 200}
        got = items(mixture, pairs)
        # stream c (10 records) taken 200 times: each record exactly 20 times
        assert Counter(v for v in got if v[0] == "c") == {f"c{i}": 20 for i in range(10)}
        # stream a (60 records) 500 times: 8 whole passes and 20 distinct others
        a = Counter(v for v in got if v[0] == "a")
        assert sorted(Counter(a.values()).items()) == [(8, 40), (9, 20)]
    equal = Mixture([Stream(s.dataset, weight=1, name=s.name) for s in streams3()], epoch_size=100)
    assert equal.counts == [34, 33, 33]  # largest remainder, ties to the earlier stream
    assert Mixture([Stream(s.dataset, weight=1) for s in streams3()]).counts == [34, 33, 33]


@settings(max_examples=200, deadline=None)
@given(
    weights=st.lists(
        st.floats(0.001, 1000, allow_nan=False, allow_infinity=False), min_size=1, max_size=6
    ),
    epoch=st.integers(0, 100_000),
)
def test_proportions_within_rounding(weights: list[float], epoch: int) -> None:
    mixture = Mixture([Stream(range(7), weight=w) for w in weights], epoch_size=epoch)
    assert sum(mixture.counts) == epoch
    total = sum(Fraction(w) for w in weights)
    for count, w in zip(mixture.counts, weights, strict=True):
        assert abs(count - epoch * Fraction(w) / total) < 1


def test_repeat_and_choose() -> None:
    five, ten, four = (
        [f"f{i}" for i in range(5)],
        [f"t{i}" for i in range(10)],
        ["x", "y", "z", "w"],
    )
    mixture = Mixture(
        [
            Stream(five, repeat=2, name="five"),
            Stream(ten, choose=3, name="ten"),
            Stream(four, repeat=2.5, name="four"),
        ]
    )
    assert mixture.counts == [10, 3, 10]
    sampler = RecordSampler(mixture, seed=5)
    chosen = []
    for epoch in range(4):
        sampler.set_epoch(epoch)
        got = Counter(items(mixture, list(sampler)))
        assert {k: v for k, v in got.items() if k[0] == "f"} == {f: 2 for f in five}
        picked = {k: v for k, v in got.items() if k[0] == "t"}
        assert len(picked) == 3 and set(picked.values()) == {1}  # 3 distinct of 10
        chosen.append(frozenset(picked))
        assert sorted(v for k, v in got.items() if k in four) == [2, 2, 3, 3]
    assert len(set(chosen)) > 1  # another choice each epoch
    half = Mixture([Stream(ten, repeat=0.5), Stream(five, repeat=0)])
    assert half.counts == [5, 0]
    sampler = RecordSampler(half, seed=1)
    assert len(set(items(half, list(sampler)))) == 5  # half of them, each once
    scaled = Mixture([Stream(ten, choose=30), Stream(five, choose=10)], epoch_size=8)
    assert scaled.counts == [6, 2]  # absolute counts scaled to the epoch size


@pytest.mark.parametrize("shuffle", ["full", "block", False])
def test_the_order_does_not_depend_on_the_world_size(shuffle: Any) -> None:
    mixture = Mixture([Stream(s.dataset, weight=w, name=s.name) for s, w in
                       zip(streams3(), (5, 3, 2), strict=True)], epoch_size=120)  # fmt: skip
    kw = {"seed": 9, "shuffle": shuffle, "block_size": 8}
    alone = list(RecordSampler(mixture, **kw))
    assert len(alone) == 120
    for world in (3, 4):
        assert interleave([list(s) for s in ranks(mixture, world, **kw)])[:120] == alone


@pytest.mark.parametrize(("old", "new"), [(4, 3), (4, 6)])
def test_elastic_resume_mid_epoch(old: int, new: int) -> None:
    mixture = Mixture([Stream(s.dataset, weight=w, name=s.name) for s, w in
                       zip(streams3(), (5, 3, 2), strict=True)], epoch_size=301)  # fmt: skip
    kw = {"seed": 4}
    planned = list(RecordSampler(mixture, **kw))
    before = ranks(mixture, old, **kw)
    got = [take(s, 29) for s in before]
    state = before[1].state_dict()
    after = ranks(mixture, new, **kw)
    for s in after:
        s.load_state_dict(state)
    seen = interleave(got) + interleave([list(s) for s in after])
    assert seen[:301] == planned  # every planned item once, in the planned order
    assert seen[301:] == planned[: len(seen) - 301] and len(seen) - 301 < new  # padding only


def test_a_state_of_another_mixture_is_refused() -> None:
    one = Mixture([Stream(range(10), weight=1), Stream(range(20), weight=3)], epoch_size=40)
    other = Mixture([Stream(range(10), weight=3), Stream(range(20), weight=1)], epoch_size=40)
    sampler = RecordSampler(one, seed=2)
    take(sampler, 5)
    with pytest.raises(SamplerStateError, match="layout"):
        RecordSampler(other, seed=2).load_state_dict(sampler.state_dict())


def test_bad_mixtures() -> None:
    with pytest.raises(SamplerError, match="non-empty list of Stream"):
        Mixture([])
    with pytest.raises(SamplerError, match="every stream has a weight or none"):
        Mixture([Stream(range(3), weight=1), Stream(range(3))])
    with pytest.raises(SamplerError, match="repeat or choose, not both"):
        Mixture([Stream(range(3), repeat=1, choose=2)])
    with pytest.raises(SamplerError, match="weight must be a finite number >= 0, not -1"):
        Mixture([Stream(range(3), weight=-1)])
    with pytest.raises(SamplerError, match="needs a stream with a positive share"):
        Mixture([Stream(range(3), weight=0)])
    with pytest.raises(SamplerError, match="stream names must differ"):
        Mixture([Stream(range(3), name="x"), Stream(range(3), name="x")])
    with pytest.raises(SamplerError, match="epoch_size must be an integer >= 0"):
        Mixture([Stream(range(3))], epoch_size=-5)


# -- over real catalogs --------------------------------------------------------------


def write(path: Path, prefix: str, count: int) -> None:
    with TFRecordWriter(path) as writer:
        for i in range(count):
            features = {"key": f"{prefix}{i:03d}", "label": i % 4, "i": i}
            writer.write(make_example(features).SerializeToString())


@pytest.fixture
def two_catalogs(tmp_path: Path) -> tuple[Path, Path]:
    write(tmp_path / "web.tfrecord", "web", 40)
    write(tmp_path / "books.tfrecord", "book", 12)
    for name in ("web", "books"):
        with Catalog(tmp_path / f"{name}.sqlite") as cat:
            cat.ingest(str(tmp_path / f"{name}.tfrecord"), name, fields=["label", "i"]).close()
    return tmp_path / "web.sqlite", tmp_path / "books.sqlite"


def test_streams_from_two_catalogs_and_a_where_subset(two_catalogs: tuple[Path, Path]) -> None:
    web_catalog, books_catalog = two_catalogs
    with Catalog(web_catalog) as web, Catalog(books_catalog) as books:
        web_reader, books_reader = web.dataset("web"), books.dataset("books")
        label3 = web_reader.where("label = 3")
        assert len(label3) == 10

        def key_of(record: Any) -> str:
            value = web_reader.to_dict(record)["key"]
            return value.decode() if isinstance(value, bytes) else str(value)

        web_all = Stream(RecordDataset(web_reader, transform=key_of), weight=1, name="web")
        web3 = RecordDataset(web_reader, keys=label3, transform=key_of)
        book = Stream(RecordDataset(books_reader, transform=key_of), weight=2, name="books")
        mixture = Mixture([web_all, Stream(web3, weight=1, name="web-label3"), book], 48)
        assert mixture.counts == [12, 12, 24]
        sampler = RecordSampler(mixture, seed=1)
        got = mixture.__getitems__(list(sampler))
        assert Counter(name for name, _ in got) == {"web": 12, "web-label3": 12, "books": 24}
        assert all(key.startswith("web") for name, key in got if name == "web")
        assert {key for name, key in got if name == "web-label3"} <= set(label3)
        assert Counter(key for name, key in got if name == "books") == {
            f"book{i:03d}": 2 for i in range(12)
        }
        assert mixture[(2, 5)] == ("books", "book005")  # one item: (stream name, item)


def test_stateful_dataloader_resumes_a_mixture_exactly(two_catalogs: tuple[Path, Path]) -> None:
    need("torch", why="shardcat[torch]")
    sdl = need("torchdata.stateful_dataloader", why="shardcat[torch]")
    web_catalog, books_catalog = two_catalogs
    with Catalog(web_catalog) as web, Catalog(books_catalog) as books:
        web_reader, books_reader = web.dataset("web"), books.dataset("books")

        def number(record: Any) -> int:
            return int(web_reader.to_dict(record)["i"])

        web_all = Stream(RecordDataset(web_reader, transform=number), weight=3, name="web")
        book = Stream(RecordDataset(books_reader, transform=number), weight=1, name="books")
        mixture = Mixture([web_all, book], epoch_size=64)

        def loader(sampler: RecordSampler) -> Any:
            return sdl.StatefulDataLoader(
                mixture, sampler=sampler, batch_size=4, num_workers=2,
                multiprocessing_context="fork",
            )  # fmt: skip

        def flat(batch: Any) -> list[tuple[str, int]]:
            names, values = batch
            return list(zip(names, [int(v) for v in values], strict=True))

        sampler = RecordSampler(mixture, 2, 1, seed=8)
        sampler.set_epoch(2)
        whole = [x for b in loader(sampler) for x in flat(b)]
        assert Counter(name for name, _ in whole) == {"web": 24, "books": 8}
        sampler = RecordSampler(mixture, 2, 1, seed=8)
        sampler.set_epoch(2)
        first = loader(sampler)
        it, got = iter(first), []
        for _ in range(3):
            got += flat(next(it))
        saved = first.state_dict()
        del it
        again = loader(RecordSampler(mixture, 2, 1, seed=8))
        again.load_state_dict(saved)
        assert got + [x for b in again for x in flat(b)] == whole
