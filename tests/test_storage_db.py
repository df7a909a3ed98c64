"""TensorDB: row-aligned fields, one commit for all of them, SQL over filterable fields."""

from __future__ import annotations

import contextlib
import io
import math
import os
import pickle
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from shardcat.testing.required import need

torch = need("torch", why="shardcat[torch]")
need("tensordict", why="shardcat[torch]")

from typer.testing import CliRunner  # noqa: E402

from shardcat import (  # noqa: E402
    Catalog,
    CatalogError,
    DuplicateKeyError,
    KeyNotFoundError,
    ShardcatError,
    TensorDB,
    TFRecordWriter,
    make_example,
)
from shardcat.cli import app  # noqa: E402
from shardcat.errors import ShardcatWarning  # noqa: E402
from shardcat.storage import meta as storage_meta  # noqa: E402
from shardcat.storage import sql_file  # noqa: E402
from shardcat.storage.meta import META_FILE  # noqa: E402

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
SCHEMA = {
    "price": ("float32", 1, {"index": True}),
    "label": ("int64", (), {"filter": True}),
    "embed": (torch.float16, (2, 3)),
}


def batch(n: int, start: int = 0) -> dict[str, Any]:
    """Rows whose every field is derived from the row number (so alignment is checkable)."""
    i = torch.arange(start, start + n)
    return {
        "price": (i * 10).to(torch.float32).view(n, 1),
        "label": i % 7,
        "embed": (i.view(n, 1, 1) + torch.zeros(n, 2, 3)).to(torch.float16),
    }


def keys(n: int, start: int = 0, prefix: str = "k") -> list[str]:
    return [f"{prefix}{i:05d}" for i in range(start, start + n)]


def cat(*parts: dict[str, Any]) -> dict[str, Any]:
    return {name: torch.cat([p[name] for p in parts]) for name in parts[0]}


def assert_rows(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert set(got) == set(expected)
    for name in expected:
        assert got[name].shape == expected[name].shape, name
        assert torch.equal(got[name], expected[name]), name


def make(path: Path, n: int, block_size: int = 4) -> Path:
    with TensorDB.open(path, "w", schema=SCHEMA, block_size=block_size) as db:
        db.write(batch(n), keys=keys(n))
    return path


def mirror(db: Any) -> list[tuple[Any, ...]]:
    return list(db.query("SELECT position, key, price, label FROM rows ORDER BY position"))


def assert_mirror_matches(db: Any) -> None:
    """Every mirrored row has the values of the tensors at its position."""
    rows = mirror(db)
    assert [r[0] for r in rows] == list(range(len(db)))
    data = db[:]
    assert [r[2] for r in rows] == data["price"].view(-1).tolist()
    assert [r[3] for r in rows] == data["label"].tolist()


# -- opening ---------------------------------------------------------------------------------


def test_schema_is_required_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "db"
    with pytest.raises(ValueError, match="schema"):
        TensorDB.open(path, "w")
    for bad in ({}, [("a", ("float32", 1))], "a"):
        with pytest.raises(ValueError, match="non-empty dict"):
            TensorDB.open(path, "w", schema=bad)
    for name in ("", ".hidden", "a/b", 3):
        with pytest.raises(ValueError, match="Invalid field name"):
            TensorDB.open(path, "w", schema={name: ("float32", 1)})
    with pytest.raises(TypeError, match="dtype must be"):
        TensorDB.open(path, "w", schema={"a": (float, 1)})
    with pytest.raises(ValueError, match="one value per row"):
        TensorDB.open(path, "w", schema={"a": ("float32", 2, {"filter": True})})
    with pytest.raises(ValueError, match="taken in SQL"):
        TensorDB.open(path, "w", schema={"Key": ("int64", 1, {"index": True})})
    with pytest.raises(ValueError, match="unknown options"):
        TensorDB.open(path, "w", schema={"a": ("int64", 1, {"unique": True})})
    with pytest.raises(ValueError, match="letter case"):
        TensorDB.open(
            path,
            "w",
            schema={"a": ("int64", 1, {"filter": True}), "A": ("int8", 1, {"filter": True})},
        )
    assert not path.exists()


@pytest.mark.parametrize("mode", ["r", "r+", "a", "a+"])
def test_missing_database(tmp_path: Path, mode: str) -> None:
    with pytest.raises(FileNotFoundError, match="Database not found"):
        TensorDB.open(tmp_path / "db", mode)


@pytest.mark.parametrize("mode", ["", "rw", "w++", "x"])
def test_invalid_modes(tmp_path: Path, mode: str) -> None:
    with pytest.raises(ValueError, match="mode"):
        TensorDB.open(tmp_path / "db", mode, schema=SCHEMA)


def test_modes(tmp_path: Path) -> None:
    path = make(tmp_path / "db", 6)
    with TensorDB.open(path) as db:
        assert (db.mode, db.tell(), len(db), db.filterable) == ("r", 0, 6, ("price", "label"))
        assert db.schema == {
            "price": ("float32", (1,)),
            "label": ("int64", ()),
            "embed": ("float16", (2, 3)),
        }
        with pytest.raises(OSError, match="not open for writing"):
            db.write(batch(1))
        with pytest.raises(OSError, match="not open for writing"):
            db.truncate(0)
    with TensorDB.open(path, "a") as db:
        assert db.tell() == 6
        db.seek(0)
        db.write(batch(2, 6))
        with pytest.raises(OSError, match="not open for reading"):
            db.read()
    with TensorDB.open(path, "r+") as db:
        db.seek(7)
        db.write(batch(3, 100))
        assert_rows(db[:], cat(batch(7), batch(3, 100)))
    with TensorDB.open(path, "w", schema={"other": ("int8", 1)}) as db:  # keeps the schema
        assert (len(db), list(db.schema)) == (0, ["price", "label", "embed"])
        assert db.query("SELECT count(*) FROM rows") == [(0,)]
        db.write(batch(2))
    with TensorDB.open(path, "a+") as db:
        assert db.tell() == 2
        db.seek(0)
        assert_rows(db.read(1), batch(1))
        db.write(batch(1, 2))
        assert_rows(db[:], batch(3))
    from shardcat import TensorBlob

    with TensorBlob.open(tmp_path / "blob", "w", dtype="int8", shape=1):
        pass
    with pytest.raises(ValueError, match="holds a TensorBlob, not a TensorDB"):
        TensorDB.open(tmp_path / "blob")


# -- reading and writing ---------------------------------------------------------------------


def test_write_is_dense_and_checked(tmp_path: Path) -> None:
    with TensorDB.open(tmp_path / "db", "w", schema=SCHEMA) as db:
        with pytest.raises(TypeError, match="dict"):
            db.write([batch(1)])
        with pytest.raises(ValueError, match="missing: \\['embed'\\]"):
            db.write({k: v for k, v in batch(1).items() if k != "embed"})
        with pytest.raises(ValueError, match="unexpected: \\['extra'\\]"):
            db.write({**batch(1), "extra": torch.zeros(1)})
        with pytest.raises(ValueError, match="same row count"):
            db.write({**batch(2), "label": torch.zeros(3, dtype=torch.int64)})
        with pytest.raises(TypeError, match=r"does not match blob dtype .* of field 'price'"):
            db.write({**batch(2), "price": torch.zeros(2, 1, dtype=torch.float64)})
        with pytest.raises(ValueError, match="keys for"):
            db.write(batch(2), keys=["a"])
        with pytest.raises(TypeError, match="keys must be"):
            db.write(batch(1), keys="a")
        with pytest.raises(TypeError, match="keys must be str"):
            db.write(batch(1), keys=[1])
        assert len(db) == 0
        assert db.write(batch(3)) == 3
        one = {name: t[0] for name, t in batch(1, 3).items()}  # a single row
        assert db.write(one) == 1
        assert_rows(db[:], batch(4))


def test_reading_forms(tmp_path: Path) -> None:
    data = batch(23)
    with TensorDB.open(make(tmp_path / "db", 23)) as db:
        assert_rows(db[5], {k: v[5] for k, v in data.items()})
        assert_rows(db[-1], {k: v[-1] for k, v in data.items()})
        assert_rows(db[3:20:4], {k: v[3:20:4] for k, v in data.items()})
        assert_rows(db[::-5], {k: v.flip(0)[::5] for k, v in data.items()})
        picks = [22, 0, 7, 7, -2]
        assert_rows(db[picks], {k: v[[p % 23 for p in picks]] for k, v in data.items()})
        assert_rows(db[torch.tensor(picks)], db[tuple(picks)])
        with pytest.raises(IndexError):
            db[23]
        with pytest.raises(TypeError, match="Index must be"):
            db[2.5]
        db.seek(20)
        assert_rows(db.read(), {k: v[20:] for k, v in data.items()})
        db.seek(-4, io.SEEK_END)
        assert_rows(db.read(2, fields=["label"]), {"label": data["label"][19:21]})
        assert db.tell() == 21
        seen = list(db)
        assert len(seen) == 2 and db.tell() == 23
        assert_rows(seen[1], {k: v[22] for k, v in data.items()})
        empty = db.read()
        assert empty["embed"].shape == (0, 2, 3) and empty["label"].shape == (0,)


def test_write_reshapes_each_field_to_rows_as_tensorblob(tmp_path: Path) -> None:
    """As tensorblob: each field's tensor is ``view(-1, *shape)``, then row counts compared."""
    schema = {"a": ("float32", (2, 3)), "b": ("int64", 1)}
    with TensorDB.open(tmp_path / "db", "w", schema=schema) as db:
        assert (
            db.write({"a": torch.arange(12, dtype=torch.float32), "b": torch.tensor([[7, 8]])}) == 2
        )
        assert len(db) == db.tell() == 2
        with pytest.raises(ValueError, match=r"same row count; got: \{'a': 1, 'b': 2\}"):
            db.write({"a": torch.arange(6, dtype=torch.float32), "b": torch.arange(2)})
        with pytest.raises(ValueError, match="5 elements, not whole rows") as odd:
            db.write({"a": torch.arange(5, dtype=torch.float32), "b": torch.arange(2)})
        assert isinstance(odd.value, RuntimeError)  # as torch's view in tensorblob
        assert len(db) == 2
    with TensorDB.open(tmp_path / "db") as db:
        got = db[:]
        assert torch.equal(got["a"], torch.arange(12, dtype=torch.float32).view(2, 2, 3))
        assert got["b"].tolist() == [[7], [8]]


def test_a_field_name_is_not_an_index(tmp_path: Path) -> None:
    """``db["price"]`` is a TypeError in tensorblob; one field is ``db.column("price")``."""
    with TensorDB.open(make(tmp_path / "db", 5)) as db:
        with pytest.raises(TypeError) as exc:
            db["price"]
        assert str(exc.value) == "Index must be int, slice, or a sequence of int, got 'str'!"
        assert isinstance(exc.value, ShardcatError)
        assert torch.equal(db.column("price")[:], batch(5)["price"])


def test_column_projection_maps_only_that_field(tmp_path: Path) -> None:
    with TensorDB.open(make(tmp_path / "db", 40)) as db:
        price = db.column("price")
        assert (price.dtype, price.shape, len(price)) == ("float32", (1,), 40)
        assert torch.equal(price[:], batch(40)["price"])
        assert torch.equal(db.column("label")[[3, 1]], torch.tensor([3, 1]))
        assert price.mapped_blocks == 10
        assert db.column("embed").mapped_blocks == 0  # never touched
        assert_rows(db.get("k00007", fields=["label"]), {"label": torch.tensor(0)})
        assert db.column("embed").mapped_blocks == 0
        with pytest.raises(KeyError, match="no field 'nope'"):
            db.column("nope")


def test_cache_bound_applies_per_field(tmp_path: Path) -> None:
    with TensorDB.open(make(tmp_path / "db", 40), max_cached_blocks=2) as db:
        assert db.max_cached_blocks == 2
        for i in range(0, 40, 3):
            db[i]
            assert all(db.column(n).mapped_blocks <= 2 for n in db.schema)
    with TensorDB.open(tmp_path / "db") as db:
        assert db.max_cached_blocks is None  # as tensorblob: the default is not spelled out


# -- truncate and extend -----------------------------------------------------------------------


@pytest.mark.parametrize("cut", [0, 1, 4, 6, 12, 40])
def test_truncate_keeps_fields_and_rows_aligned(tmp_path: Path, cut: int) -> None:
    path = make(tmp_path / "db", 13)
    with TensorDB.open(path, "r+") as db:
        assert db.truncate(cut) == min(cut, 13)
        assert_mirror_matches(db)
        assert (db.get("k00012") is None) == (cut < 13)
        assert db.query("SELECT count(key) FROM rows") == [(min(cut, 13),)]
    for field in SCHEMA:
        blocks = [n for n in os.listdir(path / field) if UUID.match(n)]
        assert len(blocks) == math.ceil(min(cut, 13) / 4)
    with TensorDB.open(path, "a+") as db:
        db.write(batch(5, 13), keys=keys(5, 13))
        assert_rows(db[:], cat(batch(min(cut, 13)), batch(5, 13)))
        assert_mirror_matches(db)


@pytest.mark.parametrize("n_self", [0, 3, 8])
@pytest.mark.parametrize("n_other", [1, 4, 9])
@pytest.mark.parametrize("maintain_order", [True, False])
def test_extend_moves_keys_and_sql_rows_with_the_data(
    tmp_path: Path, n_self: int, n_other: int, maintain_order: bool
) -> None:
    bs = 4
    make(tmp_path / "a", n_self, block_size=bs)
    with TensorDB.open(tmp_path / "b", "w", schema=SCHEMA, block_size=bs) as b:
        b.write(batch(n_other, 500), keys=keys(n_other, 0, "o"))
    with TensorDB.open(tmp_path / "a", "r+") as a, TensorDB.open(tmp_path / "b") as b:
        a.extend(b, maintain_order=maintain_order)
        assert len(a) == a.tell() == n_self + n_other
        full, other_full = n_self // bs * bs, n_other // bs * bs
        mine, theirs = batch(n_self), batch(n_other, 500)
        if maintain_order:
            expected = cat(mine, theirs)
        else:
            part = lambda d, lo, hi: {k: v[lo:hi] for k, v in d.items()}  # noqa: E731
            expected = cat(
                part(mine, 0, full),
                part(theirs, 0, other_full),
                part(mine, full, n_self),
                part(theirs, other_full, n_other),
            )
        assert_rows(a[:], expected)
        assert_mirror_matches(a)
        for i, key in enumerate(keys(n_self)):
            assert torch.equal(a.get(key)["price"], mine["price"][i])
        for i, key in enumerate(keys(n_other, 0, "o")):
            assert torch.equal(a.get(key)["embed"], theirs["embed"][i])


def test_extend_checks_schemas_and_keys(tmp_path: Path) -> None:
    make(tmp_path / "a", 5)
    make(tmp_path / "b", 3)  # the same keys k00000..k00002
    with TensorDB.open(tmp_path / "c", "w", schema={"price": ("float32", 1)}) as c:
        pass
    with (
        TensorDB.open(tmp_path / "a", "r+") as a,
        TensorDB.open(tmp_path / "b") as b,
        TensorDB.open(tmp_path / "c") as c,
    ):
        with pytest.raises(ValueError, match="Schema fields must match"):
            a.extend(c)
        for order in (True, False):
            with pytest.raises(DuplicateKeyError, match="k00000"):
                a.extend(b, maintain_order=order)
            assert len(a) == 5
            assert_rows(a[:], batch(5))
            assert_mirror_matches(a)
    for field in SCHEMA:  # the copied blocks of the failed extends are gone
        assert len([n for n in os.listdir(tmp_path / "a" / field) if UUID.match(n)]) == 2


def test_extend_without_order_needs_the_same_block_size(tmp_path: Path) -> None:
    """As tensorblob: maintain_order=False moves whole blocks, so the block sizes must match."""
    make(tmp_path / "a", 5, block_size=4)
    with TensorDB.open(tmp_path / "b", "w", schema=SCHEMA, block_size=3) as b:
        b.write(batch(6, 100), keys=keys(6, 0, "o"))
    before = {field: sorted(os.listdir(tmp_path / "a" / field)) for field in SCHEMA}
    with TensorDB.open(tmp_path / "a", "r+") as a, TensorDB.open(tmp_path / "b") as b:
        a.seek(1)
        with pytest.raises(ValueError) as exc:
            a.extend(b)
        assert str(exc.value) == (
            "Block sizes must match to extend databases in non-order-preserving mode!"
        )
        assert isinstance(exc.value, ShardcatError)
        assert (len(a), a.tell()) == (5, 5)
        assert {field: sorted(os.listdir(tmp_path / "a" / field)) for field in SCHEMA} == before
        assert_mirror_matches(a)
        a.extend(b, maintain_order=True)  # rows, in order
        assert_rows(a[:], cat(batch(5), batch(6, 100)))
        assert a.get("o00005") is not None and a.position("o00005") == 10
        assert_mirror_matches(a)
    with (
        TensorDB.open(tmp_path / "a") as a,
        TensorDB.open(tmp_path / "b") as b,
        pytest.raises(OSError, match="not open for writing"),  # checked first, as tensorblob
    ):
        a.extend(b)


def test_extend_with_a_tensorblob_database(tmp_path: Path) -> None:
    tensorblob = need("tensorblob", why="shardcat[bench]")
    plain = {"price": ("float32", 1), "label": ("int64", ()), "embed": ("float16", (2, 3))}
    with tensorblob.TensorDB.open(tmp_path / "t", "w", schema=plain) as t:
        t.write(batch(6, 40))
        make(tmp_path / "a", 3)
        with TensorDB.open(tmp_path / "a", "a") as a:
            with pytest.raises(ValueError, match="Block sizes must match"):  # 4 and 8192
                a.extend(t)
            a.extend(t, maintain_order=True)
            assert_rows(a[:], cat(batch(3), batch(6, 40)))
            assert_mirror_matches(a)


# -- SQL ----------------------------------------------------------------------------------------


def test_where_filters_with_sql(tmp_path: Path) -> None:
    n = 500
    with TensorDB.open(tmp_path / "db", "w", schema=SCHEMA, block_size=64) as db:
        db.write(batch(n))
        data = db[:]
        mask = (data["price"].view(-1) > 1000) & (data["label"] == 3)
        expected = mask.nonzero().view(-1).tolist()
        assert db.where("price > 1000 AND label = 3") == expected
        assert db.where("price > ? AND label = ?", [1000, 3]) == expected
        assert db.where("label = :l", {"l": 6}) == list(range(6, n, 7))
        assert db.where("position BETWEEN 3 AND 5") == [3, 4, 5]
        assert_rows(db[db.where("label = 2")], {k: v[2::7] for k, v in data.items()})
        assert db.where("price < 0") == []
        db.seek(10)
        db.write({**batch(1), "label": torch.tensor([99])})  # overwrite: the mirror follows
        assert db.where("label = 99") == [10]
        for bad in ("1); DELETE FROM rows; --", "nope > 1", "price >", "1); ATTACH 'x' AS y; --"):
            with pytest.raises(CatalogError, match="query failed"):
                db.where(bad)
        assert db.query("SELECT count(*) FROM rows") == [(n,)]
        with pytest.raises(CatalogError, match="read-only"):
            db.query("UPDATE rows SET label = 0")
        indexes = [r[0] for r in db.query("SELECT name FROM sqlite_master WHERE type = 'index'")]
        assert "rows_price" in indexes and "rows_label" not in indexes


def test_bulk_appends_rebuild_the_sql_indexes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardcat.storage import db as db_module

    monkeypatch.setattr(db_module, "BULK_ROWS", 8)
    with TensorDB.open(tmp_path / "db", "w", schema=SCHEMA, block_size=4) as db:
        statements: list[str] = []
        db._meta.conn.set_trace_callback(statements.append)
        db.write(batch(10), keys=keys(10)[::-1])  # bulk: 10 rows into an empty table
        db.flush()
        db.write(batch(3, 10))  # not bulk: 3 rows into 10
        db.flush()
        db._meta.conn.set_trace_callback(None)
        # the price index, and the key index (keys in no order); then no more
        assert [s for s in statements if s.startswith("DROP INDEX")] == [
            'DROP INDEX "rows_price"',
            "DROP INDEX rows_key",
        ]
        assert sum(s.startswith("CREATE INDEX") for s in statements) == 1
        assert sum(s.startswith("CREATE UNIQUE INDEX rows_key") for s in statements) == 1
        with pytest.raises(DuplicateKeyError, match="already the key of row 6"):
            db.write(batch(1, 20), keys=["k00003"])
        # keys ascending with their rows past every key there: the index takes them
        statements.clear()
        db._meta.conn.set_trace_callback(statements.append)
        db.write(batch(20, 13), keys=keys(20, 13))
        db.flush()
        db.seek(33)
        db.write(batch(40, 33), keys=["a", *keys(39, 34)])  # "a" sorts first: rebuilt
        db.flush()
        db._meta.conn.set_trace_callback(None)
        assert [s for s in statements if s.startswith("DROP INDEX")] == [
            'DROP INDEX "rows_price"',
            'DROP INDEX "rows_price"',
            "DROP INDEX rows_key",
        ]
        assert db.positions(["k00000", "k00009", "k00013", "a", "k00072"]) == [9, 0, 13, 33, 72]
        with pytest.raises(DuplicateKeyError, match="already the key of row 32"):
            db.write(batch(1, 20), keys=["k00032"])
        plan = db.query("EXPLAIN QUERY PLAN SELECT position FROM rows WHERE price > 100")
        assert "rows_price" in str(plan)
        assert db.where("price > 100") == list(range(11, 73))
        assert_mirror_matches(db)


def test_filterable_types(tmp_path: Path) -> None:
    schema = {
        "flag": ("bool", (), {"filter": True}),
        "half": ("bfloat16", 1, {"filter": True}),
        "small": ("uint8", (), {"index": True}),
    }
    with TensorDB.open(tmp_path / "db", "w", schema=schema) as db:
        db.write(
            {
                "flag": torch.tensor([True, False, True]),
                "half": torch.tensor([[0.5], [1.5], [-2.0]], dtype=torch.bfloat16),
                "small": torch.tensor([1, 200, 3], dtype=torch.uint8),
            }
        )
        assert db.where("flag AND half < 0") == [2]
        assert db.where("small > 100") == [1]
        assert db.query("SELECT typeof(flag), typeof(half), typeof(small) FROM rows LIMIT 1") == [
            ("integer", "real", "integer")
        ]


def test_keys(tmp_path: Path) -> None:
    path = make(tmp_path / "db", 10)
    with TensorDB.open(path, "r+") as db:
        assert db.position("k00007") == 7
        assert_rows(db.get("k00007"), db[7])
        assert db.get("missing") is None
        assert db.get("missing", default=-1) == -1
        with pytest.raises(KeyNotFoundError, match="missing"):
            db.position("missing")
        with pytest.raises(KeyError):
            db.get_many(["k00001", "missing"])
        assert db.positions(["k00009", "k00000", "k00009"]) == [9, 0, 9]
        assert_rows(db.get_many(["k00003", "k00001"]), db[[3, 1]])
        before = (mirror(db), db[:])
        with pytest.raises(DuplicateKeyError, match="twice"):
            db.write(batch(2, 10), keys=["x", "x"])
        with pytest.raises(DuplicateKeyError, match="already the key of row 4"):
            db.write(batch(2, 10), keys=["new", "k00004"])
        db.seek(0)
        with pytest.raises(DuplicateKeyError, match="already the key of row 5"):
            db.write(batch(1, 77), keys=["k00005"])  # an overwrite in place is checked too
        assert (mirror(db), len(db)) == (before[0], 10)
        assert_rows(db[:], before[1])
        db.seek(2)
        db.write(batch(2, 50))  # overwritten without keys: the keys stay
        assert db.positions(["k00002", "k00003"]) == [2, 3]
        db.seek(2)
        db.write(batch(1, 60), keys=["renamed"])
        assert db.get("k00002") is None and db.position("renamed") == 2
        assert db.where("key LIKE 'k0000%' AND label = 0") == [0, 7]
    with TensorDB.open(tmp_path / "plain", "w", schema={"x": ("int8", 1)}) as db:
        db.write({"x": torch.ones(3, 1, dtype=torch.int8)}, keys=["a", "b", "c"])
        db.write({"x": torch.ones(2, 1, dtype=torch.int8)})  # rows without keys
        assert db.query("SELECT position, key FROM rows") == [(0, "a"), (1, "b"), (2, "c")]
        assert db.position("c") == 2 and len(db) == 5


def committed_length(path: Path) -> int:
    with TensorDB.open(path) as db:
        return len(db)


def test_sql_reads_flush_unflushed_writes_first(tmp_path: Path) -> None:
    path = make(tmp_path / "db", 5)
    with TensorDB.open(path, "a+") as db:
        reads = [
            lambda: db.where("label = 6"),
            lambda: db.query("SELECT count(*) FROM rows"),
            lambda: db.get("k00006"),
            lambda: db.position("k00006"),
            lambda: db.positions(["k00006"]),
            lambda: db.get_many(["k00006"]),
        ]
        for read in reads:
            db.write(batch(2, len(db)), keys=keys(2, len(db)))
            assert_rows(db[-2:], batch(2, len(db) - 2))  # indexing sees unflushed rows...
            assert committed_length(path) == len(db) - 2
            read()  # ... and SQL reads commit them first
            assert committed_length(path) == len(db)
        assert db.where("label = 6") == [6, 13]
        assert db.position("k00016") == 16
        assert_mirror_matches(db)
        version = db._meta.version
        db.query("SELECT 1")  # nothing to commit: no commit
        assert db._meta.version == version
    with TensorDB.open(path) as reader:
        assert reader.where("label = 6") == [6, 13]  # readers never commit anything


def test_keys_are_checked_against_unflushed_writes(tmp_path: Path) -> None:
    path = make(tmp_path / "db", 6)  # keys k00000..k00005, committed
    with TensorDB.open(path, "r+") as db:
        db.seek(6)
        db.write(batch(2, 6), keys=["p6", "p7"])  # not committed
        state = (db[:], len(db), db.tell())
        files = sorted((path / "price").iterdir())
        with pytest.raises(DuplicateKeyError, match="'p7' is already the key of row 7"):
            db.write(batch(1, 8), keys=["p7"])
        db.seek(0)
        with pytest.raises(DuplicateKeyError, match="'k00003' is already the key of row 3"):
            db.write(batch(2, 50), keys=["x", "k00003"])
        with pytest.raises(DuplicateKeyError, match="twice"):
            db.write(batch(2, 50), keys=["x", "x"])
        db.seek(8)
        assert_rows(db[:], state[0])  # nothing written, no block copied
        assert sorted((path / "price").iterdir()) == files
        assert (len(db), committed_length(path)) == (8, 6)
        # keys move between rows before a commit: k00001 renamed, then given to row 7
        db.seek(1)
        db.write(batch(1, 1), keys=["one"])
        db.seek(7)
        db.write(batch(1, 7), keys=["k00001"])
        db.seek(6)
        db.write(batch(2, 6), keys=["p7", "p6"])  # a swap within one write (frees k00001)
        db.seek(4)
        db.write(batch(2, 4), keys=["k00005", "k00004"])  # a swap of committed keys
        assert committed_length(path) == 6
        db.flush()
        found = db.positions(["k00000", "one", "k00003", "k00005", "k00004", "p7", "p6"])
        assert found == [0, 1, 3, 4, 5, 6, 7]
        assert db.get("k00001") is None
        assert_mirror_matches(db)


@pytest.mark.parametrize("schema", [SCHEMA, {"x": ("int8", 1)}])
def test_truncate_drops_unflushed_rows_and_keys(tmp_path: Path, schema: Any) -> None:
    def rows(n: int) -> dict[str, Any]:
        return batch(n) if schema is SCHEMA else {"x": torch.ones(n, 1, dtype=torch.int8)}

    with TensorDB.open(tmp_path / "db", "w", schema=schema, block_size=4) as db:
        db.write(rows(10), keys=keys(10))
        db.flush()
        db.write(rows(5), keys=keys(5, 10))
        db.seek(1)
        db.write(rows(1), keys=["one"])
        db.truncate(12)
        assert db.query("SELECT position, key FROM rows WHERE position >= 10") == [
            (10, "k00010"),
            (11, "k00011"),
        ]
        assert db.position("one") == 1 and db.get("k00001") is None
        db.seek(0, io.SEEK_END)
        db.write(rows(3), keys=keys(3, 12))  # the dropped keys are free again
        assert db.positions(keys(3, 12)) == [12, 13, 14]
        if schema is SCHEMA:
            assert_mirror_matches(db)


def test_metadata_is_one_sqlite_file(tmp_path: Path) -> None:
    path = make(tmp_path / "db", 9)
    assert sorted(os.listdir(path)) == sorted([META_FILE, "price", "label", "embed"])
    conn = sqlite3.connect(path / META_FILE)
    assert conn.execute("SELECT length FROM storage_state").fetchone() == (9,)
    assert conn.execute(
        "SELECT field, count(*) FROM storage_blocks GROUP BY field ORDER BY field"
    ).fetchall() == [("embed", 3), ("label", 3), ("price", 3)]
    assert conn.execute("SELECT count(*), count(key) FROM rows").fetchone() == (9, 9)
    conn.close()


def test_sql_file_maps_a_storage_directory_to_its_metadata_file(tmp_path: Path) -> None:
    path = make(tmp_path / "db", 3)
    assert sql_file(path) == storage_meta.sql_file(str(path)) == path / META_FILE
    assert sql_file(path / META_FILE) == path / META_FILE  # a file: as it is
    assert sql_file(tmp_path / "missing.sqlite") == tmp_path / "missing.sqlite"
    home = Path("~").expanduser()
    assert sql_file("~/no-such-file.sqlite") == home / "no-such-file.sqlite"
    # what it points at is the SQLite file ATTACH sees
    conn = sqlite3.connect(sql_file(path))
    assert conn.execute("SELECT count(*) FROM rows").fetchone() == (3,)
    conn.close()


def test_storage_metadata_imports_without_torch() -> None:
    code = (
        "import sys; import shardcat.storage.meta, shardcat.storage; "
        "from shardcat.storage import sql_file; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'tensordict')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_pickle_and_unlink(tmp_path: Path) -> None:
    path = make(tmp_path / "db", 5)
    with TensorDB.open(path) as db:
        clone = pickle.loads(pickle.dumps(db))
        assert_rows(clone[:], db[:])
        assert clone.get("k00004") is not None
        clone.close()
    assert TensorDB.unlink(path) is True
    assert not path.exists()


# -- crash consistency ---------------------------------------------------------------------------


def _run_child(target: Any) -> tuple[int, int]:
    """Fork a child running ``target(write_fd)``; returns its pid and the pipe's read end."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read_fd)
        try:
            target(write_fd)
        finally:
            os._exit(0)
    os.close(write_fd)
    return pid, read_fd


def _wait_then_kill(pid: int, fd: int, word: bytes) -> None:
    buf = b""
    deadline = time.monotonic() + 20
    while word not in buf:
        assert time.monotonic() < deadline
        chunk = os.read(fd, 100)
        assert chunk, "the child died early"
        buf += chunk
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(fd)


def assert_left_nine_rows(path: Path) -> None:
    """What the children below committed: 9 rows keyed k00000..k00008."""
    with TensorDB.open(path) as db:
        assert len(db) == 9
        assert_rows(db[:], batch(9))
        assert_mirror_matches(db)
        assert db.get("k00009") is None and db.get("renamed") is None
        assert db.positions(["k00002", "k00008"]) == [2, 8]
    with TensorDB.open(path, "r+") as db:  # a writer deletes the dead writer's blocks
        for field in SCHEMA:
            assert len([n for n in os.listdir(path / field) if UUID.match(n)]) == 3
        db.seek(0, io.SEEK_END)
        db.write(batch(1, 9), keys=keys(1, 9))
        assert_rows(db[:], batch(10))
        assert_mirror_matches(db)


RENAMED = {**batch(1, 500), "label": torch.tensor([99])}


def _write_more(db: Any) -> None:
    """Appended rows with keys, and a committed row overwritten with a new key and values."""
    db.seek(0, io.SEEK_END)
    db.write(batch(10, 9), keys=keys(10, 9))
    db.seek(2)
    db.write(RENAMED, keys=["renamed"])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_killed_with_unflushed_writes_keeps_fields_keys_and_sql_aligned(tmp_path: Path) -> None:
    path = make(tmp_path / "db", 6)

    def child(fd: int) -> None:  # pragma: no cover - runs in the child
        db = TensorDB.open(path, "r+")
        db.seek(0, io.SEEK_END)
        db.write(batch(3, 6), keys=keys(3, 6))
        db.flush()  # 9 rows committed
        _write_more(db)
        os.write(fd, b"written\n")
        time.sleep(600)

    pid, fd = _run_child(child)
    _wait_then_kill(pid, fd, b"written")
    assert_left_nine_rows(path)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_killed_during_flush_keeps_fields_keys_and_sql_aligned(tmp_path: Path) -> None:
    path = make(tmp_path / "db", 6)

    def child(fd: int) -> None:  # pragma: no cover - runs in the child
        db = TensorDB.open(path, "r+")
        db.seek(0, io.SEEK_END)
        db.write(batch(3, 6), keys=keys(3, 6))
        db.flush()
        _write_more(db)
        db.flush()  # 19 rows committed, row 2 renamed
        db.seek(0, io.SEEK_END)
        db.write(batch(2, 19), keys=keys(2, 19))
        db.seek(3)
        db.write(batch(1, 700))
        real = storage_meta.Metadata.transaction

        @contextlib.contextmanager
        def transaction(self: Any) -> Any:
            with real(self) as conn:
                yield conn
                os.write(fd, b"in-commit\n")  # blocks, length, SQL rows: all but COMMIT
                time.sleep(600)

        storage_meta.Metadata.transaction = transaction  # type: ignore[method-assign]
        db.flush()

    pid, fd = _run_child(child)
    _wait_then_kill(pid, fd, b"in-commit")
    with TensorDB.open(path) as db:  # the commit before: 19 rows, row 2 renamed
        assert len(db) == 19
        assert_rows(db[:], cat(batch(2), RENAMED, batch(16, 3)))
        assert_mirror_matches(db)
        assert db.position("renamed") == 2 and db.get("k00002") is None
        assert db.get("k00019") is None
    with TensorDB.open(path, "r+") as db:
        for field in SCHEMA:
            assert len([n for n in os.listdir(path / field) if UUID.match(n)]) == 5


# -- joining with a catalog dataset ----------------------------------------------------------


@pytest.fixture
def catalog_and_embeddings(tmp_path: Path) -> dict[str, Path]:
    with TFRecordWriter(tmp_path / "train-00000.tfrecord") as writer:
        for i in range(20):
            writer.write(make_example({"key": f"k{i:05d}", "label": i % 4, "image": b"x" * i}))
    catalog = tmp_path / "shardcat.sqlite"
    with Catalog(catalog) as cat:
        cat.ingest(str(tmp_path / "*.tfrecord"), "train").close()
    with TensorDB.open(tmp_path / "emb.db", "w", schema=SCHEMA, block_size=4) as db:
        # embeddings for every other sample, in another order
        chosen = list(range(18, -1, -2))
        db.write(batch(len(chosen)), keys=[f"k{i:05d}" for i in chosen])
    return {"catalog": catalog, "emb": tmp_path / "emb.db"}


JOIN = (
    "SELECT t.key, e.rowid, e.price, t.label FROM train t JOIN emb.rows e ON e.key = t.key "
    "WHERE t.label = 2 ORDER BY t.key"
)


def test_catalog_query_joins_an_attached_database(catalog_and_embeddings: dict[str, Path]) -> None:
    paths = catalog_and_embeddings
    with Catalog(paths["catalog"]) as cat:
        rows = cat.query(JOIN, attach={"emb": paths["emb"]})
        assert rows.columns == ["key", "position", "price", "label"]  # rowid is the position
        assert rows == [
            ("k00002", 8, 80.0, 2),
            ("k00006", 6, 60.0, 2),
            ("k00010", 4, 40.0, 2),
            ("k00014", 2, 20.0, 2),
            ("k00018", 0, 0.0, 2),
        ]
        with TensorDB.open(paths["emb"]) as db:  # rowid is the position in the TensorDB
            assert torch.equal(
                db[[r[1] for r in rows]]["price"].view(-1), torch.tensor([80.0, 60, 40, 20, 0])
            )
        # the file itself works too, and the attachment ends with the statement
        assert cat.query("SELECT count(*) FROM x.rows", attach={"x": paths["emb"] / META_FILE}) == [
            (10,)
        ]
        with pytest.raises(CatalogError, match="no such table"):
            cat.query("SELECT count(*) FROM emb.rows")
        # still read-only: writes into the attached file and ATTACH in SQL are refused
        for sql in ("DELETE FROM emb.rows", "ATTACH DATABASE 'other.sqlite' AS o"):
            with pytest.raises(CatalogError, match="read-only"):
                cat.query(sql, attach={"emb": paths["emb"]})
        with pytest.raises(CatalogError, match="invalid attach name"):
            cat.query("SELECT 1", attach={"main": paths["emb"]})
        with pytest.raises(CatalogError, match="no SQLite database"):
            cat.query("SELECT 1", attach={"emb": paths["emb"] / "missing"})
    with TensorDB.open(paths["emb"]) as db:
        assert len(db) == 10 and db.query("SELECT count(*) FROM rows") == [(10,)]


def test_cli_query_attach(catalog_and_embeddings: dict[str, Path]) -> None:
    paths = catalog_and_embeddings
    runner = CliRunner()
    result = runner.invoke(
        app,
        ["query", JOIN, "-c", str(paths["catalog"]), "--attach", f"emb={paths['emb']}", "--csv"],
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "key,position,price,label"
    assert lines[1:] == [
        "k00002,8,80.0,2",
        "k00006,6,60.0,2",
        "k00010,4,40.0,2",
        "k00014,2,20.0,2",
        "k00018,0,0.0,2",
    ]
    bad = runner.invoke(app, ["query", "SELECT 1", "-c", str(paths["catalog"]), "--attach", "emb"])
    assert bad.exit_code == 1
    assert "--attach takes NAME=PATH" in bad.output


# -- tensorblob directories -------------------------------------------------------------------


def test_tensorblob_database_is_converted_in_place(tmp_path: Path) -> None:
    tensorblob = need("tensorblob", why="shardcat[bench]")
    plain = {"price": ("float32", 1), "label": ("int64", ()), "embed": ("float16", (2, 3))}
    with tensorblob.TensorDB.open(tmp_path / "t", "w", schema=plain, block_size=4) as t:
        t.write(batch(13))

    def inodes() -> dict[str, list[int]]:
        found = {}
        for field in plain:
            names = [n for n in os.listdir(tmp_path / "t" / field) if UUID.match(n)]
            found[field] = sorted(os.stat(tmp_path / "t" / field / n).st_ino for n in names)
        return found

    before = inodes()
    with (
        pytest.warns(ShardcatWarning, match="converting the tensorblob TensorDB"),
        TensorDB.open(tmp_path / "t", "r+") as db,
    ):
        assert (len(db), db.block_size, db.filterable) == (13, 4, ())
        assert db.schema == {
            "price": ("float32", (1,)),
            "label": ("int64", ()),
            "embed": ("float16", (2, 3)),
        }
        assert_rows(db[:], batch(13))
    assert inodes() == before  # the same block files: nothing copied
    leftovers = [p.name for p in (tmp_path / "t").rglob(".*") if p.name in (".conf", ".stat")]
    assert leftovers == []
    with TensorDB.open(tmp_path / "t", "a") as db:
        db.write(batch(2, 13), keys=["x", "y"])
        assert db.position("y") == 14


def test_tensorblob_database_after_a_crash_uses_the_committed_rows(tmp_path: Path) -> None:
    tensorblob = need("tensorblob", why="shardcat[bench]")
    plain = {"price": ("float32", 1), "label": ("int64", ())}
    with tensorblob.TensorDB.open(tmp_path / "t", "w", schema=plain, block_size=4) as t:
        t.write({"price": batch(10)["price"], "label": batch(10)["label"]})
    # as if killed between writing one field and committing: .stat says 6 rows
    (tmp_path / "t" / ".stat").write_text('{"len":6}')
    with pytest.warns(ShardcatWarning), TensorDB.open(tmp_path / "t", "r+") as db:
        assert len(db) == 6
        assert_rows(db[:], {"price": batch(6)["price"], "label": batch(6)["label"]})
    for field in plain:  # blocks past the committed rows were dropped
        assert len([n for n in os.listdir(tmp_path / "t" / field) if UUID.match(n)]) == 2


# -- tensorblob's README examples --------------------------------------------------------------

# Verbatim from tensorblob 0.3.0's README but for the import line; checked below.
CREATE = """\
from shardcat import TensorDB

# Create a database with a fixed schema mapping field names to (dtype, shape)
with TensorDB.open("events.db", "w",
                   schema={"price": ("float32", 1),
                           "embed": ("float16", 768)}) as db:
    # Rows are dense: every write must supply every field with the same row count
    db.write({"price": torch.randn(100_000, 1),
              "embed": torch.randn(100_000, 768).half()})
    print(f"Wrote {len(db)} rows")

# No need to specify the schema again after creation
with TensorDB.open("events.db", "r") as db:
    row = db[42]          # {"price": tensor of shape (1,), "embed": (768,)}
    batch = db[10:100]    # {"price": (90, 1), "embed": (90, 768)}
    print(f"Fields: {list(batch)}, price range: {batch['price'].min()}..{batch['price'].max()}")
"""

FILE_LIKE = """\
with TensorDB.open("events.db", "r+") as db:
    db.seek(1000)
    batch = db.read(size=100)                 # dict of (100, ...) tensors

    db.seek(-500, whence=io.SEEK_END)
    db.write({"price": new_prices, "embed": new_embeds})  # overwrite in place

    db.truncate(10_000)                       # truncate all fields at once
    db.extend(other_db, maintain_order=False) # merge another db with the same schema

# Cleanup removes the whole database directory
TensorDB.unlink("events.db")
"""

DB_EXAMPLES = [CREATE, FILE_LIKE]


def test_db_examples_match_the_readme() -> None:
    need("tensorblob", why="shardcat[bench]")
    from importlib.metadata import metadata

    text = metadata("tensorblob").get_payload()  # type: ignore[attr-defined]
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    found = [b.replace("from tensorblob", "from shardcat") for b in blocks if "TensorDB" in b]
    assert found == DB_EXAMPLES


def test_readme_db_examples_run_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    ns: dict[str, Any] = {"torch": torch, "io": io}  # imported by earlier README examples
    exec(CREATE, ns)
    out = capsys.readouterr().out
    assert "Wrote 100000 rows" in out and "Fields: ['price', 'embed']" in out
    assert ns["row"]["price"].shape == (1,) and ns["row"]["embed"].shape == (768,)
    assert ns["batch"]["embed"].shape == (90, 768)
    with TensorDB.open("events.db") as db:
        head = db[1000:1100]
    schema = {"price": ("float32", 1), "embed": ("float16", 768)}
    with TensorDB.open("other.db", "w", schema=schema) as other:
        other.write({"price": torch.full((700, 1), 7.0), "embed": torch.ones(700, 768).half()})
    ns["new_prices"] = torch.zeros(500, 1)
    ns["new_embeds"] = torch.zeros(500, 768).half()
    final: dict[str, Any] = {}
    real_unlink = TensorDB.unlink

    def unlink(filename: str) -> bool:  # look at the result before the example deletes it
        with TensorDB.open(filename) as db:
            final.update(length=len(db), rows=db[9_990:], mirror=db.query("SELECT 1 FROM rows"))
        return real_unlink(filename)

    monkeypatch.setattr(TensorDB, "unlink", unlink)
    with TensorDB.open("other.db") as other_db:
        ns["other_db"] = other_db
        exec(FILE_LIKE, ns)
        assert_rows(ns["batch"], head)
        assert len(other_db) == 700
    assert not (tmp_path / "events.db").exists()
    assert final["length"] == 10_700 and final["mirror"] == []
    assert torch.equal(final["rows"]["price"][10:], torch.full((700, 1), 7.0))


def test_bulk_writes_mirror_exact_values_and_stay_queryable(tmp_path: Path) -> None:
    """Floats reach SQL exactly; rows written twice before a commit mirror their last values."""
    n = 3000
    gen = torch.Generator().manual_seed(5)
    price = (torch.rand(n, 1, generator=gen) * 200).to(torch.float32)
    price[:4, 0] = torch.tensor([0.967, 1e-40, -3.4e38, 199.75])  # a subnormal, an extreme
    label = torch.randint(0, 7, (n,), generator=gen)
    embed = torch.zeros(n, 2, 3, dtype=torch.float16)
    with TensorDB.open(tmp_path / "db", "w", schema=SCHEMA, block_size=256) as db:
        db.write({"price": price, "label": label, "embed": embed}, keys=keys(n))
        db.seek(100)
        db.write(batch(50, 9000))  # overwritten before the commit, keys kept
        db.seek(n)
        db.write(batch(10, n), keys=keys(10, n))
        db.seek(n - 5)
        db.write(batch(10, 7000))  # over both writes and past them
        db.flush()
        assert_mirror_matches(db)
        data = db[:]
        values = data["price"].view(-1)
        assert [r[0] for r in db.query("SELECT price FROM rows ORDER BY position")] == (
            values.tolist()
        )
        assert db.where("price = ?", [float(torch.tensor(0.967))]) == [0]
        assert db.where("price > 199.75") == (values > 199.75).nonzero().view(-1).tolist()
        mask = (values < 50) & (data["label"] == 3)
        assert db.where("price < 50 AND label = 3") == mask.nonzero().view(-1).tolist()
        assert db.position("k00120") == 120 and db.position(f"k{n + 3:05d}") == n + 3
        assert len(db) == n + 10 and db.query("SELECT count(*) FROM rows") == [(n + 10,)]


def test_a_failed_bulk_commit_leaves_the_previous_sql_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = make(tmp_path / "db", 6)
    real = TensorDB._insert_rows

    def insert_then_fail(self: Any, conn: Any, start: int, stop: int) -> None:
        real(self, conn, start, stop)
        raise OSError("disk full")

    with TensorDB.open(path, "r+") as db:
        db.seek(6)
        db.write(batch(20, 6), keys=keys(20, 6))
        monkeypatch.setattr(TensorDB, "_insert_rows", insert_then_fail)
        with pytest.raises(OSError, match="disk full"):
            db.flush()
        monkeypatch.undo()
        assert len(db) == 6 and db.where("label >= 0") == list(range(6))
        assert db.get("k00010") is None
        assert_mirror_matches(db)
    with TensorDB.open(path) as db:
        assert_rows(db[:], batch(6))
        assert_mirror_matches(db)


def _old_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make new files as shardcat did before the partial key index: ``key TEXT UNIQUE``."""
    from shardcat.storage import meta

    real = meta._ddl

    def old_ddl(layout: Any) -> list[str]:
        statements = [s for s in real(layout) if s != meta.CREATE_KEY_INDEX]
        return [s.replace(", key TEXT, ", ", key TEXT UNIQUE, ") for s in statements]

    monkeypatch.setattr(meta, "_ddl", old_ddl)


@pytest.mark.parametrize("layout", ["partial key index", "key UNIQUE (older files)"])
def test_both_key_layouts_keep_every_key_semantic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    from shardcat.storage import db as db_module

    old = layout.startswith("key UNIQUE")
    if old:
        _old_layout(monkeypatch)
    path = make(tmp_path / "db", 600, block_size=64)
    monkeypatch.undo()  # the file is written; the code from here on is today's
    sql = sqlite3.connect(path / ".shardcat.sqlite")
    table = sql.execute("SELECT sql FROM sqlite_master WHERE name = 'rows'").fetchone()[0]
    indexes = dict(sql.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index'"))
    sql.close()
    assert ("key TEXT UNIQUE" in table) is old
    assert ("rows_key" in indexes) is not old
    if not old:
        assert indexes["rows_key"].endswith("ON rows (key) WHERE key IS NOT NULL")
    monkeypatch.setattr(db_module, "BULK_ROWS", 100)
    with TensorDB.open(path, "r+") as db:
        for query, params in (("key = ?", ["a"]), ("key IN (?, ?)", ["a", "b"])):
            plan = db.query(f"EXPLAIN QUERY PLAN SELECT position FROM rows WHERE {query}", params)
            assert ("rows_key" in str(plan)) is not old and "SCAN" not in str(plan)
        assert db.positions(["k00599", "k00000"]) == [599, 0]
        with pytest.raises(DuplicateKeyError, match="already the key of row 4"):
            db.write(batch(1, 900), keys=["k00004"])
        # 450 committed rows overwritten (upserts in several statements), keys moved
        # between rows: row 500 gets a new key, row 10 takes row 500's old one
        db.seek(500)
        db.write(batch(1, 3000), keys=["moved"])
        db.seek(10)
        db.write(batch(450, 2000), keys=["k00500", *keys(449, 11, "m")])
        db.flush()
        assert db.position("k00500") == 10 and db.position("moved") == 500
        assert db.get("k00010") is None and db.position("m00011") == 11
        assert_mirror_matches(db)
        db.seek(600)
        db.write(batch(700, 600), keys=keys(700, 600))  # a bulk append with keys
        db.write(batch(5, 1300))  # and rows without keys
        db.flush()
        assert_mirror_matches(db)
        assert db.position("k01299") == 1299 and db.position("k00599") == 599
        assert db.query("SELECT count(*) FROM rows WHERE key IS NULL") == [(5,)]
        with pytest.raises(DuplicateKeyError, match="already the key of row 1000"):
            db.write(batch(1, 1), keys=["k01000"])
        assert db.where("label = 3 AND position < 30") == [3, 15, 22, 29]
    with TensorDB.open(path) as db:  # reopened: the same rows
        assert db.position("k00500") == 10 and len(db) == 1305
        assert_mirror_matches(db)
