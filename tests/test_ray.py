"""shardcat.ray.read_dataset on a real local Ray cluster (a head and a worker node,
one CPU each): exact rows (count, keys, bytes) with and without ``where`` and
``columns``; a 1% ``where`` reads ~1% of the shards' bytes (counted by the HTTP
server the shards are on); local, remote (HTTP), PostgreSQL and snapshot catalogs;
checked reads; a re-ingest between plan and read (the node-kill helper:
test_ray_node_loss.py)."""

from __future__ import annotations

import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from damage import flip_keeping_mtime

from shardcat import Catalog, CorruptRecordError, NoSuchFeatureError, StaleShardError
from shardcat.formats.tfrecord import TFRecordWriter, make_example
from shardcat.testing.required import need

need("ray.data", why="shardcat[ray]")

from shardcat.ray import read_dataset, split  # noqa: E402
from shardcat.testing.ray import (  # noqa: E402
    ClusterSpec,
    alive_nodes,
    deadline,
    local_cluster,
)
from shardcat.testing.servers import RangeServer  # noqa: E402

SHARDS = 4
RECORDS = 500  # per shard
PAYLOAD = 3000  # 1% of the records (every 100th) lie farther apart than a remote batch merges
LIMIT = 300  # seconds any one Ray call may take before the test fails


def write_shards(root: Path) -> dict[str, dict[str, Any]]:
    """``SHARDS`` TFRecord shards of ``RECORDS`` records each; the truth: key ->
    features (``label`` = n % 100, so ``label = 7`` holds 1% of the records)."""
    root.mkdir(parents=True, exist_ok=True)
    truth = {}
    for s in range(SHARDS):
        with TFRecordWriter(root / f"train-{s:05d}.tfrecord") as w:
            for i in range(RECORDS):
                n = s * RECORDS + i
                key = f"r{n:05d}"
                features = {
                    "image": (bytes([n % 251]) * 7 + n.to_bytes(4, "big")) * (PAYLOAD // 11),
                    "label": n % 100,
                    "tags": [n, n + 1],
                }
                w.write(make_example({"key": key, **features}))
                truth[key] = features
    return truth


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with local_cluster(ClusterSpec(workers=1)) as started:
        yield started


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("ray")
    truth = write_shards(root / "data")
    with Catalog(root / "cat.sqlite") as cat:
        cat.ingest(str(root / "data" / "*.tfrecord"), "train").close()
    return root, truth


def rows_of(dataset: Any) -> list[dict[str, Any]]:
    with deadline(LIMIT, "reading the Ray dataset"):
        return list(dataset.take_all())


def check_rows(rows: list[dict[str, Any]], truth: dict[str, dict[str, Any]]) -> None:
    """The rows are exactly the truth: every key once, each feature's value."""
    assert sorted(r["key"] for r in rows) == sorted(truth)
    for row in rows:
        want = truth[row["key"]]
        assert row["image"] == want["image"]
        assert row["label"] == want["label"]
        assert list(row["tags"]) == want["tags"]


def test_split_cuts_at_shards_and_into_equal_tasks() -> None:
    import numpy as np

    assert split([0, 10, 25], 30, None, 3) == [
        [range(0, 10)],
        [range(10, 20)],
        [range(20, 25), range(25, 30)],
    ]
    tasks = split([0, 10, 25], 30, np.array([1, 2, 11, 26, 29]), 2)
    assert [[list(r) for r in t] for t in tasks] == [[[1, 2], [11]], [[26, 29]]]
    assert split([0], 0, None, 4) == []


def test_ray_picks_the_number_of_tasks_but_none_of_a_few_records() -> None:
    from shardcat.ray import TASK_RECORDS, CatalogDatasource, Opening

    opening = Opening("cat.sqlite", False, "train", (10_000, (0, 5_000)))
    tasks = CatalogDatasource(opening, None, None).get_read_tasks(200)
    assert len(tasks) == -(-10_000 // TASK_RECORDS) == 3
    assert sum(t.metadata.num_rows for t in tasks) == 10_000
    # a task travels as what reopens the catalog and its runs, with the plain pickle
    assert pickle.loads(pickle.dumps(tasks[1].read_fn)) == tasks[1].read_fn
    assert tasks[1].read_fn.runs == [range(3334, 5000), range(5000, 6668)]
    asked = CatalogDatasource(opening, None, None, blocks=200).get_read_tasks(200)
    assert len(asked) == 200 and {t.metadata.num_rows for t in asked} == {50}


def test_a_read_tells_ray_its_size(shards: tuple[Path, Any]) -> None:
    """The plan carries the shards' bytes; Ray gets the read's size in proportion to
    the records read, per task and in all (without one, Ray Data took ~0.8 s more over
    a small read: benchmarks/HISTORY.md)."""
    import numpy as np

    from shardcat.ray import CatalogDatasource, _plan

    root, _ = shards
    stored = sum(p.stat().st_size for p in (root / "data").glob("*.tfrecord"))
    with Catalog(root / "cat.sqlite", readonly=True) as cat:
        opening, selected = _plan(cat, "train", "label = 7", None, None)
    total = SHARDS * RECORDS
    assert opening.stored_bytes == stored and selected is not None and len(selected) == total // 100
    whole = CatalogDatasource(opening, None, None, blocks=4)
    assert whole.estimate_inmemory_data_size() == stored
    sizes = [t.metadata.size_bytes for t in whole.get_read_tasks(4)]
    assert len(sizes) == 4 and all(abs(s - stored // 4) <= 1 for s in sizes)
    some = CatalogDatasource(opening, selected, ["key"])
    assert some.estimate_inmemory_data_size() == stored * len(selected) // total
    none = CatalogDatasource(opening, np.array([], dtype=np.int64), None)
    assert none.estimate_inmemory_data_size() == 0 and none.get_read_tasks(4) == []


def test_every_row_exactly(cluster: Any, shards: tuple[Path, Any]) -> None:
    root, truth = shards
    assert len(alive_nodes()) == 2
    ds = read_dataset(root / "cat.sqlite", "train", override_num_blocks=6)
    rows = rows_of(ds)
    assert len(rows) == SHARDS * RECORDS
    check_rows(rows, truth)
    assert set(rows[0]) == {"key", "image", "label", "tags"}


def test_where_and_columns_are_pushed_down(cluster: Any, shards: tuple[Path, Any]) -> None:
    root, truth = shards
    with Catalog(root / "cat.sqlite") as cat:
        ds = read_dataset(cat, "train", where="label = ? AND position < ?", params=[7, 1000])
        rows = rows_of(ds)
    want = {k: v for k, v in truth.items() if v["label"] == 7 and int(k[1:]) < 1000}
    assert len(want) == 10
    check_rows(rows, want)
    picked = rows_of(read_dataset(root / "cat.sqlite", "train", "label < 2", ["label", "key"]))
    assert sorted((r["key"], r["label"]) for r in picked) == sorted(
        (k, v["label"]) for k, v in truth.items() if v["label"] < 2
    )
    assert all(set(r) == {"key", "label"} for r in picked)
    keys = rows_of(read_dataset(root / "cat.sqlite", "train", columns=["key"]))
    assert sorted(r["key"] for r in keys) == sorted(truth)
    assert rows_of(read_dataset(root / "cat.sqlite", "train", where="label > 1000")) == []


def test_tar_samples_are_rows_of_their_members(cluster: Any, tmp_path: Path) -> None:
    from remote_shards import sample_tar

    sample_tar(tmp_path / "web-000.tar", samples=30)
    with (
        Catalog(tmp_path / "cat.sqlite") as cat,
        cat.ingest(str(tmp_path / "*.tar"), "w") as reader,
    ):
        truth = {k: reader.get_raw(k) for k in reader.get_keys()}
        rows = rows_of(read_dataset(cat, "w", where="cls >= 20", override_num_blocks=3))
    assert sorted(r["key"] for r in rows) == [f"s{i:03d}" for i in range(20, 30)]
    assert all({"jpg": r["jpg"], "cls": r["cls"]} == truth[r["key"]] for r in rows)


def test_an_unknown_column_is_refused(shards: tuple[Path, Any]) -> None:
    root, _ = shards
    with pytest.raises(NoSuchFeatureError, match=r"'labels'.*it has: .*label"):
        read_dataset(root / "cat.sqlite", "train", columns=["key", "labels"])


def test_a_one_percent_where_reads_one_percent_of_the_bytes(
    cluster: Any, shards: tuple[Path, Any], tmp_path: Path
) -> None:
    """Remote shards, read by the tasks: the server counts what they fetched. (Records
    closer than ``MERGE_GAP`` are fetched in one request, gaps included: the matches
    here are 100 records apart, farther than that.)"""
    from shardcat.sources.remote import MERGE_GAP

    assert 100 * PAYLOAD > MERGE_GAP
    root, truth = shards
    server = RangeServer(str(root / "data"))
    server.start()
    try:
        total = sum(p.stat().st_size for p in (root / "data").glob("*.tfrecord"))
        with Catalog(tmp_path / "web.sqlite") as cat:
            url = f"{server.url}/train-{{00000..0000{SHARDS - 1}}}.tfrecord"
            cat.ingest(url, "web").close()
        server.counter.reset()
        rows = rows_of(read_dataset(tmp_path / "web.sqlite", "web", where="label = 7"))
        check_rows(rows, {k: v for k, v in truth.items() if v["label"] == 7})
        assert len(rows) == SHARDS * RECORDS // 100
        one_percent = server.counter.body_bytes
        assert len(server.counter.gets()) == len(rows)  # one ranged GET per record
        server.counter.reset()
        check_rows(rows_of(read_dataset(tmp_path / "web.sqlite", "web")), truth)
        everything = server.counter.body_bytes
    finally:
        server.stop()
    assert everything >= SHARDS * RECORDS * PAYLOAD * 0.99
    assert 0.01 * SHARDS * RECORDS * PAYLOAD <= one_percent <= 0.015 * total, (
        one_percent,
        total,
    )


def test_a_postgresql_catalog(cluster: Any, shards: tuple[Path, Any]) -> None:
    need("psycopg", why="shardcat[postgres]")
    from shardcat.testing.postgres import find_binaries, fresh_database, postgres_server
    from shardcat.testing.required import missing

    if find_binaries() is None:
        missing("the PostgreSQL server binaries (initdb, postgres)")
    root, truth = shards
    with postgres_server() as server, fresh_database(server) as url:
        with Catalog(url) as cat:
            cat.ingest(str(root / "data" / "*.tfrecord"), "train").close()
        rows = rows_of(read_dataset(url, "train", where="label IN (?, ?)", params=[3, 4]))
    check_rows(rows, {k: v for k, v in truth.items() if v["label"] in (3, 4)})


def test_a_snapshot_on_shared_storage(
    cluster: Any, shards: tuple[Path, Any], tmp_path: Path
) -> None:
    root, truth = shards
    snapshot = tmp_path / "train.snapshot.sqlite"
    with Catalog(root / "cat.sqlite") as cat:
        cat.snapshot("train", snapshot)
    check_rows(rows_of(read_dataset(snapshot, "train", immutable=True)), truth)
    with Catalog(snapshot, immutable=True) as snap:
        rows = rows_of(read_dataset(snap, "train", where="label = 0"))
    check_rows(rows, {k: v for k, v in truth.items() if v["label"] == 0})


def test_reads_are_checked(cluster: Any, tmp_path: Path) -> None:
    truth = write_shards(tmp_path / "data")
    with Catalog(tmp_path / "cat.sqlite") as cat:
        reader = cat.ingest(str(tmp_path / "data" / "*.tfrecord"), "train")
        key = reader.key_at(2 * RECORDS + RECORDS // 2)  # past the fingerprint's 64 KiB
        reader.close()
        found = cat.query(f"SELECT shard FROM train WHERE key = '{key}'")[0][0]
    shard = tmp_path / "data" / Path(found).name
    at = shard.read_bytes().index(truth[key]["image"]) + 100
    flip_keeping_mtime(shard, at)
    with pytest.raises(CorruptRecordError, match=key):
        rows_of(read_dataset(tmp_path / "cat.sqlite", "train"))
    rows = rows_of(read_dataset(tmp_path / "cat.sqlite", "train", where=f"key != '{key}'"))
    assert len(rows) == len(truth) - 1


def test_a_reingest_between_plan_and_read_is_refused(cluster: Any, tmp_path: Path) -> None:
    write_shards(tmp_path / "data")
    with Catalog(tmp_path / "cat.sqlite") as cat:
        cat.ingest(str(tmp_path / "data" / "train-0000[0-2].tfrecord"), "train").close()
        ds = read_dataset(cat, "train")
        cat.ingest(str(tmp_path / "data" / "train-0000[0-3].tfrecord"), "train").close()
    with pytest.raises(StaleShardError, match="changed since read_dataset planned"):
        rows_of(ds)


def test_import_shardcat_does_not_import_ray() -> None:
    code = "import sys, shardcat; shardcat.Catalog; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
