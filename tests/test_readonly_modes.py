"""Opening without writing: read-only CLI commands, writer opens that do not wait for the
write lock, checkpoints, ``immutable=True`` and read-only mounts."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from shardcat import Catalog, CatalogError, TFRecordWriter, make_example
from shardcat.catalog import engine
from shardcat.cli import app

runner = CliRunner()
N = 20


def _shard(path: Path, prefix: str = "k", n: int = N) -> Path:
    with TFRecordWriter(path) as writer:
        for i in range(n):
            writer.write(make_example({"key": f"{prefix}{i:02d}", "label": i % 4}))
    return path


def _build(directory: Path) -> Path:
    """A closed catalog ``cat.sqlite`` with dataset ``train`` (20 records, label = i % 4)."""
    directory.mkdir(parents=True, exist_ok=True)
    _shard(directory / "train-00000.tfrecord")
    db = directory / "cat.sqlite"
    with Catalog(db) as cat:
        cat.ingest(str(directory / "train-00000.tfrecord"), "train").close()
    return db


def _wal(db: Path) -> Path:
    return Path(f"{db}-wal")


def _killed_writer(db: Path, sql: str, committed: bool = True) -> None:
    """Commit ``sql`` and die without closing: the commit stays in the -wal file only
    (``committed=False``: a read, the -wal and -shm files stay, the -wal empty)."""
    code = (
        "import os, sqlite3, sys\n"
        "conn = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "conn.execute('PRAGMA wal_autocheckpoint = 0')\n"
        "conn.execute(sys.argv[2])\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(db), sql], check=True)
    assert _wal(db).stat().st_size > 0 if committed else _wal(db).exists()


def _holder(db: Path, sql: str) -> sqlite3.Connection:
    """A connection that committed ``sql`` into the WAL and stays open (no checkpoint)."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute(sql)
    return conn


def _file_state(path: Path) -> tuple[bytes, int]:
    return path.read_bytes(), path.stat().st_mtime_ns


def _created_at(db: Path, **mode: bool) -> float:
    with Catalog(db, **mode) as cat:
        return cat.datasets()[0].created_at


# -- 3. read commands never write -------------------------------------------------------


def _read_commands(out: Path) -> list[list[str]]:
    return [
        ["query", "SELECT 1"],
        ["datasets"],
        ["stats", "train"],
        ["list", "train"],
        ["verify", "train"],
        ["export-index", "train", "-o", str(out)],
    ]


def test_read_commands_leave_another_sqlite_file_alone(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    with conn:
        conn.execute("CREATE TABLE notes (x)")
        conn.execute("INSERT INTO notes VALUES ('keep me')")
    conn.close()
    before = _file_state(other)
    for command in _read_commands(tmp_path / "idx"):
        result = runner.invoke(app, [*command, "-c", str(other)])
        assert result.exit_code == 1, (command, result.output)
        assert result.output == (
            f"error: {other} is not a shardcat catalog (it records no schema version)\n"
        ), command
    assert _file_state(other) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


def test_writers_leave_another_sqlite_file_alone(tmp_path: Path) -> None:
    """Ingest and drop refuse a database that is not a catalog instead of adding
    the catalog's tables to it (or switching it to WAL)."""
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    with conn:
        conn.execute("CREATE TABLE notes (x)")
    conn.close()
    shard = _shard(tmp_path / "s.tfrecord")
    before = _file_state(other)
    message = (
        f"error: {other} is a SQLite database but not a shardcat catalog: refusing to add "
        "the catalog's tables to it (give another catalog path)\n"
    )
    for command in (["ingest", str(shard), "-d", "t"], ["drop", "t"]):
        result = runner.invoke(app, [*command, "-c", str(other)])
        assert (result.exit_code, result.output) == (1, message), command
    with pytest.raises(CatalogError, match="not a shardcat catalog"):
        Catalog(other)
    assert _file_state(other) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db", "s.tfrecord"]


def test_read_commands_leave_a_catalog_byte_identical(tmp_path: Path) -> None:
    db = _build(tmp_path / "data")
    # A writer killed after its last commit: that commit lives in the -wal file, and a
    # writable open would fold it into the main file (and rewrite it) when it closes.
    _killed_writer(db, "UPDATE shardcat_datasets SET created_at = 86400")
    before = {p: _file_state(p) for p in (db, _wal(db))}
    for command in _read_commands(tmp_path / "idx"):
        result = runner.invoke(app, [*command, "-c", str(db)])
        assert result.exit_code == 0, (command, result.output)
    result = runner.invoke(app, ["datasets", "-c", str(db), "--json"])
    assert json.loads(result.output)[0]["created_at"] == 86400
    assert {p: _file_state(p) for p in (db, _wal(db))} == before
    assert sorted(p.name for p in (tmp_path / "idx").iterdir()) == ["train-00000.idx"]


def test_read_commands_refuse_to_upgrade(tmp_path: Path) -> None:
    db = _build(tmp_path)
    conn = sqlite3.connect(db)
    with conn:  # looks like an older catalog: a writable open would try to upgrade it
        conn.execute("UPDATE shardcat_meta SET value = '1' WHERE name = 'schema_version'")
    conn.close()
    before = _file_state(db)
    result = runner.invoke(app, ["query", "SELECT count(*) FROM train", "-c", str(db)])
    assert result.exit_code == 1
    assert f"catalog upgrade -c {db}" in result.output
    assert len(result.output.splitlines()) == 1
    assert _file_state(db) == before


# -- 4. a writable open does not take the write lock it does not need ---------------------


def test_writable_open_does_not_wait_for_another_writer(tmp_path: Path) -> None:
    db = _build(tmp_path)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("UPDATE shardcat_datasets SET created_at = 5")  # not committed
    seen: dict[str, Any] = {}

    def open_and_read() -> None:
        try:
            with Catalog(db) as cat:
                seen["datasets"] = [(d.name, d.records, d.created_at > 5) for d in cat.datasets()]
        except Exception as exc:  # reported below
            seen["error"] = repr(exc)

    thread = threading.Thread(target=open_and_read, daemon=True)
    thread.start()
    thread.join(10)
    try:
        assert not thread.is_alive(), "Catalog() waited for another connection's write lock"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        thread.join(90)
    assert seen == {"datasets": [("train", N, True)]}


def test_open_errors_are_catalog_errors_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine, "BUSY_TIMEOUT_MS", 100)
    # A new catalog needs the write lock to create its tables: busy -> CatalogError.
    busy = tmp_path / "busy.sqlite"
    holder = sqlite3.connect(busy, isolation_level=None)
    holder.execute("PRAGMA journal_mode = WAL")  # an empty database: no tables yet
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(CatalogError) as err:
            Catalog(busy)
        assert str(err.value) == f"cannot open catalog {busy}: database is locked"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"this is not a database\n" * 200)
    for mode in ({}, {"readonly": True}, {"immutable": True}):
        with pytest.raises(CatalogError) as err:
            Catalog(garbage, **mode)
        assert str(err.value) == f"cannot open catalog {garbage}: file is not a database", mode
    assert garbage.read_bytes() == b"this is not a database\n" * 200
    directory = tmp_path / "a_directory"
    directory.mkdir()
    with pytest.raises(CatalogError) as err:
        Catalog(directory)
    # (the opener's check, which the CLI alone made before: it says why)
    assert str(err.value) == f"cannot open catalog {directory}: it is a directory"


# -- 5. checkpoints and immutable opens ---------------------------------------------------


def test_ingest_and_drop_leave_the_main_file_complete(tmp_path: Path) -> None:
    first = _shard(tmp_path / "train-00000.tfrecord")
    db = tmp_path / "cat.sqlite"
    shard2 = _shard(tmp_path / "second.tfrecord", prefix="s", n=5)
    Catalog(db).close()
    # Another process reading: SQLite no longer folds the WAL in when a writer closes.
    keeper = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    assert keeper.execute("SELECT count(*) FROM shardcat_datasets").fetchone() == (0,)
    with Catalog(db) as cat:
        cat.ingest(str(first), "train").close()
        assert _wal(db).stat().st_size == 0
        with Catalog(db, immutable=True) as snap:
            assert [(d.name, d.records) for d in snap.datasets()] == [("train", N)]
            with snap.dataset("train") as reader:
                assert reader.get_feature("k03", "label") == 3
        cat.ingest(str(shard2), "second").close()
        cat.drop("train")
        with Catalog(db, immutable=True) as snap:
            assert [(d.name, d.records) for d in snap.datasets()] == [("second", 5)]
        assert cat.checkpoint() is True
    keeper.close()


def test_checkpoint_reports_a_reader_that_keeps_the_wal(tmp_path: Path) -> None:
    db = _build(tmp_path)
    with Catalog(db) as cat:
        reader = sqlite3.connect(db, isolation_level=None)
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM shardcat_datasets").fetchone() == (1,)
        try:
            cat.drop("train")  # committed, but the reader's snapshot pins the WAL
            assert cat.checkpoint() is False
            with pytest.raises(CatalogError, match="not yet in the main file"):
                Catalog(db, immutable=True)
        finally:
            reader.execute("COMMIT")
            reader.close()
        assert cat.checkpoint() is True
        with Catalog(db, immutable=True) as snap:
            assert snap.datasets() == []


def test_immutable_refuses_wal_content_not_in_the_main_file(tmp_path: Path) -> None:
    db = _build(tmp_path)
    holder = _holder(db, "UPDATE shardcat_datasets SET created_at = 86400")
    try:
        with pytest.raises(CatalogError) as err:
            Catalog(db, immutable=True)
        assert str(err.value) == (
            f"{db} has commits in {db}-wal that are not yet in the main file, so "
            "immutable=True would not see them: open it with readonly=True instead, or "
            f"checkpoint it where it is written (`catalog checkpoint -c {db}`, "
            "Catalog.checkpoint())"
        )
        assert _created_at(db, readonly=True) == 86400
        # Every frame copied back (PASSIVE keeps the -wal file): immutable opens again.
        busy, frames, copied = holder.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        assert (busy, copied) == (0, frames)
        assert _wal(db).stat().st_size > 0
        assert _created_at(db, immutable=True) == 86400
        holder.execute("UPDATE shardcat_datasets SET created_at = 172800")
        with pytest.raises(CatalogError, match="not yet in the main file"):
            Catalog(db, immutable=True)
        with Catalog(db) as cat:
            assert cat.checkpoint() is True
        assert _wal(db).stat().st_size == 0
        assert _created_at(db, immutable=True) == 172800
    finally:
        holder.close()


def test_immutable_refuses_a_wal_without_its_shm(tmp_path: Path) -> None:
    db = _build(tmp_path / "src")
    _killed_writer(db, "UPDATE shardcat_datasets SET created_at = 86400")
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(db, copy / db.name)
    shutil.copy(_wal(db), copy / f"{db.name}-wal")  # no -shm: nothing says what is copied
    with pytest.raises(CatalogError) as err:
        Catalog(copy / db.name, immutable=True)
    assert str(err.value).startswith(f"{copy / db.name} has commits in {copy / db.name}-wal")
    assert _created_at(copy / db.name, readonly=True) == 86400


def test_cli_immutable_option_and_checkpoint_command(tmp_path: Path) -> None:
    db = _build(tmp_path)
    holder = _holder(db, "UPDATE shardcat_datasets SET created_at = 86400")
    try:
        result = runner.invoke(app, ["datasets", "-c", str(db), "--immutable"])
        assert result.exit_code == 1
        assert result.output.startswith(f"error: {db} has commits in {db}-wal")
        assert f"`catalog checkpoint -c {db}`" in result.output
        assert len(result.output.splitlines()) == 1
        result = runner.invoke(app, ["datasets", "-c", str(db), "--readonly", "--json"])
        assert json.loads(result.output)[0]["created_at"] == 86400
        result = runner.invoke(app, ["checkpoint", "-c", str(db)])
        assert result.exit_code == 0, result.output
        assert result.output == f"{db}: every commit is in the main file\n"
        for command in (
            ["datasets", "--json"],
            ["query", "SELECT created_at FROM shardcat_datasets", "--json"],
        ):
            result = runner.invoke(app, [*command, "-c", str(db), "--immutable"])
            assert result.exit_code == 0, result.output
            assert json.loads(result.output)[0]["created_at"] == 86400
        holder.execute("BEGIN")
        holder.execute("SELECT count(*) FROM shardcat_records_1").fetchone()
        with Catalog(db) as cat:
            cat.drop("train")
        result = runner.invoke(app, ["checkpoint", "-c", str(db)])
        assert result.exit_code == 1
        assert result.output == (
            f"error: {db}: readers still use the WAL, not every commit is in the main file "
            "yet; run `catalog checkpoint` again when they are done\n"
        )
    finally:
        holder.close()
    result = runner.invoke(app, ["checkpoint", "--help"])
    assert "Copy every commit" in result.output


# -- 5. read-only mounts --------------------------------------------------------------------

_MOUNT_RO = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1"'


def _read_only_mount(directory: Path) -> list[str] | None:
    """A command prefix that runs a command with ``directory`` mounted read-only."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return None
    probe = _MOUNT_RO + ' && ! touch "$1/probe" 2>/dev/null'
    for unshare in (["unshare", "-m"], ["unshare", "-rm"]):
        done = subprocess.run(
            [*unshare, "sh", "-c", probe, "sh", str(directory)], capture_output=True, check=False
        )
        if done.returncode == 0:
            return [
                *unshare,
                "sh",
                "-c",
                _MOUNT_RO + ' && shift && exec "$@"',
                "sh",
                str(directory),
            ]
    return None


_IN_MOUNT = """
import json, sys
from shardcat import Catalog, CatalogError
clean, left, dirty = sys.argv[1:]
out = {}
for name, path in (("clean", clean), ("left", left)):
    with Catalog(path, readonly=True) as cat:
        out[name] = {
            "immutable": cat.immutable,
            "datasets": [[d.name, d.records] for d in cat.datasets()],
            "count": cat.query("SELECT count(*) FROM train"),
        }
        with cat.dataset("train") as reader:
            out[name]["label"] = reader.get_feature("k03", "label")
for mode in ("readonly", "immutable"):
    try:
        Catalog(dirty, **{mode: True})
    except CatalogError as exc:
        out[mode + " error"] = str(exc)
from typer.testing import CliRunner
from shardcat.cli import app
result = CliRunner().invoke(app, ["query", "SELECT count(*) FROM train", "-c", clean, "--json"])
out["cli"] = [result.exit_code, result.output]
print(json.dumps(out))
"""


def test_readonly_open_on_a_read_only_mount(tmp_path: Path) -> None:
    mount = tmp_path / "ro"
    src = _build(tmp_path / "src")
    mount.mkdir()
    clean = mount / "cat.sqlite"  # the main file alone: no -wal, no -shm
    shutil.copy(src, clean)
    shutil.copy2(src.parent / "train-00000.tfrecord", mount)  # its mtime is indexed
    left = _build(mount / "left")  # as a process killed with it open left it: an empty
    _killed_writer(left, "SELECT count(*) FROM sqlite_master", committed=False)  # -wal, -shm
    assert not _wal(left).exists() or _wal(left).stat().st_size == 0
    _killed_writer(src, "UPDATE shardcat_datasets SET created_at = 86400")
    dirty = mount / "dirty.sqlite"
    shutil.copy(src, dirty)
    shutil.copy(_wal(src), f"{dirty}-wal")  # a catalog whose last commit is only in its WAL
    listing = sorted(str(p.relative_to(mount)) for p in mount.rglob("*"))
    prefix = _read_only_mount(mount)
    if prefix is None:
        pytest.skip("cannot mount a directory read-only here (no unshare -m / -rm)")
    done = subprocess.run(
        [*prefix, sys.executable, "-c", _IN_MOUNT, str(clean), str(left), str(dirty)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out.pop("readonly error") == (
        f"cannot open {dirty} read-only: SQLite needs to create {dirty}-shm (the "
        f"directory is read-only) to read the commits in {dirty}-wal; checkpoint it "
        f"where it is written (`catalog checkpoint -c {dirty}`, Catalog.checkpoint())"
    )
    assert out.pop("immutable error").startswith(f"{dirty} has commits in {dirty}-wal")
    opened = {"datasets": [["train", N]], "count": [[N]], "label": 3}
    assert out == {
        "clean": {"immutable": True, **opened},  # SQLite cannot create its -shm
        "left": {"immutable": False, **opened},  # SQLite reads the -shm file there
        "cli": [0, f'[\n  {{\n    "count(*)": {N}\n  }}\n]\n'],
    }
    assert sorted(str(p.relative_to(mount)) for p in mount.rglob("*")) == listing


def test_read_connections_map_a_local_catalog_never_an_immutable_one(tmp_path: Path) -> None:
    db = _build(tmp_path / "a")
    assert engine.filesystem_of(db) in engine._LOCAL_FILESYSTEMS
    assert engine.filesystem_of(Path("/proc/self/status")) == "proc"
    assert not engine.mappable(Path("/proc/self/status"))
    mapped = engine.connect_readonly(db)
    immutable = engine.connect_readonly(db, immutable=True)
    try:
        assert mapped.execute("PRAGMA mmap_size").fetchone() == (engine.READ_MMAP_BYTES,)
        assert immutable.execute("PRAGMA mmap_size").fetchone() == (0,)
    finally:
        mapped.close()
        immutable.close()


def test_a_mapped_catalog_that_grows_reads_its_new_pages(tmp_path: Path) -> None:
    """A reader's mapped connection, then an ingest that grows the file many times
    over (pages past what was mapped): both datasets read exactly."""
    db = _build(tmp_path / "a")
    big = _shard(tmp_path / "a" / "more-00000.tfrecord", prefix="m", n=30_000)
    with Catalog(db) as cat, cat.dataset("train") as train:
        assert train.get_feature("k03", "label") == 3
        before = db.stat().st_size
        cat.ingest(str(big), "more").close()
        assert db.stat().st_size > 10 * before
        with cat.dataset("more") as more:
            keys = [f"m{i:02d}" for i in range(0, 30_000, 7)]
            got = more.get_many(keys)
            assert [r.features.feature["key"].bytes_list.value[0].decode() for r in got] == keys
            assert more.get_feature("m29999", "label") == 29999 % 4
        assert [train.get_feature(f"k{i:02d}", "label") for i in range(N)] == [
            i % 4 for i in range(N)
        ]
