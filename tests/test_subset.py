"""A dataset over some of another dataset's shards reads the donor's rows by reference
(issue 31, item 5; ``shardcat.catalog.shares``): the same keys, bytes, positions and
SQL as a fresh index of those shards, nothing copied at open, and never other
bytes after a re-ingest on either side, a donor drop, deletes on either side,
a snapshot, the columnar mirror, an index, dedup, a tag, a DALI index export,
PostgreSQL, and threads and forked readers reading through a donor's re-ingest."""

from __future__ import annotations

import multiprocessing
import os
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from shardcat import Catalog, StaleShardError, TFRecordRandomAccess, TFRecordWriter, make_example
from shardcat.testing.postgres import find_binaries, fresh_database, postgres_server
from shardcat.testing.required import missing, need

SHARDS, PER_SHARD = 8, 40
SUBSET = "train-0000[1-3].tfrecord"


def image(key: str, version: int = 0) -> bytes:
    return f"{key}/{version}".encode() * 7


def write_shard(directory: Path, s: int, version: int = 0) -> dict[str, bytes]:
    """Shard ``s``; a later ``version`` holds other keys and bytes (and another size)."""
    keys = [f"s{s}_{i}" if version == 0 else f"s{s}_v{version}_{i}" for i in range(PER_SHARD)]
    path = directory / f"train-{s:05d}.tfrecord"
    with TFRecordWriter(path) as writer:
        for i, key in enumerate(keys):
            writer.write(make_example({"key": key, "label": (s + i) % 4, "image": image(key)}))
    stat = path.stat()  # a rewrite within the same mtime tick is still seen as changed
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + version * 1_000_000_000))
    return {key: image(key) for key in keys}


def write_train(directory: Path) -> dict[str, bytes]:
    images: dict[str, bytes] = {}
    for s in range(SHARDS):
        images.update(write_shard(directory, s))
    return images


def subset_keys(images: dict[str, bytes], shards: range = range(1, 4)) -> list[str]:
    return [k for k in images if int(k[1 : k.index("_")]) in shards]


def sharing(cat: Catalog, name: str) -> tuple[int, int]:
    """(shards the dataset reads by reference, rows in its own records table)."""
    ((dataset_id,),) = cat.query("SELECT id FROM shardcat_datasets WHERE name = ?", [name])
    ((shared,),) = cat.query(
        "SELECT count(*) FROM shardcat_shares WHERE dataset_id = ?", [dataset_id]
    )
    ((own,),) = cat.query(f'SELECT count(*) FROM "shardcat_records_{dataset_id}"')
    return shared, own


def view(cat: Catalog, name: str) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in cat.query(f"SELECT * FROM {name} ORDER BY position")]


def reads(reader: Any, images: dict[str, bytes], keys: list[str]) -> None:
    """Every key reads its exact bytes, by key, by position and in a batch."""
    assert reader.get_keys() == keys and len(reader) == len(keys)
    assert [reader.get_feature(k, "image") for k in keys] == [images[k] for k in keys]
    assert [reader.key_at(p) for p in range(len(keys))] == keys
    batch = reader.get_many(keys[::7])
    assert [r.features.feature["image"].bytes_list.value[0] for r in batch] == [
        images[k] for k in keys[::7]
    ]
    every = range(0, len(keys), 5)  # batches by position and key (native on SQLite)
    assert [d["image"] for d in reader.get_dicts_at(every, ["image"])] == [
        images[keys[p]] for p in every
    ]
    assert [d["image"] for d in reader.get_dicts(keys[::5])] == [images[k] for k in keys[::5]]


@pytest.fixture
def train(tmp_path: Path) -> tuple[Catalog, dict[str, bytes]]:
    images = write_train(tmp_path)
    cat = Catalog(tmp_path / "c.sqlite")
    cat.ingest(str(tmp_path / "train-*.tfrecord"), "train").close()
    yield cat, images
    cat.close()


def test_a_subset_reads_as_a_fresh_index_without_a_copy(tmp_path: Path, train: Any) -> None:
    cat, images = train
    keys = subset_keys(images)
    with cat.ingest(str(tmp_path / SUBSET), "sub") as sub:
        assert sharing(cat, "sub") == (3, 0)  # the donor's rows, none copied
        with (
            Catalog(tmp_path / "fresh.sqlite") as other,
            other.ingest(str(tmp_path / SUBSET), "sub") as fresh,
        ):
            reads(sub, images, keys)
            reads(fresh, images, keys)
            assert view(cat, "sub") == view(other, "sub")
            assert sub.where("label = 1") == fresh.where("label = 1") != []
            assert sub.get_stats()["records_per_file"] == fresh.get_stats()["records_per_file"]
            assert cat.info("sub").records == other.info("sub").records == 3 * PER_SHARD
            assert sub.index["s2_5"]["offset"] == fresh.index["s2_5"]["offset"]
        assert sub.get_feature("s0_1", "image") is None and "s5_0" not in sub  # not its shards
        assert sub.verify() == []
    assert cat.query("SELECT count(*) FROM sub WHERE label = 2") == [(30,)]


def test_the_drop_in_reader_over_indexed_shards_shares_them(tmp_path: Path) -> None:
    images = write_train(tmp_path)
    TFRecordRandomAccess(str(tmp_path / "train-*.tfrecord")).close()
    with TFRecordRandomAccess(str(tmp_path / SUBSET)) as sub:
        assert sub.dataset == "train_2"
        reads(sub, images, subset_keys(images))
    with Catalog(tmp_path / "shardcat.sqlite") as cat:
        assert sharing(cat, "train_2") == (3, 0)


def test_a_donor_reingest_leaves_the_subset_its_indexed_version(tmp_path: Path, train: Any) -> None:
    cat, images = train
    keys = subset_keys(images)
    with cat.ingest(str(tmp_path / SUBSET), "sub") as sub:
        before = view(cat, "sub")
        new = write_shard(tmp_path, 2, version=1)
        cat.ingest(str(tmp_path / "train-*.tfrecord"), "train").close()  # re-indexes shard 2
        assert sharing(cat, "sub") == (0, 3 * PER_SHARD)  # its own copy, taken first
        assert view(cat, "sub") == before  # not the donor's new rows
        assert [sub.get_feature(k, "image") for k in keys if k.startswith("s1_")] == [
            images[k] for k in keys if k.startswith("s1_")
        ]
        assert sub.get_feature(next(iter(new)), "image") is None
        with pytest.raises(StaleShardError):
            sub.get_feature("s2_0", "image")  # its file changed: never other bytes
        assert cat.dataset("train").get_feature("s2_v1_3", "image") == new["s2_v1_3"]
    with cat.ingest(str(tmp_path / SUBSET), "sub") as again:  # re-indexed for it too
        fresh = {**{k: images[k] for k in keys if not k.startswith("s2_")}, **new}
        reads(again, fresh, sorted(fresh, key=lambda k: (k[:2], int(k.rpartition("_")[2]))))


def test_a_donor_rescan_while_a_reader_is_open(tmp_path: Path, train: Any) -> None:
    cat, images = train
    keys = subset_keys(images)
    with cat.ingest(str(tmp_path / SUBSET), "sub") as sub:
        reads(sub, images, keys)
        cat.ingest(str(tmp_path / "train-*.tfrecord"), "train", rescan=True).close()
        assert sharing(cat, "sub") == (0, 3 * PER_SHARD)
        reads(sub, images, keys)  # the same reader follows its copy


def test_a_subset_reingest_leaves_the_donor_alone(tmp_path: Path, train: Any) -> None:
    cat, images = train
    cat.ingest(str(tmp_path / SUBSET), "sub").close()
    donor = view(cat, "train")
    new = write_shard(tmp_path, 3, version=1)
    with cat.ingest(str(tmp_path / SUBSET), "sub") as sub:  # re-indexes shard 3 for sub
        assert sharing(cat, "sub") == (0, 3 * PER_SHARD)
        assert sub.get_feature("s3_v1_0", "image") == new["s3_v1_0"]
        assert sub.get_feature("s3_0", "image") is None
        assert sub.get_feature("s1_4", "image") == images["s1_4"]
    assert view(cat, "train") == donor  # its indexed version until it re-ingests


def test_a_dropped_donor_leaves_the_subset_whole(tmp_path: Path, train: Any) -> None:
    cat, images = train
    keys = subset_keys(images)
    with cat.ingest(str(tmp_path / SUBSET), "sub") as sub:
        before = view(cat, "sub")
        cat.drop("train")
        assert sharing(cat, "sub") == (0, 3 * PER_SHARD)
        assert view(cat, "sub") == before
        reads(sub, images, keys)


def test_dropping_a_subset_copies_nothing(tmp_path: Path, train: Any) -> None:
    cat, images = train
    cat.ingest(str(tmp_path / SUBSET), "sub").close()
    before = view(cat, "train")
    cat.drop("sub")
    assert cat.query("SELECT count(*) FROM shardcat_shares") == [(0,)]
    assert [d.name for d in cat.datasets()] == ["train"] and view(cat, "train") == before
    with cat.dataset("train") as full:
        reads(full, images, list(images))


def test_deletes_are_per_dataset(tmp_path: Path, train: Any) -> None:
    cat, images = train
    keys = subset_keys(images)
    with cat.ingest(str(tmp_path / SUBSET), "sub") as sub, cat.dataset("train") as full:
        assert cat.delete("train", keys=["s1_0", "s6_0"]) == 2
        reads(sub, images, keys)  # the donor's deletes are not the subset's
        assert cat.delete("sub", keys=["s2_5"]) == 1
        assert cat.delete("sub", "label = 3 AND key LIKE 's3_%'") == 10
        gone = {"s2_5", *(k for k in keys if k.startswith("s3_") and (3 + int(k[3:])) % 4 == 3)}
        live = [k for k in keys if k not in gone]
        sub.refresh()  # (deletes move positions)
        reads(sub, images, live)
        assert sub.get_feature("s2_5", "image") is None
        assert full.get_feature("s2_5", "image") == images["s2_5"]
        assert cat.info("sub").deleted == 11 and cat.info("train").deleted == 2
        assert [r[0] for r in view(cat, "sub")] == live
        assert sharing(cat, "sub") == (3, 0)  # deletes work by reference


def test_a_snapshot_of_a_subset_holds_its_rows(tmp_path: Path, train: Any) -> None:
    cat, images = train
    cat.ingest(str(tmp_path / SUBSET), "sub").close()
    cat.snapshot("sub", tmp_path / "snap.sqlite")
    with Catalog(tmp_path / "snap.sqlite", immutable=True) as snap, snap.dataset("sub") as sub:
        reads(sub, images, subset_keys(images))
        assert view(snap, "sub") == view(cat, "sub")
        assert sharing(snap, "sub") == (0, 3 * PER_SHARD)


def test_the_columnar_mirror_of_a_subset(tmp_path: Path, train: Any) -> None:
    need("duckdb", why="shardcat[duckdb]")
    cat, _ = train
    cat.ingest(str(tmp_path / SUBSET), "sub").close()
    sql = "SELECT count(*), sum(label), min(key), max(position) FROM sub WHERE label < 2"
    expected = [(60, 30, "s1_0", 118)]
    assert cat.query(sql) == expected
    assert [tuple(r) for r in cat.query(sql, engine="duckdb")] == expected
    write_shard(tmp_path, 1, version=1)
    cat.ingest(str(tmp_path / "train-*.tfrecord"), "train").close()
    assert [tuple(r) for r in cat.query(sql, engine="duckdb")] == expected  # its version


def test_an_index_on_a_subset_is_its_own(tmp_path: Path, train: Any) -> None:
    cat, images = train
    with cat.ingest(str(tmp_path / SUBSET), "sub") as sub:
        assert cat.create_index("sub", "label")
        assert sharing(cat, "sub") == (0, 3 * PER_SHARD)
        assert cat.info("sub").indexed == ["label"] and cat.info("train").indexed == []
        assert sub.where("label = 0") == [k for k in subset_keys(images) if _label(k) == 0]
        reads(sub, images, subset_keys(images))


def _label(key: str) -> int:
    s, i = key[1:].split("_")
    return (int(s) + int(i)) % 4


def _read_loop(reader: Any, images: dict[str, bytes], keys: list[str], stop: Any) -> int:
    """Random reads until ``stop`` is set; returns how many gave other bytes."""
    rng, wrong, n = random.Random(os.getpid() + threading.get_ident()), 0, 0
    while not stop.is_set() or n < 200:
        key = rng.choice(keys)
        if reader.get_feature(key, "image") != images[key]:
            wrong += 1
        if reader.key_at(keys.index(key)) != key:
            wrong += 1
        n += 1
    return wrong


def _child(reader: Any, images: dict[str, bytes], keys: list[str], stop: Any) -> None:
    os._exit(min(_read_loop(reader, images, keys, stop), 100))


def _thread(reader: Any, images: dict[str, bytes], keys: list[str], stop: Any, out: list) -> None:
    out.append(_read_loop(reader, images, keys, stop))


def test_threads_and_forked_readers_through_a_donor_reingest(tmp_path: Path, train: Any) -> None:
    cat, images = train
    keys = subset_keys(images)
    fork = multiprocessing.get_context("fork")
    for round in range(3):
        with cat.ingest(str(tmp_path / SUBSET), f"sub{round}") as sub:
            assert sharing(cat, f"sub{round}") == (3, 0)
            stop, done = fork.Event(), threading.Event()
            child = fork.Process(target=_child, args=(sub, images, keys, stop))
            child.start()
            wrong: list[int] = []
            threads = [
                threading.Thread(target=_thread, args=(sub, images, keys, done, wrong))
                for _ in range(2)
            ]
            for t in threads:
                t.start()
            try:
                cat.ingest(str(tmp_path / "train-*.tfrecord"), "train", rescan=True).close()
                assert sharing(cat, f"sub{round}") == (0, 3 * PER_SHARD)
            finally:
                stop.set()
                done.set()
                for t in threads:
                    t.join()
                child.join(60)
                if child.exitcode is None:
                    child.kill()
            assert wrong == [0, 0] and child.exitcode == 0


# -- PostgreSQL --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server():
    need("psycopg", why="shardcat[postgres]")
    if find_binaries() is None:
        missing("the PostgreSQL server binaries (initdb, postgres)")
    with postgres_server() as url:
        yield url


def test_postgresql_subsets_share_and_copy_when_written(tmp_path: Path, server: str) -> None:
    images = write_train(tmp_path)
    keys = subset_keys(images)
    with fresh_database(server) as url, Catalog(url) as cat:
        cat.ingest(str(tmp_path / "train-*.tfrecord"), "train").close()
        with cat.ingest(str(tmp_path / SUBSET), "sub") as sub:
            assert sharing(cat, "sub") == (3, 0)
            reads(sub, images, keys)
            before = view(cat, "sub")
            assert cat.delete("sub", keys=["s1_1"]) == 1
            sub.refresh()  # (deletes move positions)
            reads(sub, images, [k for k in keys if k != "s1_1"])
            cat.undelete("sub", keys=["s1_1"])
            sub.refresh()
            cat.ingest(str(tmp_path / "train-*.tfrecord"), "train", rescan=True).close()
            assert sharing(cat, "sub") == (0, 3 * PER_SHARD)
            assert view(cat, "sub") == before
            reads(sub, images, keys)
        cat.ingest(str(tmp_path / "train-0000[2-4].tfrecord"), "other").close()
        assert sharing(cat, "other") == (3, 0)
        cat.snapshot("other", tmp_path / "snap.sqlite")  # (streamed from the server)
        with Catalog(tmp_path / "snap.sqlite", immutable=True) as snap:
            assert sharing(snap, "other") == (0, 3 * PER_SHARD)
            with snap.dataset("other") as other:
                reads(other, images, subset_keys(images, range(2, 5)))
        cat.drop("train")
        assert sharing(cat, "other") == (0, 3 * PER_SHARD)
        with cat.dataset("other") as other:
            reads(other, images, subset_keys(images, range(2, 5)))


def test_dedup_of_a_subset_against_its_donor(tmp_path: Path, train: Any) -> None:
    cat, images = train
    cat.ingest(str(tmp_path / SUBSET), "sub").close()
    report = cat.dedup("sub", ["train"])
    assert report.records == (3 + SHARDS) * PER_SHARD
    found = sorted((g.kept.key, [(c.dataset, c.key) for c in g.duplicates]) for g in report.groups)
    assert found == [(k, [("train", k)]) for k in sorted(subset_keys(images))]
    assert sharing(cat, "sub") == (3, 0)


def test_a_tag_of_a_subset_pins_its_rows(tmp_path: Path, train: Any) -> None:
    cat, images = train
    keys = subset_keys(images)
    cat.ingest(str(tmp_path / SUBSET), "sub").close()
    cat.tag("sub", "v1")
    assert sharing(cat, "sub") == (3, 0)  # the tag shares the donor's rows too
    write_shard(tmp_path, 2, version=1)
    cat.ingest(str(tmp_path / "train-*.tfrecord"), "train").close()
    with cat.dataset("sub@v1") as pinned:
        assert pinned.get_keys() == keys and len(pinned) == len(keys)
        unchanged = [k for k in keys if not k.startswith("s2_")]
        assert [pinned.get_feature(k, "image") for k in unchanged] == [images[k] for k in unchanged]


def test_the_dali_index_of_a_subset_equals_a_fresh_one(tmp_path: Path, train: Any) -> None:
    from shardcat.facade.export import export_index

    cat, _ = train
    cat.ingest(str(tmp_path / SUBSET), "sub").close()
    shared = export_index(cat, "sub", tmp_path / "shared")
    with Catalog(tmp_path / "fresh.sqlite") as other:
        other.ingest(str(tmp_path / SUBSET), "sub").close()
        fresh = export_index(other, "sub", tmp_path / "fresh")
    assert (
        [p.name for p in shared]
        == [p.name for p in fresh]
        == [f"train-0000{s}.idx" for s in (1, 2, 3)]
    )
    assert [p.read_text() for p in shared] == [p.read_text() for p in fresh]
    assert shared[0].read_text().count("\n") == PER_SHARD
