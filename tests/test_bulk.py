"""insert_columns: every kind of value is stored exactly, rows whole, in the order asked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event
from sqlalchemy.exc import IntegrityError

from shardcat.catalog import sqlite
from shardcat.catalog.backend import make_engine
from shardcat.catalog.bulk import insert_columns

KEYS = ["a", "é😀", 'quote" back\\slash', "\n\t\x01", "", " x ", "z" * 300, "last"]


STATEMENTS: list[str] = []


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    eng = make_engine(tmp_path / "bulk.sqlite")
    with eng.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t(k TEXT PRIMARY KEY, c INTEGER, i INTEGER, v)")
    STATEMENTS.clear()
    event.listen(eng, "before_cursor_execute", lambda *a: STATEMENTS.append(a[2]))
    yield eng
    eng.dispose()


def rows(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.exec_driver_sql("SELECT k, c, i, v FROM t ORDER BY i")]


def insert(engine: Engine, columns: dict[str, Any], order_by: str | None = None) -> int:
    with engine.begin() as conn:
        return insert_columns(conn, "t", columns, order_by)


@pytest.mark.parametrize(
    "values",
    [
        [1, -(2**63), 2**63 - 1, 0, 7, 8, 9, 10],
        ["x", None, "ü", "", "\\", '"', "9", "10"],
        [1.5, 2.0, 0.1, -0.0, 1e300, 5e-324, 3.0, 0.967],
        [1.5, float("inf"), 0.1, 2.0, 3.0, 4.0, 5.0, 6.0],
        [b"\x00\xff", b"", b"a", b"b", b"c", b"d", b"e", b"f"],
        ["a\x00b", "x", "y", "z", "1", "2", "3", "4"],
        [True, 1, 0, 2, 3, 4, 5, 6],
    ],
)
def test_values_read_back_exactly(engine: Engine, values: list[Any]) -> None:
    assert insert(engine, {"k": KEYS, "c": 7, "i": range(10, 18), "v": values}) == 8
    assert rows(engine) == [
        (k, 7, 10 + n, v) for n, (k, v) in enumerate(zip(KEYS, values, strict=True))
    ]
    assert [s for s in STATEMENTS if s.startswith("INSERT")] == [  # one statement, 8 rows
        "INSERT INTO t (k, c, i, v) VALUES " + ", ".join(["(?, ?, ?, ?)"] * 8)
    ]


@pytest.mark.parametrize("n", [1, 199, 200, 201, 450, 1000])
def test_many_rows_go_in_groups_whole_and_in_order(engine: Engine, n: int) -> None:
    """Rows go in statements of ROWS_PER_STATEMENT rows (the rest in one more): every
    row read back whole, in the order given."""
    keys = [f"k{i:05d}" for i in range(n)]
    values: list[Any] = [[None, 1.5, b"\x00", "s", -(2**63)][i % 5] for i in range(n)]
    assert insert(engine, {"k": keys, "c": 3, "i": range(n), "v": values}) == n
    assert rows(engine) == [(k, 3, i, v) for i, (k, v) in enumerate(zip(keys, values, strict=True))]
    with engine.connect() as conn:
        in_order = [r[0] for r in conn.exec_driver_sql("SELECT k FROM t ORDER BY rowid")]
    assert in_order == keys
    inserts = [s for s in STATEMENTS if s.startswith("INSERT")]
    per = sqlite.ROWS_PER_STATEMENT
    sizes = ([per] if n >= per else []) + ([n % per] if n % per else [])
    assert [s.count("(?, ?, ?, ?)") for s in inserts] == sizes


@pytest.mark.parametrize("key", ["a\x00b", "\\u0000 is six characters"])
def test_keys_with_nul_are_kept_whole(engine: Engine, key: str) -> None:
    insert(engine, {"k": [key, "a"], "c": 1, "i": range(2), "v": None})
    assert rows(engine) == [(key, 1, 0, None), ("a", 1, 1, None)]


def test_ranges_lists_and_constants_in_any_order(engine: Engine) -> None:
    insert(engine, {"i": range(5, 15, 5), "v": (3, 4), "k": ["p", "q"], "c": None})
    assert rows(engine) == [("p", None, 5, 3), ("q", None, 10, 4)]


def test_only_ranges(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE n(a INTEGER, b INTEGER)")
        assert insert_columns(conn, "n", {"a": range(3), "b": 9}) == 3
        assert conn.exec_driver_sql("SELECT a, b FROM n").fetchall() == [(0, 9), (1, 9), (2, 9)]


def test_bad_calls(engine: Engine) -> None:
    with engine.begin() as conn:
        with pytest.raises(ValueError, match="at least one column with a value per row"):
            insert_columns(conn, "t", {"k": "x", "c": 1})
        with pytest.raises(ValueError, match=r"columns of t differ in length: \[2, 3\]"):
            insert_columns(conn, "t", {"k": ["a", "b"], "i": range(3)})
        assert insert_columns(conn, "t", {"k": [], "i": range(0)}) == 0
    assert rows(engine) == []


def test_a_failed_insert_leaves_the_rows_before(engine: Engine) -> None:
    insert(engine, {"k": ["a"], "c": 1, "i": [0], "v": [1]})
    with engine.connect() as conn:
        with pytest.raises(IntegrityError), conn.begin_nested():
            insert_columns(conn, "t", {"k": ["b", "a"], "c": 1, "i": [1, 2], "v": [2, 3]})
        insert_columns(conn, "t", {"k": ["b", "c"], "c": 1, "i": [1, 2], "v": [2, 3]})
        conn.commit()
    assert rows(engine) == [("a", 1, 0, 1), ("b", 1, 1, 2), ("c", 1, 2, 3)]


@pytest.mark.parametrize("v", [None, b"bytes", 0.5])
def test_order_by_inserts_rows_in_that_column_s_order(engine: Engine, v: Any) -> None:
    keys = ["m", "c", "x", "a", "q"]
    insert(engine, {"k": keys, "c": 1, "i": range(5), "v": [v] * 5}, order_by="k")
    with engine.connect() as conn:
        in_order = [r[0] for r in conn.exec_driver_sql("SELECT k FROM t ORDER BY rowid")]
    assert in_order == sorted(keys)  # inserted (rowids given) in key order
    assert rows(engine) == [(k, 1, n, v) for n, k in enumerate(keys)]  # each row whole
