"""Directories written by the tensorblob package: a read leaves them as they were,
converting them takes a write mode (or ``catalog migrate``) and says so."""

from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tensordict")
tensorblob = pytest.importorskip("tensorblob")

from typer.testing import CliRunner  # noqa: E402

from shardcat import CatalogError, TensorBlob, TensorDB  # noqa: E402
from shardcat.cli import app  # noqa: E402
from shardcat.errors import ShardcatWarning  # noqa: E402

FIELDS = {"label": ("int64", ()), "embed": ("float32", (2,))}


def snapshot(directory: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``directory``: its SHA-256 and mtime."""
    found = {}
    for root, _dirs, files in os.walk(directory):
        for name in files:
            path = Path(root) / name
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            found[str(path.relative_to(directory))] = (digest, path.stat().st_mtime_ns)
    return found


def write_blob(path: Path, n: int = 21) -> torch.Tensor:
    data = torch.arange(n * 6, dtype=torch.float32).reshape(n, 2, 3)
    with tensorblob.TensorBlob.open(path, "w", dtype="float32", shape=(2, 3), block_size=8) as b:
        b.write(data)
    return data


def write_db(path: Path, n: int = 13) -> dict[str, torch.Tensor]:
    rows = {
        "label": torch.arange(n) % 5,
        "embed": torch.arange(2 * n, dtype=torch.float32).reshape(n, 2),
    }
    with tensorblob.TensorDB.open(path, "w", schema=FIELDS, block_size=4) as db:
        db.write(rows)
    return rows


def test_a_read_only_open_of_a_tensorblob_blob_changes_nothing(tmp_path: Path) -> None:
    data = write_blob(tmp_path / "b")
    before = snapshot(tmp_path / "b")
    with TensorBlob.open(tmp_path / "b", "r") as b:
        assert (len(b), b.dtype, b.shape, b.block_size) == (21, "float32", (2, 3), 8)
        assert torch.equal(b[:], data)
        assert torch.equal(b[[20, 0, 9]], data[[20, 0, 9]])
        assert torch.equal(b.read(3), data[:3])
        copy = pickle.loads(pickle.dumps(b))  # reopened in place too
        assert torch.equal(copy[5], data[5])
        copy.close()
        with pytest.raises(OSError, match="not open for writing"):
            b.write(data[:1])
    assert snapshot(tmp_path / "b") == before  # byte for byte, no file added or touched
    with tensorblob.TensorBlob.open(tmp_path / "b", "r") as theirs:  # still tensorblob's
        assert torch.equal(theirs[:], data)


def test_a_read_only_open_of_a_tensorblob_database_changes_nothing(tmp_path: Path) -> None:
    rows = write_db(tmp_path / "d")
    before = snapshot(tmp_path / "d")
    with TensorDB.open(tmp_path / "d") as db:
        assert (len(db), db.block_size, db.filterable) == (13, 4, ())
        got = db[:]
        assert torch.equal(got["label"], rows["label"])
        assert torch.equal(got["embed"], rows["embed"])
        assert torch.equal(db.column("embed")[[12, 1]], rows["embed"][[12, 1]])
        assert db.get("nope") is None
        assert db.where("position < 3") == []  # no key, no filterable field: no SQL rows
    assert snapshot(tmp_path / "d") == before
    with tensorblob.TensorDB.open(tmp_path / "d", "r") as theirs:
        assert torch.equal(theirs[:]["label"], rows["label"])


def test_a_read_follows_what_tensorblob_committed_since(tmp_path: Path) -> None:
    """Nothing is cached between opens: each open reads the current .conf/.stat."""
    data = write_blob(tmp_path / "b", 5)
    with TensorBlob.open(tmp_path / "b") as b:
        assert len(b) == 5
    with tensorblob.TensorBlob.open(tmp_path / "b", "a") as theirs:
        theirs.write(data)
    with TensorBlob.open(tmp_path / "b") as b:
        assert torch.equal(b[:], torch.cat([data, data]))


def test_a_write_mode_converts_and_says_so(tmp_path: Path) -> None:
    data = write_blob(tmp_path / "b")
    with pytest.warns(ShardcatWarning, match="converting") as caught:
        b = TensorBlob.open(tmp_path / "b", "a")
    b.write(data[:2])
    b.close()
    (message,) = [str(w.message) for w in caught if issubclass(w.category, ShardcatWarning)]
    assert str(tmp_path / "b") in message
    assert "tensorblob package can no longer open it" in message
    assert "mode 'r'" in message  # how to read without converting
    assert not (tmp_path / "b" / ".conf").exists()
    with TensorBlob.open(tmp_path / "b") as again:
        assert torch.equal(again[:], torch.cat([data, data[:2]]))
    with pytest.raises(FileNotFoundError, match=r"\.conf"):
        tensorblob.TensorBlob.open(tmp_path / "b", "r")  # as the warning said


def test_catalog_migrate_says_tensorblob_can_no_longer_open_it(tmp_path: Path) -> None:
    write_db(tmp_path / "d")
    before = snapshot(tmp_path / "d")
    dry = CliRunner().invoke(app, ["migrate", str(tmp_path / "d"), "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "would be converted in place (the tensorblob package could no longer" in dry.output
    assert snapshot(tmp_path / "d") == before
    result = CliRunner().invoke(app, ["migrate", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    assert "converted in place" in result.output
    assert "the tensorblob package can no longer open it" in result.output
    assert "warning" not in result.output  # the explicit conversion does not warn as well


def test_a_converted_database_says_its_fields_are_not_in_sql(tmp_path: Path) -> None:
    rows = write_db(tmp_path / "d")
    for mode in ("r", "r+"):  # read in place, then converted
        with pytest.warns(ShardcatWarning) if mode == "r+" else _nothing():
            db = TensorDB.open(tmp_path / "d", mode)
        with db:
            with pytest.raises(CatalogError) as caught:
                db.where("label = 3")
            message = str(caught.value)
            assert "field 'label' is not in SQL" in message
            assert "written by the tensorblob package has none" in message
            assert "'filter': True" in message  # what puts a field there
            assert "new.extend(db, maintain_order=True)" in message  # how to get this one there
            with pytest.raises(CatalogError, match="field 'embed' is not in SQL"):
                db.query("SELECT max(embed) FROM rows")
            with pytest.raises(CatalogError, match="no such column: nope"):
                db.where("nope = 3")  # not a field: the database's own words
    # the way the message gives works
    schema = {"label": ("int64", (), {"filter": True}), "embed": FIELDS["embed"]}
    with (
        TensorDB.open(tmp_path / "f", "w", schema=schema) as new,
        TensorDB.open(tmp_path / "d") as db,
    ):
        new.extend(db, maintain_order=True)
        assert new.where("label = 3") == [i for i in range(13) if rows["label"][i] == 3]


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def test_a_forked_child_reads_in_place_too(tmp_path: Path) -> None:
    """After fork, the child builds its own in-memory metadata (never the parent's
    SQLite connection) and reads the same rows."""
    rows = write_db(tmp_path / "d")
    before = snapshot(tmp_path / "d")
    with TensorDB.open(tmp_path / "d") as db:
        assert db.where("position >= 0") == []  # the parent's connection exists
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            ok = torch.equal(db[:]["label"], rows["label"]) and db.where("key = 'x'") == []
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert torch.equal(db[[3]]["embed"], rows["embed"][[3]])
    assert snapshot(tmp_path / "d") == before
