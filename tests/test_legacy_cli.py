"""``catalog migrate``: the command line over :mod:`shardcat.migrations.legacy`."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
from legacy_fixtures import indexed_at, tfd_tfrecord_index, write_tfrecords
from test_migrations import downgrade_to_v1
from typer.testing import CliRunner

from shardcat import Catalog, TFRecordRandomAccess
from shardcat.catalog.versions import SCHEMA_VERSION
from shardcat.cli import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands without --catalog use ./shardcat.sqlite: here the shards' directory."""
    monkeypatch.chdir(tmp_path)


def run(*args: object, code: int = 0):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == code, result.output + str(result.exception)
    return result


def test_migrate_a_directory(tmp_path: Path):
    write_tfrecords(tmp_path, shards=2)
    tfd_tfrecord_index(str(tmp_path / "*.tfrecord"))
    result = run("migrate", tmp_path)
    header, row = (
        line.split() for line in result.stdout.splitlines() if line.strip()[:2] in ("da", "tr")
    )
    assert header == [
        "dataset",
        "shards",
        "imported",
        "verified",
        "re-indexed",
        "unchanged",
        "failed",
        "records",
    ]
    assert row == ["train", "2", "2", "2", "0", "0", "0", "80"]
    catalog = tmp_path / "shardcat.sqlite"
    assert f"dataset train (tfrecord, feature:key) -> {catalog}" in result.stderr
    assert "SQL fields are not imported" in result.stderr and "--fields" in result.stderr
    before = indexed_at(catalog)
    with TFRecordRandomAccess(str(tmp_path / "*.tfrecord")) as reader:
        assert len(reader) == 80
    assert indexed_at(catalog) == before


def test_json_and_dry_run(tmp_path: Path):
    write_tfrecords(tmp_path, shards=2)
    tfd_tfrecord_index(str(tmp_path / "*.tfrecord"))
    result = run("migrate", tmp_path, "--dry-run", "--json")
    report = json.loads(result.stdout)
    assert report["dry_run"] is True
    assert report["totals"] == {
        "imported": 2,
        "verified": 2,
        "re-indexed": 0,
        "unchanged": 0,
        "failed": 0,
    }
    assert [s["action"] for s in report["datasets"][0]["shards"]] == ["import", "import"]
    assert not (tmp_path / "shardcat.sqlite").exists()


def test_remap_and_explicit_catalog(tmp_path: Path):
    write_tfrecords(tmp_path / "old")
    index = tfd_tfrecord_index(
        str(tmp_path / "old" / "*.tfrecord"), index_file=tmp_path / "i.index"
    )
    shutil.move(tmp_path / "old", tmp_path / "new")
    catalog = tmp_path / "cat.sqlite"
    missing = run("migrate", index, "-c", catalog, code=1)
    assert "shard not found" in missing.stderr
    result = run(
        "migrate", index, "-c", catalog, "--remap", f"{tmp_path / 'old'}={tmp_path / 'new'}",
        "-d", "mine",
    )  # fmt: skip
    assert "remapped" in result.stderr
    with Catalog(catalog) as cat:
        assert cat.info("mine").records == 120


def test_refused_pickle_is_one_line_and_exit_code_1(tmp_path: Path):
    marker = tmp_path / "created"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (tmp_path / "x.index").write_bytes(pickle.dumps({"k": Evil()}))
    result = run("migrate", tmp_path, code=1)
    assert (
        result.stderr.strip().startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
    )
    assert "refused to load this pickle" in result.stderr and "x.index" in result.stderr
    assert "Traceback" not in result.output
    assert not marker.exists()


def test_upgrade_and_usage_errors(tmp_path: Path):
    write_tfrecords(tmp_path, shards=1)
    db = tmp_path / "c.sqlite"
    with Catalog(db) as cat:
        cat.ingest(str(tmp_path / "*.tfrecord"), "t", workers=1).close()
    downgrade_to_v1(db)  # what a version-1 catalog is (see test_migrations.py)
    assert "upgraded from 1" in run("migrate", "--upgrade", "-c", db).stdout
    assert "(up to date)" in run("migrate", "--upgrade", "-c", db).stdout
    with Catalog(db, readonly=True) as cat:
        assert cat.info("t").records == 40
    assert "takes no PATHS" in run("migrate", "--upgrade", tmp_path, "-c", db, code=1).stderr
    assert (
        "no catalog at" in run("migrate", "--upgrade", "-c", tmp_path / "no.sqlite", code=1).stderr
    )
    assert "give the directories" in run("migrate", code=1).stderr


def test_catalog_upgrade_is_its_own_command_and_migrate_upgrade_says_so(tmp_path: Path):
    write_tfrecords(tmp_path, shards=1)
    db = tmp_path / "c.sqlite"
    with Catalog(db) as cat:
        cat.ingest(str(tmp_path / "*.tfrecord"), "t", workers=1).close()
    downgrade_to_v1(db)
    done = run("upgrade", "-c", db)
    assert done.stdout == (
        f"{db}: schema version {SCHEMA_VERSION} (upgraded from 1: "
        "older shardcat versions can no longer open it)\n"
    )
    assert done.stderr == ""
    assert (
        run("upgrade", "-c", db).stdout == f"{db}: schema version {SCHEMA_VERSION} (up to date)\n"
    )
    old = run("migrate", "--upgrade", "-c", db)
    assert old.stdout == f"{db}: schema version {SCHEMA_VERSION} (up to date)\n"
    assert old.stderr == (
        "warning: `catalog migrate --upgrade` is deprecated: run `catalog upgrade`\n"
    )
    assert "no catalog at" in run("upgrade", "-c", tmp_path / "no.sqlite", code=1).stderr
