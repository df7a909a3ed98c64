"""Provenance (issue 32, item 5): ``RecordSampler.seen(state)`` lists the keys a run
consumed up to a saved state, for any world size, equal to what real ``DataLoader``s
yielded: over a ``RecordDataset``, a ``keys=`` subset and a ``Mixture``; soft-deleted
records are never among them."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from shardcat import Catalog, SamplerError, TFRecordWriter, make_example
from shardcat.cli import app
from shardcat.readers.reader import Reader
from shardcat.testing.required import need
from shardcat.torch import Mixture, RecordDataset, RecordSampler, Stream


@pytest.fixture
def catalog(tmp_path: Path) -> Any:
    for name, n in (("a", 37), ("b", 11)):
        with TFRecordWriter(tmp_path / f"{name}.tfrecord") as w:
            for i in range(n):
                w.write(make_example({"key": f"{name}{i:02d}", "label": i % 4}))
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(str(tmp_path / "a.tfrecord"), "a", workers=1).close()
        cat.ingest(str(tmp_path / "b.tfrecord"), "b", workers=1).close()
        yield cat


def key_of(reader: Reader) -> Any:
    return lambda record: reader.to_dict(record)["key"].decode()


def run(dataset: Any, world: int, epochs: int, batches: int, **kw: Any) -> tuple[list[Any], Any]:
    """Every rank's DataLoader through ``epochs`` whole epochs, then ``batches`` batches
    of the next; what they yielded, and rank 0's state there."""
    torch_data = need("torch.utils.data", why="shardcat[torch]")
    seen: list[Any] = []
    state = None
    for rank in range(world):
        sampler = RecordSampler(dataset, world, rank, seed=5, **kw)
        loader = torch_data.DataLoader(dataset, sampler=sampler, batch_size=4, collate_fn=list)
        for epoch in range(epochs + 1):
            sampler.set_epoch(epoch)
            for done, batch in enumerate(loader):
                if epoch == epochs and done == batches:
                    break
                seen.extend(batch)
        if rank == 0:
            state = sampler.state_dict(consumed=batches * 4)
    return seen, state


@pytest.mark.parametrize("world", [1, 3])
@pytest.mark.parametrize("shuffle", [True, "block", False])
def test_seen_equals_what_the_loaders_yielded(catalog: Catalog, world: int, shuffle: Any) -> None:
    with catalog.dataset("a") as reader:
        dataset = RecordDataset(reader, transform=key_of(reader))
        yielded, state = run(dataset, world, 2, 2, shuffle=shuffle)
        for resumed_world in (1, 4):  # any world size names the same keys
            sampler = RecordSampler(dataset, resumed_world, 0, seed=5, shuffle=shuffle)
            listed = list(sampler.seen(state))
            assert Counter(listed) == Counter(yielded)
        assert len(yielded) == 2 * (-(-37 // world) * world) + world * 8


def test_seen_over_a_subset_a_mixture_and_deletes(catalog: Catalog) -> None:
    catalog.delete("a", "label = 0")
    with catalog.dataset("a") as a, catalog.dataset("b") as b:
        subset = RecordDataset(a, keys=a.where("label = 1"), transform=key_of(a))
        yielded, state = run(subset, 2, 1, 1)
        assert Counter(RecordSampler(subset, seed=5).seen(state)) == Counter(yielded)

        def named(reader: Reader) -> RecordDataset:
            return RecordDataset(reader, transform=key_of(reader))

        mixture = Mixture([Stream(named(a), repeat=2, name="a"), Stream(named(b), choose=5)])
        yielded, state = run(mixture, 3, 1, 2)
        listed = list(RecordSampler(mixture, 2, 1, seed=5).seen(state))
        assert Counter(listed) == Counter((name, key) for name, key in yielded)
        assert not {key for _, key in listed} & {f"a{i:02d}" for i in range(0, 37, 4)}


def test_seen_needs_keys(catalog: Catalog) -> None:
    sampler = RecordSampler(list(range(10)))
    with pytest.raises(SamplerError, match="list cannot name its items' keys"):
        list(sampler.seen())


def test_cli_seen_writes_a_table_to_join(catalog: Catalog, tmp_path: Path) -> None:
    """`catalog seen` writes what the run consumed; `catalog query --attach` joins it."""
    runner = CliRunner()
    db = str(catalog.path)
    with catalog.dataset("a") as reader:
        subset = RecordDataset(reader, keys=reader.where("label < 3"))
        sampler = RecordSampler(subset, 2, 1, seed=9, shuffle="block", block_size=4)
        sampler.set_epoch(1)
        taken = [subset.keys_of([i])[0] for i in itertools.islice(iter(sampler), 5)]
        state = sampler.state_dict()
        expected = Counter(RecordSampler(subset, seed=9, shuffle="block", block_size=4).seen(state))
    assert set(taken) <= set(expected) and sum(expected.values()) == 28 + 10
    (tmp_path / "state.json").write_text(json.dumps({"sampler": state}))
    out = tmp_path / "seen.sqlite"
    args = ["seen", str(tmp_path / "state.json"), "--dataset", "a", "--where", "label < 3"]
    done = runner.invoke(app, [*args, "--out", str(out), "--catalog", db])
    assert done.exit_code == 0, done.output
    assert f"{len(expected)} key(s) of a seen" in done.stdout
    sql = "SELECT a.key, s.times FROM run.seen s JOIN a USING (key) ORDER BY a.key"
    query = ["query", sql, "--attach", f"run={out}", "--json", "--catalog", db]
    rows = json.loads(runner.invoke(app, query).stdout)
    assert {r["key"]: r["times"] for r in rows} == dict(expected)
    bad = runner.invoke(
        app, ["seen", str(out), "--dataset", "a", "--out", str(out), "--catalog", db]
    )
    assert bad.exit_code != 0 and "cannot read a sampler state" in bad.output
