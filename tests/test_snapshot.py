"""Snapshots (``Catalog.snapshot``, ``catalog snapshot``): the same bytes as the source,
paths valid where the snapshot lies, provenance, atomic writes; and the safety rails:
network filesystems warn, immutable readers refuse a catalog that changed under them."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import multiprocessing
import os
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardcat import Catalog, CatalogError, IngestError
from shardcat.catalog import mounts, snapshot, tables
from shardcat.catalog import store as store_module
from shardcat.cli import app
from shardcat.errors import NetworkFilesystemWarning
from shardcat.formats.tfrecord import TFRecordWriter, make_example

runner = CliRunner()


def write_shards(directory: Path, shards: int = 3, n: int = 50) -> dict[str, bytes]:
    directory.mkdir(parents=True, exist_ok=True)
    images = {}
    for s in range(shards):
        with TFRecordWriter(directory / f"part-{s}.tfrecord") as w:
            for i in range(n):
                key = f"k{s}_{i:03d}"
                images[key] = os.urandom(20 + i)
                w.write(make_example({"key": key, "label": i % 4, "image": images[key]}))
    return images


def write_tar(path: Path, n: int = 20) -> dict[str, bytes]:
    contents = {}
    with tarfile.open(path, "w") as tar:
        for i in range(n):
            for ext in ("jpg", "cls"):
                data = os.urandom(100 + i) if ext == "jpg" else str(i % 3).encode()
                contents[f"s{i:03d}.{ext}"] = data
                info = tarfile.TarInfo(f"s{i:03d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return contents


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A catalog with a TFRecord dataset (a field index on label), a tar dataset and a
    gzip-compressed tar dataset, its shards below the catalog's directory."""
    data = tmp_path / "data"
    write_shards(data / "train")
    write_tar(data / "samples.tar")
    plain = data / "plain.tar"
    write_tar(plain, 30)
    (data / "packed.tar.gz").write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    with Catalog(data / "catalog.sqlite") as cat:
        cat.ingest(data / "train" / "*.tfrecord", "train", workers=1).close()
        cat.create_index("train", "label")
        cat.ingest(data / "samples.tar", "samples", workers=1).close()
        cat.ingest(data / "packed.tar.gz", "packed", workers=1).close()
    return data / "catalog.sqlite"


def same_reads(a: Catalog, b: Catalog) -> None:
    """Every read of every dataset of ``a`` gives what ``b`` gives."""
    for info in b.datasets():
        with a.dataset(info.name) as x, b.dataset(info.name) as y:
            keys = y.get_keys()
            assert x.get_keys() == keys and len(x) == len(y) == info.records
            assert x.get_many(keys, raw=True) == y.get_many(keys, raw=True)
            assert x.get_many_at(slice(None), raw=True) == y.get_many_at(slice(None), raw=True)
            assert [x.key_at(p) for p in range(len(y))] == keys
            for key in keys[::7]:
                assert x.get_raw(key) == y.get_raw(key)
            assert {**x.get_stats(), "index_file": None} == {**y.get_stats(), "index_file": None}
        assert dataclasses.replace(a.info(info.name), source=[]) == dataclasses.replace(
            info, source=[]
        )
    assert a.query("SELECT key, label FROM train WHERE label = 2") == b.query(
        "SELECT key, label FROM train WHERE label = 2"
    )


@pytest.mark.parametrize("fast", [True, False], ids=["sqlite-copies-rows", "portable-sql"])
def test_snapshot_reads_the_same_bytes(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fast: bool
) -> None:
    monkeypatch.setattr(snapshot, "FAST_SQLITE", fast)
    out = source.parent / "published" / "snap.sqlite"
    with Catalog(source, readonly=True) as cat:
        result = cat.snapshot(["train", "samples", "packed"], out)
    assert [(d.name, d.shards, d.records, d.left_out) for d in result.datasets] == [
        ("train", 3, 150, {}),
        ("samples", 1, 20, {}),
        ("packed", 1, 30, {}),
    ]
    assert result.provenance.snapshot_of == str(source)
    assert sorted(os.listdir(out.parent)) == ["snap.sqlite"]  # one file, no temporary left
    assert out.read_bytes()[18:20] == b"\x01\x01"  # rollback journal: no -wal/-shm to read it
    with Catalog(out, immutable=True) as snap, Catalog(source, readonly=True) as src:
        same_reads(snap, src)
        with snap.dataset("train") as a, src.dataset("train") as b:
            assert a.where("label = 3") == b.where("label = 3") != []
            assert a.get_feature("k1_007", "label") == 3
        with snap.dataset("samples") as a, src.dataset("samples") as b:
            assert a.get_feature("s005", "jpg") == b.get_feature("s005", "jpg") is not None
        assert snap.info("train").indexed == ["label"]
        seek = "SELECT shard_id, kind, data FROM shardcat_seek_indexes"
        assert snap.query(seek) == src.query(seek) != []
        members = "SELECT * FROM shardcat_members ORDER BY shard_id, ordinal, name"
        assert snap.query(members) == src.query(members) != []
        # the shards lie beside the snapshot's directory, not below it: absolute paths
        paths = [r[0] for r in snap.query("SELECT path FROM shardcat_shards ORDER BY path")]
        assert paths == sorted(
            str(source.parent / p)
            for p in (
                "packed.tar.gz",
                "samples.tar",
                *(f"train/part-{s}.tfrecord" for s in range(3)),
            )
        )
        info = snap.snapshot_info()
        assert info is not None and info.snapshot_of == str(source)
        versions = {
            d.name: src.store.reader_connection()
            .execute("SELECT version FROM shardcat_datasets WHERE name = ?", (d.name,))
            .fetchone()[0]
            for d in src.datasets()
        }
        assert info.versions == versions
        assert src.snapshot_info() is None


@pytest.mark.parametrize("fast", [True, False], ids=["sqlite-copies-rows", "portable-sql"])
def test_tar_members_and_gzip_seek_points_are_used(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fast: bool
) -> None:
    monkeypatch.setattr(snapshot, "FAST_SQLITE", fast)
    out = tmp_path / "snap.sqlite"
    with Catalog(source) as cat:
        cat.snapshot(["samples", "packed"], out)
    with Catalog(out, immutable=True) as snap, Catalog(source, readonly=True) as src:
        for name in ("samples", "packed"):
            with snap.dataset(name) as a, src.dataset(name) as b:
                for key in b.get_keys():
                    assert a.get_feature(key, "jpg") == b.get_feature(key, "jpg")
                    assert a.get_feature(key, "cls") == b.get_feature(key, "cls")
        assert [d.name for d in snap.datasets()] == ["packed", "samples"]
        assert snap.query("SELECT count(*) FROM shardcat_seek_indexes") == [(1,)]


def test_shards_below_the_snapshot_are_relative_and_the_tree_moves(
    source: Path, tmp_path: Path
) -> None:
    out = source.parent / "snap.sqlite"
    with Catalog(source) as cat:
        cat.snapshot("train", out)
    with Catalog(out, immutable=True) as snap:
        paths = [r[0] for r in snap.query("SELECT path FROM shardcat_shards ORDER BY path")]
        assert paths == [f"train/part-{s}.tfrecord" for s in range(3)]
        assert snap.info("train").source == ["train/*.tfrecord"]
    moved = tmp_path / "moved"
    shutil.copytree(source.parent, moved, copy_function=shutil.copy2)  # mtimes kept
    with Catalog(moved / "snap.sqlite", immutable=True) as snap, snap.dataset("train") as r:
        assert len(r) == 150 and r.verify() == []
        assert r.get_feature("k2_049", "label") == 1


def test_pending_and_failed_shards_are_left_out(tmp_path: Path) -> None:
    write_shards(tmp_path / "d", shards=2)
    (tmp_path / "d" / "part-9.tfrecord").write_bytes(b"\x05" * 40)  # not a TFRecord
    with Catalog(tmp_path / "c.sqlite") as cat:
        with pytest.raises(IngestError):
            cat.ingest(tmp_path / "d" / "*.tfrecord", "train", workers=1)
        result = cat.snapshot("train", tmp_path / "s.sqlite")
    (copy,) = result.datasets
    assert (copy.shards, copy.records, copy.left_out) == (2, 100, {"failed": 1})
    done = runner.invoke(
        app, ["snapshot", "train", "-c", str(tmp_path / "c.sqlite"), "-o", str(tmp_path / "t")]
    )
    assert done.exit_code == 0, done.output
    assert "train: 100 records in 2 shards" in done.stdout
    assert "train: left out 1 shard(s) never indexed (1 failed)" in done.stdout
    with Catalog(tmp_path / "t", immutable=True) as snap:
        assert snap.query("SELECT state, count(*) FROM shardcat_shards GROUP BY state") == [
            ("ready", 2)
        ]


def test_overwrite_refused_unless_forced_and_failures_leave_nothing(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "snap.sqlite"
    with Catalog(source, readonly=True) as cat:
        cat.snapshot("train", out)
        before = out.read_bytes()
        with pytest.raises(CatalogError, match=r"exists \(overwrite=True / --force replaces it\)"):
            cat.snapshot("samples", out)
        with pytest.raises(CatalogError, match="its own source catalog"):
            cat.snapshot("samples", source, overwrite=True)
        with pytest.raises(CatalogError, match="no dataset 'nope'"):
            cat.snapshot(["train", "nope"], tmp_path / "other.sqlite")

        def broken(*args: object) -> None:
            raise sqlite3.OperationalError("disk I/O error")

        monkeypatch.setattr(tables, "create_view", broken)
        with pytest.raises(CatalogError, match=f"cannot write the snapshot {out}: disk I/O"):
            cat.snapshot("samples", out, overwrite=True)
        assert sorted(os.listdir(tmp_path)) == ["data", "snap.sqlite"]
        assert out.read_bytes() == before  # the old snapshot stays whole
        monkeypatch.undo()
        cat.snapshot("samples", out, overwrite=True)
    with Catalog(out, immutable=True) as snap:
        assert [d.name for d in snap.datasets()] == ["samples"]
    done = runner.invoke(app, ["snapshot", "train", "-c", str(source), "-o", str(out)])
    assert done.exit_code == 1 and "(--force replaces it)" in done.stderr
    done = runner.invoke(app, ["snapshot", "train", "-c", str(source), "-o", str(out), "--force"])
    assert done.exit_code == 0, done.output


def test_verify_and_stats_name_the_source(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "snap.sqlite"
    done = runner.invoke(app, ["snapshot", "train", "-c", str(source), "-o", str(out), "--json"])
    assert done.exit_code == 0, done.output
    taken = json.loads(done.stdout)
    assert taken["snapshot_of"] == str(source) and taken["datasets"][0]["records"] == 150
    line = f"{out}: snapshot of {source} taken at {taken['snapshot_at']}"
    for command in (["verify", "train"], ["stats", "train"], ["datasets"]):
        done = runner.invoke(app, [*command, "-c", str(out), "--immutable"])
        assert done.exit_code == 0, done.output
        assert line in done.stderr
    done = runner.invoke(app, ["verify", "train", "-c", str(source)])
    assert "snapshot of" not in done.stderr


def test_snapshot_opens_immutable_from_a_read_only_directory(source: Path, tmp_path: Path) -> None:
    from test_readonly_modes import _read_only_mount

    published = source.parent / "ro"
    published.mkdir()
    with Catalog(source) as cat:
        cat.snapshot(["train", "samples"], published / "snap.sqlite")
    prefix = _read_only_mount(published)
    if prefix is None:
        pytest.skip("cannot mount a directory read-only here (no unshare -m / -rm)")
    script = (
        "import sys, hashlib\n"
        "from shardcat import Catalog\n"
        "with Catalog(sys.argv[1], immutable=True) as cat:\n"
        "    for name in ('train', 'samples'):\n"
        "        with cat.dataset(name) as r:\n"
        "            print(name, hashlib.sha256(repr(r.get_many(r.get_keys(), raw=True))"
        ".encode()).hexdigest())\n"
    )
    done = subprocess.run(
        [*prefix, sys.executable, "-c", script, str(published / "snap.sqlite")],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    import hashlib

    with Catalog(source, readonly=True) as cat:
        expected = ""
        for name in ("train", "samples"):
            with cat.dataset(name) as r:
                digest = hashlib.sha256(repr(r.get_many(r.get_keys(), raw=True)).encode())
                expected += f"{name} {digest.hexdigest()}\n"
    assert done.stdout == expected
    assert sorted(os.listdir(published)) == ["snap.sqlite"]


# -- safety rail A: network filesystems ---------------------------------------------------


def fake_mountinfo(tmp_path: Path, mounts_: list[tuple[str, str]]) -> Path:
    lines = ["22 1 0:21 / / rw,relatime - ext4 /dev/sda1 rw"]
    for i, (point, fstype) in enumerate(mounts_):
        escaped = point.replace(" ", "\\040")
        lines.append(f"{30 + i} 22 0:{40 + i} / {escaped} rw,relatime - {fstype} srv:/x rw")
    path = tmp_path / "mountinfo"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_writable_catalog_on_nfs_warns_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared dir"
    shared.mkdir()
    monkeypatch.setattr(mounts, "MOUNTINFO", str(fake_mountinfo(tmp_path, [(str(shared), "nfs4")])))
    monkeypatch.setattr(mounts, "_warned", set())
    with pytest.warns(NetworkFilesystemWarning) as caught:
        Catalog(shared / "c.sqlite").close()
    (warning,) = caught
    text = str(warning.message)
    assert f"(nfs4 mounted at {shared})" in text
    assert text.startswith(f"catalog {shared / 'c.sqlite'} is on a network filesystem (nfs4 ")
    assert "postgresql://" in text and "catalog snapshot" in text and "immutable=True" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Catalog(shared / "c.sqlite").close()  # once per catalog
        Catalog(shared / "c.sqlite", readonly=True).close()  # readers are not warned
        Catalog(tmp_path / "local.sqlite").close()  # ext4
    # the CLI prints it as one line, no traceback, and goes on
    monkeypatch.setattr(mounts, "_warned", set())
    write_shards(shared / "d", shards=1, n=3)
    done = runner.invoke(
        app, ["ingest", str(shared / "d"), "-d", "t", "-c", str(shared / "c.sqlite"), "-w", "1"]
    )
    assert done.exit_code == 0, done.output
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("warning:")]
    assert "on a network filesystem (nfs4" in line and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("fstype", "warns"),
    [
        ("nfs", True),
        ("cifs", True),
        ("fuse.sshfs", True),
        ("lustre", True),
        ("gpfs", True),
        ("9p", True),
        ("ceph", True),
        ("ext4", False),
        ("tmpfs", False),
        ("overlay", False),
        ("xfs", False),
    ],
)
def test_filesystem_types(fstype: str, warns: bool) -> None:
    assert mounts.is_network(fstype) is warns


def test_longest_mount_point_wins(tmp_path: Path) -> None:
    inner = tmp_path / "a" / "b"
    (inner / "c").mkdir(parents=True)
    table = fake_mountinfo(tmp_path, [(str(tmp_path / "a"), "nfs"), (str(inner), "ext4")])
    assert mounts.mount_of(inner / "c" / "x.sqlite", str(table)).fstype == "ext4"
    assert mounts.mount_of(tmp_path / "a" / "x.sqlite", str(table)).fstype == "nfs"
    assert mounts.mount_of(tmp_path / "ab.sqlite", str(table)).fstype == "ext4"  # not /a
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "a")
    assert mounts.mount_of(link / "new" / "x.sqlite", str(table)).fstype == "nfs"


def test_the_real_mount_table_parses() -> None:
    with open(mounts.MOUNTINFO, encoding="utf-8") as f:
        parsed = mounts.parse_mountinfo(f.read())
    assert parsed and any(m.point == "/" for m in parsed)
    here = mounts.mount_of(Path.cwd())
    assert here is not None and here.fstype in {m.fstype for m in parsed}


def test_local_catalogs_do_not_warn(tmp_path: Path) -> None:
    where = mounts.mount_of(tmp_path)
    assert where is not None
    if mounts.is_network(where.fstype):
        pytest.skip(f"the temporary directory is on {where.fstype}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Catalog(tmp_path / "c.sqlite").close()


# -- safety rail B: immutable readers and a file that changed ------------------------------


@pytest.fixture
def two_snapshots(source: Path, tmp_path: Path) -> tuple[Path, Path]:
    """Snapshots of two catalogs with the same keys and other bytes for them."""
    write_shards(tmp_path / "other")  # the same keys, other random images
    with Catalog(tmp_path / "other" / "c.sqlite") as other:
        other.ingest(tmp_path / "other" / "*.tfrecord", "train", workers=1).close()
        other.snapshot("train", tmp_path / "b.sqlite")
    with Catalog(source) as cat:
        cat.snapshot(["train", "samples"], tmp_path / "a.sqlite")
    return tmp_path / "a.sqlite", tmp_path / "b.sqlite"


CHANGED = "immutable catalog .* changed since it was opened .*: reopen it"


@pytest.mark.parametrize("how", ["replace", "rewrite"])
def test_an_immutable_reader_refuses_a_changed_file(
    two_snapshots: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    a, b = two_snapshots
    with Catalog(a, immutable=True) as cat, cat.dataset("train") as reader:
        expected = reader.get_raw("k0_001")
        assert reader.get_raw("k0_001") == expected
        if how == "replace":
            os.replace(b, a)  # another catalog (other dataset ids) under the same name
        else:
            with open(a, "r+b") as f:  # the other catalog's bytes, into the same file
                f.write(b.read_bytes())
                f.truncate()
        monkeypatch.setattr(store_module, "SNAPSHOT_SECONDS", 0.0)  # the next snapshot now
        for read in (
            lambda: reader.get_raw("k0_001"),
            lambda: reader.get_many(["k0_001", "k1_002"]),
            lambda: reader.get_many_at(slice(0, 5)),
            lambda: reader.where("label = 1"),
            lambda: cat.datasets(),
            lambda: cat.query("SELECT count(*) FROM train"),
        ):
            with pytest.raises(CatalogError, match=CHANGED):
                read()
    with Catalog(a, immutable=True) as again, again.dataset("train") as reader:
        assert reader.get_raw("k0_001") != expected  # reopened: the new file's bytes


def test_a_rewrite_inside_a_read_snapshot_is_refused(
    two_snapshots: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within one read snapshot (no new one begins), every lookup still sees a file
    rewritten in place, before SQLite could read a page of the new bytes."""
    a, b = two_snapshots
    monkeypatch.setattr(store_module, "SNAPSHOT_SECONDS", 3600.0)  # one snapshot throughout
    with Catalog(a, immutable=True) as cat, cat.dataset("train") as reader:
        serial = reader._serial  # the read snapshot the reader last loaded shards in
        expected = reader.get_raw("k0_001")
        with open(a, "r+b") as f:
            f.write(b.read_bytes())
            f.truncate()
        for read in (
            lambda: reader.get_raw("k0_001"),
            lambda: reader.get_many(["k0_001"]),
            lambda: reader.get_record_at(3),
        ):
            with pytest.raises(CatalogError, match=CHANGED):
                read()
        assert reader._serial == serial  # the same snapshot: the per-lookup check
    assert expected is not None


def _child_read(reader: object, out: object) -> None:
    try:
        out.put(("ok", reader.get_raw("k0_001")))  # type: ignore[attr-defined]
    except CatalogError as exc:
        out.put(("error", str(exc)))  # type: ignore[attr-defined]


def test_a_forked_worker_refuses_a_changed_file(two_snapshots: tuple[Path, Path]) -> None:
    a, b = two_snapshots
    ctx = multiprocessing.get_context("fork")
    with Catalog(a, immutable=True) as cat, cat.dataset("train") as reader:
        reader.get_raw("k0_001")
        os.replace(b, a)
        out = ctx.Queue()
        child = ctx.Process(target=_child_read, args=(reader, out))
        child.start()
        kind, value = out.get(timeout=60)
        child.join(60)
    assert kind == "error" and "changed since it was opened" in value


def test_a_commit_between_the_reads_is_refused(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attached copy reads its own moment of a SQLite source: a commit after the
    portable reads (here: a version bump) is caught, and nothing is left behind."""
    real = snapshot._copy_attached

    def then_commit(*args: object) -> int:
        with sqlite3.connect(source) as conn:
            conn.execute("UPDATE shardcat_datasets SET version = version + 1")
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(snapshot, "_copy_attached", then_commit)
    with (
        Catalog(source) as cat,
        pytest.raises(CatalogError, match="changed while the snapshot was taken"),
    ):
        cat.snapshot("train", tmp_path / "s.sqlite")
    assert sorted(os.listdir(tmp_path)) == ["data"]
