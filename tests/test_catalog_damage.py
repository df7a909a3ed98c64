"""A damaged catalog file is a clear error (issue 26): bits flipped in a copy of a
catalog's pages, read through the API, give the right bytes, None for a key the
damage hid, or a ShardcatError — never a raw sqlite3, decode or other error, nor
another record's bytes where the key index names another row (the stored check
mixes the record's key: a read by key fails on the key it asked for).
``catalog verify`` runs SQLite's quick_check first and says what is damaged."""

from __future__ import annotations

import random
import shutil
import sqlite3
from pathlib import Path

import pytest
from damage import flip_keeping_mtime
from typer.testing import CliRunner

from shardcat import Catalog, CatalogError, ShardcatError, TFRecordWriter, make_example
from shardcat.cli import app

runner = CliRunner()
N = 300
PAGE = 4096


def _value(i: int) -> bytes:
    return f"v{i}-".encode() * (i % 5 + 1)


OTHERS = {_value(i) for i in range(N)}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpointed catalog (every page in the main file) of N TFRecord records."""
    where = tmp_path_factory.mktemp("damage")
    with TFRecordWriter(where / "train.tfrecord") as writer:
        for i in range(N):
            writer.write(make_example({"key": f"k{i:03d}", "v": _value(i), "label": i % 3}))
    db = where / "cat.sqlite"
    with Catalog(db) as cat:
        cat.ingest(str(where / "train.tfrecord"), "train").close()
        assert cat.checkpoint()
    return db


def _damaged(pristine: Path, seed: int, flips: int) -> Path:
    """A copy of the catalog with ``flips`` random bits flipped past its first page."""
    copy = pristine.with_name(f"damaged-{seed}.sqlite")
    shutil.copyfile(pristine, copy)
    rng = random.Random(seed)
    size = copy.stat().st_size
    for _ in range(flips):
        flip_keeping_mtime(copy, rng.randrange(PAGE, size), 1 << rng.randrange(8))
    return copy


def _read_everything(db: Path) -> dict[str, int]:
    outcome = {"right": 0, "none": 0, "error": 0}
    try:
        cat = Catalog(db, readonly=True)
    except ShardcatError:
        return {"error": 1}
    with cat:
        try:
            reader = cat.dataset("train")
        except ShardcatError:
            return {"error": 1}
        with reader:
            for i in range(0, N, 7):
                try:
                    got = reader.get_feature(f"k{i:03d}", "v")
                except ShardcatError:
                    outcome["error"] += 1
                    continue
                if got is None:
                    outcome["none"] += 1
                    continue
                # a key index entry naming another row (seed 30)
                # is a mismatch of the key's check, never the other record's bytes
                assert got == _value(i), (i, got, got in OTHERS)
                outcome["right"] += 1
            for call in (
                lambda: reader.get_many([f"k{i:03d}" for i in range(0, N, 11)]),
                lambda: reader.get_record_at(N // 2),
                lambda: len(reader.get_keys()),
                lambda: cat.query("SELECT count(*), sum(label) FROM train"),
                lambda: cat.datasets(),
            ):
                try:
                    call()
                except ShardcatError:
                    outcome["error"] += 1
    return outcome


# 30: a flipped bit in the key index makes one key's entry name another row
# 110: a record's offset turned into a blob (a TypeError in get_many, before)
@pytest.mark.parametrize("seed", [*range(40), 110])
def test_flipped_bits_give_right_bytes_or_a_shardcat_error(pristine: Path, seed: int) -> None:
    outcome = _read_everything(_damaged(pristine, seed, flips=2 + seed % 12))
    assert sum(outcome.values()) > 0


def test_a_malformed_catalog_names_itself_and_what_to_run(pristine: Path) -> None:
    copy = pristine.with_name("malformed.sqlite")  # (beside the shard: paths are relative)
    shutil.copyfile(pristine, copy)
    with Catalog(copy, readonly=True) as cat, cat.dataset("train") as reader:
        assert reader.get_feature("k001", "v") == _value(1)
        # every page past the schema's: the records' b-tree is garbage now
        with open(copy, "r+b") as f:
            f.seek(3 * PAGE)
            f.write(b"\xa5" * (copy.stat().st_size - 3 * PAGE))
        with pytest.raises(CatalogError) as err:
            reader.refresh()  # (a mapped catalog's damage shows at once)
            for i in range(N):
                reader.get_feature(f"k{i:03d}", "v")
    message = str(err.value)
    assert message.startswith(f"cannot read catalog {copy}: "), message
    assert f"`catalog verify DATASET -c {copy}`" in message


def test_verify_runs_quick_check_first(pristine: Path) -> None:
    done = runner.invoke(app, ["verify", "train", "-c", str(pristine)])
    assert done.exit_code == 0, done.output
    copy = pristine.with_name("quick.sqlite")
    shutil.copyfile(pristine, copy)
    with sqlite3.connect(copy) as conn:
        root = conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = 'shardcat_records_1'"
        ).fetchone()[0]
    with open(copy, "r+b") as f:  # the records table's root page: garbage
        f.seek((root - 1) * PAGE + 100 * (root == 1))
        f.write(b"\xa5" * 64)
    done = runner.invoke(app, ["verify", "train", "-c", str(copy)])
    assert done.exit_code == 1, done.output
    assert f"{copy}: the catalog file is damaged (SQLite's quick_check):" in done.output
    assert "Traceback" not in done.output
