"""Input past the limits of the types it is stored in: integers beyond 64 bits in
tar field members, legacy index lengths that do not decode, and TensorDB/TensorBlob
arguments of the wrong kind. Each is a clear ``ShardcatError`` (or a kept value
and one warning), never an ``unexpected ...`` error that loses a shard."""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
import tarfile
import warnings
from pathlib import Path
from typing import Any

import pytest
from legacy_fixtures import tfd_tfrecord_index, write_tfrecords

from shardcat import Catalog, LegacyIndexError
from shardcat.errors import ShardcatError, ShardcatWarning

BIG = 18446744073709551616  # 2**64


def _tar(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def test_integers_beyond_int64_are_kept_as_text_with_one_warning(tmp_path: Path) -> None:
    members = {
        "a.cls": str(BIG).encode(),
        "a.id": b"-9223372036854775809",  # one below int64's least
        "a.json": json.dumps({"n": BIG, "ok": 5}).encode(),
        "b.cls": b"7",
        "b.id": b"9223372036854775807",  # int64's greatest: still an integer
        "c.cls": str(-BIG).encode(),
    }
    _tar(tmp_path / "s.tar", members)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Catalog(tmp_path / "c.sqlite") as cat:
            cat.ingest(tmp_path / "s.tar", dataset="d", workers=1).close()
            rows = cat.query("SELECT key, cls, id, json_n, json_ok FROM d ORDER BY position")
            # the column takes the type of the first value (here text); SQLite compares
            # a text column with a number as text
            assert cat.query("SELECT key FROM d WHERE cls = 7") == [("b",)]
            assert cat.query(f"SELECT key FROM d WHERE cls = '{BIG}'") == [("a",)]
    assert rows == [
        ("a", str(BIG), "-9223372036854775809", str(BIG), 5),
        ("b", "7", "9223372036854775807", None, None),
        ("c", str(-BIG), None, None, None),
    ]
    mine = [w for w in caught if issubclass(w.category, ShardcatWarning)]
    assert len(mine) == 1, [str(w.message) for w in caught]
    message = str(mine[0].message)
    assert message == (
        f"{tmp_path / 's.tar'}: 4 values beyond 64-bit integers kept as text "
        f"(fields cls, id, json_n; e.g. cls = {BIG}); a field that already holds integers "
        "in the catalog stores them as rounded REALs"
    )


def test_after_integers_sqlite_stores_them_as_real(tmp_path: Path) -> None:
    """What the warning says of a field whose column holds integers already."""
    _tar(tmp_path / "a.tar", {"a.cls": b"7"})
    _tar(tmp_path / "b.tar", {"b.cls": str(BIG).encode()})
    with Catalog(tmp_path / "c.sqlite") as cat:
        with pytest.warns(ShardcatWarning, match="rounded REALs"):
            cat.ingest(tmp_path, dataset="d", workers=1).close()
        assert cat.query("SELECT key, cls FROM d ORDER BY key") == [("a", 7), ("b", float(BIG))]


def test_catalog_ingest_indexes_the_shard_and_says_so(tmp_path: Path) -> None:
    _tar(tmp_path / "s.tar", {"a.cls": str(BIG).encode(), "a.txt": b"x"})
    catalog = tmp_path / "c.sqlite"
    result = subprocess.run(
        [sys.executable, "-m", "shardcat", "ingest", str(tmp_path / "s.tar"), "-c", str(catalog)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "beyond 64-bit integers kept as text" in result.stderr
    assert "unexpected" not in result.stderr
    with Catalog(catalog) as cat:
        assert cat.query("SELECT key, cls FROM s") == [("a", str(BIG))]


def test_legacy_lengths_that_do_not_decode_are_a_legacy_index_error(tmp_path: Path) -> None:
    paths = write_tfrecords(tmp_path, shards=1, per_shard=5)
    index = tfd_tfrecord_index([str(p) for p in paths])
    entries = pickle.loads(index.read_bytes())
    for info in entries.values():
        info["length"] += 7  # cuts into the next frame: the payload does not decode
    index.write_bytes(pickle.dumps(entries))
    with Catalog(tmp_path / "c.sqlite") as cat, pytest.raises(LegacyIndexError) as caught:
        cat.migrate(index)
    error = caught.value
    assert error.path == str(index)
    assert "does not decode as a TFRecord Example" in str(error)
    assert "offset or length is wrong" in str(error)
    result = subprocess.run(
        [sys.executable, "-m", "shardcat", "migrate", str(index), "-c", str(tmp_path / "d.sqlite")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    assert "does not decode as a TFRecord Example" in result.stderr
    assert "unexpected" not in result.stderr


# -- TensorDB / TensorBlob input errors ------------------------------------------------------


def _storage_errors(tmp_path: Path) -> list[tuple[str, Any, type[BaseException]]]:
    torch = pytest.importorskip("torch")
    pytest.importorskip("tensordict")
    from shardcat import TensorBlob, TensorDB

    db_path, blob_path = tmp_path / "db", tmp_path / "blob"
    with TensorDB.open(db_path, "w", schema={"x": ("int64", ())}) as db:
        db.write({"x": torch.arange(3)})
    TensorBlob.open(blob_path, "w", dtype="float32", shape=2).close()
    db = TensorDB.open(db_path, "r+")
    blob = TensorBlob.open(blob_path, "r+")
    cases: list[tuple[str, Any, type[BaseException]]] = [
        ("mode", lambda: TensorDB.open(db_path, "rw"), ValueError),
        ("mode plus", lambda: TensorDB.open(db_path, "r++"), ValueError),
        (
            "dtype name",
            lambda: TensorDB.open(tmp_path / "n1", "w", schema={"x": ("nope", ())}),
            ValueError,
        ),
        (
            "dtype type",
            lambda: TensorDB.open(tmp_path / "n2", "w", schema={"x": (3, ())}),
            TypeError,
        ),
        (
            "dtype kind",
            lambda: TensorBlob.open(tmp_path / "n3", "w", dtype="complex64", shape=1),
            ValueError,
        ),
        (
            "shape",
            lambda: TensorDB.open(tmp_path / "n4", "w", schema={"x": ("int64", "ab")}),
            ValueError,
        ),
        (
            "shape dims",
            lambda: TensorDB.open(tmp_path / "n5", "w", schema={"x": ("int64", (0,))}),
            ValueError,
        ),
        (
            "field name",
            lambda: TensorDB.open(tmp_path / "n6", "w", schema={"a/b": ("int64", ())}),
            ValueError,
        ),
        ("schema", lambda: TensorDB.open(tmp_path / "n7", "w", schema={}), ValueError),
        (
            "block size",
            lambda: TensorDB.open(tmp_path / "n8", "w", schema={"x": ("int64", ())}, block_size=0),
            ValueError,
        ),
        ("no dtype", lambda: TensorBlob.open(tmp_path / "n9", "w"), ValueError),
        ("keys str", lambda: db.write({"x": torch.arange(1)}, keys="k"), TypeError),
        ("keys count", lambda: db.write({"x": torch.arange(2)}, keys=["k"]), ValueError),
        ("key type", lambda: db.write({"x": torch.arange(1)}, keys=[1]), TypeError),
        ("rows", lambda: db.write([1]), TypeError),
        ("fields", lambda: db.write({"y": torch.arange(1)}), ValueError),
        ("field", lambda: db.column("y"), KeyError),
        ("whence", lambda: blob.seek(0, 7), ValueError),
        ("truncate", lambda: blob.truncate(-1), ValueError),
        ("cache", lambda: TensorBlob.open(blob_path, "r", max_cached_blocks=-1), ValueError),
    ]
    cases.append(("close", lambda: (db.close(), blob.close()), type(None)))
    return cases


def test_storage_input_errors_are_shardcat_errors(tmp_path: Path) -> None:
    for name, call, builtin in _storage_errors(tmp_path):
        if builtin is type(None):
            call()
            continue
        with pytest.raises(builtin) as caught:
            call()
        assert isinstance(caught.value, ShardcatError), (name, type(caught.value))
