"""TensorBlob: tensorblob's API over SQLite metadata."""

from __future__ import annotations

import contextlib
import gc
import io
import itertools
import math
import os
import pickle
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardcat.testing.required import need

torch = need("torch", why="shardcat[torch]")
need("tensordict", why="shardcat[torch]")

import numpy as np  # noqa: E402

from shardcat import TensorBlob, TensorDB  # noqa: E402
from shardcat.errors import ShardcatError, ShardcatWarning, StaleWriterError  # noqa: E402
from shardcat.storage import lock as storage_lock  # noqa: E402
from shardcat.storage import meta as storage_meta  # noqa: E402
from shardcat.storage.meta import META_FILE  # noqa: E402

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def rows(n: int, start: int = 0, shape: tuple[int, ...] = (2, 3)) -> Any:
    """Row i holds values i * 100 + 0, 1, ... (unique, easy to check)."""
    width = math.prod(shape)
    base = torch.arange(start, start + n, dtype=torch.float32).view(-1, 1) * 100
    return (base + torch.arange(width, dtype=torch.float32)).view(n, *shape)


def make(path: Path, n: int, block_size: int = 4, shape: tuple[int, ...] = (2, 3)) -> Path:
    with TensorBlob.open(path, "w", dtype="float32", shape=shape, block_size=block_size) as b:
        b.write(rows(n, shape=shape))
    return path


def block_files(path: Path) -> list[str]:
    return sorted(n for n in os.listdir(path) if UUID.match(n))


# -- modes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["", "x", "rw", "r++", "rr", "+", "rb", "wa+", "ra"])
def test_invalid_modes_raise_value_error(tmp_path: Path, mode: str) -> None:
    with pytest.raises(ValueError, match="mode"):
        TensorBlob.open(tmp_path / "b", mode, dtype="float32", shape=1)


@pytest.mark.parametrize("mode", ["r", "r+", "a", "a+"])
def test_missing_blob_raises_file_not_found(tmp_path: Path, mode: str) -> None:
    with pytest.raises(FileNotFoundError, match="Blob not found"):
        TensorBlob.open(tmp_path / "nope", mode)
    assert not (tmp_path / "nope").exists()


@pytest.mark.parametrize("mode", ["w", "w+"])
def test_new_blob_needs_dtype_and_shape(tmp_path: Path, mode: str) -> None:
    with pytest.raises(ValueError, match=r"dtype.*shape.*required"):
        TensorBlob.open(tmp_path / "b", mode, dtype="float32")
    with pytest.raises(ValueError, match="required"):
        TensorBlob.open(tmp_path / "b", mode, shape=3)
    with pytest.raises(TypeError, match=r"dtype must be str or torch\.dtype"):
        TensorBlob.open(tmp_path / "b", mode, dtype=np.float32, shape=3)
    with pytest.raises(ValueError, match="unknown dtype"):
        TensorBlob.open(tmp_path / "b", mode, dtype="float128", shape=3)
    with pytest.raises(ValueError, match="cannot be stored"):
        TensorBlob.open(tmp_path / "b", mode, dtype=torch.complex64, shape=3)
    assert not (tmp_path / "b").exists()


def test_mode_r_reads_only(tmp_path: Path) -> None:
    path = make(tmp_path / "b", 6)
    with TensorBlob.open(path) as b:
        assert (b.mode, b.tell(), len(b)) == ("r", 0, 6)
        assert torch.equal(b.read(), rows(6))
        for action in (lambda: b.write(rows(1)), lambda: b.truncate(0), b.flush):
            with pytest.raises(OSError, match="not open for writing"):
                action()
    with TensorBlob.open(path) as b:
        assert len(b) == 6


def test_mode_w_truncates_and_keeps_configuration(tmp_path: Path) -> None:
    path = make(tmp_path / "b", 10)
    with TensorBlob.open(path, "w", dtype="int64", shape=7, block_size=99) as b:
        assert (len(b), b.dtype, b.shape, b.block_size) == (0, "float32", (2, 3), 4)
        with pytest.raises(OSError, match="not open for reading"):
            b.read()
        assert b.write(rows(3, 50)) == 3
        assert torch.equal(b[0:3], rows(3, 50))  # indexing works in every mode, as in tensorblob
    assert len(block_files(path)) == 1
    with TensorBlob.open(path, "r") as b:
        assert torch.equal(b.read(), rows(3, 50))


def test_mode_a_always_appends(tmp_path: Path) -> None:
    path = make(tmp_path / "b", 5)
    with TensorBlob.open(path, "a") as b:
        assert b.tell() == 5
        b.seek(0)
        assert b.write(rows(2, 5)) == 2
        assert b.tell() == 7
        with pytest.raises(OSError, match="not open for reading"):
            b.read()
    with TensorBlob.open(path) as b:
        assert torch.equal(b.read(), rows(7))


def test_mode_r_plus_overwrites_in_place_and_extends(tmp_path: Path) -> None:
    path = make(tmp_path / "b", 6)
    with TensorBlob.open(path, "r+") as b:
        assert b.tell() == 0
        b.seek(4)
        assert b.write(rows(5, 40)) == 5  # two rows overwritten, three appended
        assert (len(b), b.tell()) == (9, 9)
        b.seek(0)
        expected = torch.cat([rows(4), rows(5, 40)])
        assert torch.equal(b.read(), expected)
    with TensorBlob.open(path) as b:
        assert torch.equal(b[:], expected)


def test_mode_w_plus_reads_and_writes(tmp_path: Path) -> None:
    with TensorBlob.open(
        tmp_path / "b", "w+", dtype=torch.float32, shape=(2, 3), block_size=4
    ) as b:
        b.write(rows(9))
        b.seek(2)
        assert torch.equal(b.read(3), rows(3, 2))


def test_mode_a_plus_reads_anywhere_and_appends(tmp_path: Path) -> None:
    path = make(tmp_path / "b", 5)
    with TensorBlob.open(path, "a+") as b:
        assert b.tell() == 5
        b.seek(1)
        assert torch.equal(b.read(2), rows(2, 1))
        b.seek(0)
        b.write(rows(1, 5))
        assert len(b) == 6
        assert torch.equal(b[-1], rows(1, 5)[0])


def test_open_rejects_what_is_not_a_blob(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(NotADirectoryError):
        TensorBlob.open(tmp_path / "file", "w", dtype="float32", shape=1)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a TensorBlob"):
        TensorBlob.open(tmp_path / "other", "w", dtype="float32", shape=1)
    with pytest.raises(FileNotFoundError):
        TensorBlob.open(tmp_path / "other", "r")
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"
    (tmp_path / "empty").mkdir()  # an empty directory becomes a blob
    with TensorBlob.open(tmp_path / "empty", "w", dtype="int8", shape=1) as b:
        b.write(torch.ones(2, 1, dtype=torch.int8))
    with TensorDB.open(tmp_path / "db", "w", schema={"x": ("int8", 1)}):
        pass
    with pytest.raises(ValueError, match="holds a TensorDB, not a TensorBlob"):
        TensorBlob.open(tmp_path / "db", "r")


def test_tilde_and_relative_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    with TensorBlob.open("~/deep/er/b", "w", dtype="float32", shape=(2, 3)) as b:
        b.write(rows(2))
        assert b.filename == str(tmp_path / "deep" / "er" / "b")
    monkeypatch.chdir(tmp_path / "deep")
    with TensorBlob.open("er/b") as b:
        assert torch.equal(b[:], rows(2))


# -- file-like semantics ---------------------------------------------------------------------


def test_seek_clamps_like_tensorblob(tmp_path: Path) -> None:
    with TensorBlob.open(make(tmp_path / "b", 10)) as b:
        assert b.seek(3) == 3
        assert b.seek(4, io.SEEK_CUR) == 7
        assert b.seek(-2, whence=io.SEEK_END) == 8
        assert b.seek(50) == 10
        assert b.seek(-50, io.SEEK_CUR) == 0
        assert b.seek(5, io.SEEK_END) == 10
        assert b.seek() == 0
        with pytest.raises(ValueError, match="whence"):
            b.seek(0, 7)


def test_read_moves_the_position(tmp_path: Path) -> None:
    with TensorBlob.open(make(tmp_path / "b", 10)) as b:
        assert torch.equal(b.read(3), rows(3))
        assert b.tell() == 3
        assert torch.equal(b.read(size=100), rows(7, 3))
        assert b.tell() == 10
        empty = b.read()
        assert empty.shape == (0, 2, 3) and empty.dtype == torch.float32
        b.seek(8)
        assert torch.equal(b.read(-1), rows(2, 8))


def test_closed_blob_refuses_io(tmp_path: Path) -> None:
    b = TensorBlob.open(make(tmp_path / "b", 4), "r+")
    b.close()
    b.close()  # idempotent
    assert b.closed
    for action in (
        b.tell,
        b.seek,
        b.read,
        lambda: b.write(rows(1)),
        lambda: b[0],
        lambda: b[0:2],
        lambda: list(b),
    ):
        with pytest.raises(OSError, match="closed blob"):
            action()


def test_context_manager_len_and_iteration(tmp_path: Path) -> None:
    path = make(tmp_path / "b", 11, block_size=3)
    with TensorBlob.open(path) as b:
        assert len(b) == 11
        b.seek(4)
        seen = []
        for row in b:
            seen.append(row)
            assert b.tell() == 4 + len(seen)
        assert torch.equal(torch.stack(seen), rows(7, 4))
        assert list(b) == []  # the position is at the end
    assert b.closed


def test_write_validates_dtype_and_shape(tmp_path: Path) -> None:
    with TensorBlob.open(tmp_path / "b", "w", dtype="float32", shape=(2, 3)) as b:
        with pytest.raises(TypeError, match=r"does not match blob dtype torch\.float32") as bad:
            b.write(torch.zeros(2, 3, dtype=torch.float64))  # tensorblob's words
        assert isinstance(bad.value, ShardcatError)
        with pytest.raises(
            ValueError, match=r"7 elements, not whole rows of shape \(2, 3\)"
        ) as odd:
            b.write(torch.zeros(7, dtype=torch.float64))  # the shape is checked first
        # also the RuntimeError tensorblob's ``view(-1, *shape)`` raises
        assert isinstance(odd.value, RuntimeError) and isinstance(odd.value, ShardcatError)
        with pytest.raises(TypeError, match=r"torch\.Tensor"):
            b.write([[1.0, 2.0, 3.0]] * 2)
        assert len(b) == 0
        assert b.write(torch.zeros(2, 3)) == 1  # one row
        assert b.write(torch.ones(2, 5, 2, 3)) == 10  # leading batch dims
        assert b.write(np.full((1, 2, 3), 7, dtype=np.float32)) == 1
        assert b.write(torch.zeros(0, 2, 3)) == 0
        assert len(b) == 12
        assert torch.equal(b[-1], torch.full((2, 3), 7.0))
    with TensorBlob.open(tmp_path / "s", "w", dtype="int64", shape=1) as b:
        assert b.write(torch.arange(5)) == 5  # a 1-D tensor: five one-element rows
        assert torch.equal(b[:], torch.arange(5).view(5, 1))


def test_write_reshapes_to_rows_as_tensorblob(tmp_path: Path) -> None:
    """tensorblob writes ``ts.view(-1, *shape)``: any tensor of whole rows, in C order."""
    with TensorBlob.open(tmp_path / "b", "w", dtype="float32", shape=(2, 3)) as b:
        assert b.write(torch.arange(12, dtype=torch.float32)) == 2  # flat
        assert b.write(torch.arange(12, 18, dtype=torch.float32).view(3, 2)) == 1
        assert b.write(torch.arange(18, 42, dtype=torch.float32).view(4, 6)) == 4
        assert len(b) == b.tell() == 7
        assert torch.equal(b[:], torch.arange(42, dtype=torch.float32).view(7, 2, 3))
    with TensorBlob.open(tmp_path / "s", "w", dtype="int64", shape=1) as b:
        assert b.write(torch.tensor(5)) == 1  # a 0-d tensor: one row
        assert b.write(torch.arange(4).view(2, 2)) == 4
        assert b[:].tolist() == [[5], [0], [1], [2], [3]]


def test_write_takes_any_memory_layout(tmp_path: Path) -> None:
    data = rows(8)
    inner = data.transpose(1, 2).contiguous().transpose(1, 2)  # non-contiguous rows
    with TensorBlob.open(tmp_path / "b", "w", dtype="float32", shape=(2, 3)) as b:
        assert b.write(data[::2]) == 4  # every other row
        assert b.write(inner[1::2]) == 4
        assert b.write(data[3].clone().requires_grad_()) == 1
        assert b.write(data[:, 0, 0].view(8, 1, 1).expand(8, 2, 3)) == 8  # stride-0 dims
        assert torch.equal(b[:4], data[::2])
        assert torch.equal(b[4:8], data[1::2])
        assert torch.equal(b[8], data[3])
        assert torch.equal(b[9:], data[:, :1, :1].expand(8, 2, 3))


@pytest.mark.parametrize(
    "dtype",
    [
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "bool",
    ],
)
def test_every_dtype_round_trips(tmp_path: Path, dtype: str) -> None:
    gen = torch.Generator().manual_seed(7)
    values = (torch.randn(21, 5, generator=gen) * 50).to(getattr(torch, dtype))
    with TensorBlob.open(
        tmp_path / "b", "w", dtype=getattr(torch, dtype), shape=5, block_size=8
    ) as b:
        assert b.write(values) == 21
        assert b.dtype == dtype
    with TensorBlob.open(tmp_path / "b") as b:
        assert torch.equal(b[:], values)
        assert torch.equal(b[[20, 0, 9]], values[[20, 0, 9]])
        assert torch.equal(b[-1], values[-1])
        assert b[3:17:4].dtype == getattr(torch, dtype)


# -- indexing --------------------------------------------------------------------------------


@pytest.fixture
def blob(tmp_path: Path):
    with TensorBlob.open(make(tmp_path / "b", 23, block_size=4)) as b:
        yield b


def test_int_index(blob: Any) -> None:
    data = rows(23)
    for i in (0, 3, 4, 22, -1, -23, -5):
        assert torch.equal(blob[i], data[i])
    assert torch.equal(blob[np.int64(7)], data[7])
    assert torch.equal(blob[torch.tensor(7)], data[7])
    for i in (23, -24, 1000):
        with pytest.raises(IndexError):
            blob[i]


def test_slices_with_every_step(blob: Any) -> None:
    data = rows(23)
    bounds = [None, 0, 1, 3, 4, 5, 22, 23, 30, -1, -4, -30]
    for start in bounds:
        for stop in bounds:
            for step in (None, 1, 2, 3, 4, 5, 9, 100, -1, -2, -3, -4, -7):
                key = slice(start, stop, step)
                expected = data[list(range(*key.indices(23)))]
                got = blob[key]
                assert got.shape == expected.shape, key
                assert torch.equal(got, expected), key
    with pytest.raises(ValueError):
        blob[::0]


def test_fancy_indexing(blob: Any) -> None:
    data = rows(23)
    picks = [22, 0, 5, 5, -1, 13, 4, 3, -23, 8]
    expected = data[[p % 23 for p in picks]]
    for index in (
        picks,
        tuple(picks),
        torch.tensor(picks),
        torch.tensor(picks, dtype=torch.int32),
        np.array(picks),
        np.array(picks, dtype=np.int16),
    ):
        assert torch.equal(blob[index], expected), type(index)
    assert torch.equal(blob[[6, 6, 6]], data[[6, 6, 6]])
    ordered = [0, 1, 1, 5, 9, 9, 14, 22]  # grouped by block: no reordering needed
    assert torch.equal(blob[ordered], data[ordered])
    assert torch.equal(blob[[5, 4, 7, 13, 12]], data[[5, 4, 7, 13, 12]])
    assert torch.equal(blob[[9]], data[[9]])
    every = list(range(23))
    random.Random(3).shuffle(every)
    assert torch.equal(blob[every], data[every])
    assert blob[[]].shape == (0, 2, 3)
    assert blob[np.array([], dtype=np.int64)].shape == (0, 2, 3)
    with pytest.raises(IndexError):
        blob[[0, 23]]
    with pytest.raises(IndexError):
        blob[[-24]]
    with pytest.raises(TypeError, match="integer"):
        blob[[True, False]]
    with pytest.raises(TypeError, match="integer"):
        blob[[1.0, 2.0]]
    with pytest.raises(TypeError, match="integer"):
        blob[np.array([1.5])]
    with pytest.raises(ValueError, match="1-dimensional"):
        blob[[[1, 2], [3, 4]]]
    with pytest.raises(TypeError, match="Index must be") as exc:
        blob["3"]
    assert isinstance(exc.value, ShardcatError)
    with pytest.raises(TypeError, match="Index must be"):
        blob[1:, 0]
    with pytest.raises(TypeError, match="Index must be"):
        blob[1.0]


def test_results_are_copies(tmp_path: Path) -> None:
    path = make(tmp_path / "b", 8)
    with TensorBlob.open(path, "r+") as b:
        for got in (b[1], b[0:3], b[::-2], b[[1, 2]], b.read(2), next(iter(b))):
            got.fill_(-1)
        b.seek(0)
        assert torch.equal(b.read(), rows(8))


# -- extend and truncate ---------------------------------------------------------------------


@pytest.mark.parametrize("n_self", [0, 3, 4, 9])
@pytest.mark.parametrize("n_other", [0, 1, 4, 7, 12])
@pytest.mark.parametrize("maintain_order", [True, False])
def test_extend_across_block_boundaries(
    tmp_path: Path, n_self: int, n_other: int, maintain_order: bool
) -> None:
    bs = 4
    mine, theirs = rows(n_self), rows(n_other, 1000)
    make(tmp_path / "a", n_self, block_size=bs)
    with TensorBlob.open(tmp_path / "b", "w", dtype="float32", shape=(2, 3), block_size=bs) as b:
        b.write(theirs)
    with TensorBlob.open(tmp_path / "a", "r+") as a, TensorBlob.open(tmp_path / "b") as b:
        a.seek(1)
        assert a.extend(b, maintain_order=maintain_order) is None
        assert (len(a), a.tell()) == (n_self + n_other, n_self + n_other)
    full, other_full = n_self // bs * bs, n_other // bs * bs
    if maintain_order:
        expected = torch.cat([mine, theirs])
    else:  # full blocks are copied as files; the partial tails follow
        expected = torch.cat([mine[:full], theirs[:other_full], mine[full:], theirs[other_full:]])
    with TensorBlob.open(tmp_path / "a") as a:
        assert torch.equal(a[:], expected)
    assert len(block_files(tmp_path / "a")) == math.ceil((n_self + n_other) / bs)
    with TensorBlob.open(tmp_path / "b") as b:  # the source is unchanged
        assert torch.equal(b[:], theirs)


def test_extend_without_order_needs_the_same_block_size(tmp_path: Path) -> None:
    """As tensorblob: moving whole blocks (maintain_order=False) needs equal block sizes."""
    make(tmp_path / "a", 5, block_size=4)
    make(tmp_path / "b", 11, block_size=3)
    make(tmp_path / "e", 0, block_size=3)
    before = block_files(tmp_path / "a")
    with TensorBlob.open(tmp_path / "a", "r+") as a:
        for other in (tmp_path / "b", tmp_path / "e"):  # even with nothing to copy
            a.seek(2)
            with TensorBlob.open(other) as b, pytest.raises(ValueError) as exc:
                a.extend(b)
            assert str(exc.value) == (
                "Block sizes must match to extend blobs in non-order-preserving mode!"
            )
            assert isinstance(exc.value, ShardcatError)
            assert (len(a), a.tell()) == (5, 5)  # tensorblob seeks to the end first
        assert block_files(tmp_path / "a") == before
        with TensorBlob.open(tmp_path / "b") as b:
            a.extend(b, maintain_order=True)  # rows, in order
        assert torch.equal(a[:], torch.cat([rows(5), rows(11)]))
    with (
        TensorBlob.open(tmp_path / "a") as a,
        TensorBlob.open(tmp_path / "b") as b,
        pytest.raises(OSError, match="not open for writing"),  # checked first, as tensorblob
    ):
        a.extend(b)


def test_extend_with_itself_and_mismatches(tmp_path: Path) -> None:
    path = make(tmp_path / "a", 6)
    with TensorBlob.open(path, "r+") as a:
        a.extend(a, maintain_order=True)
        assert torch.equal(a[:], torch.cat([rows(6), rows(6)]))
    ints = TensorBlob.open(tmp_path / "i", "w", dtype="int64", shape=(2, 3))
    wide = TensorBlob.open(tmp_path / "s", "w", dtype="float32", shape=6)
    with TensorBlob.open(path, "r+") as a, ints, wide:
        for other in (ints, wide):
            with pytest.raises(ValueError, match="must match"):
                a.extend(other)
    with (
        TensorBlob.open(path, "r") as a,
        TensorBlob.open(path) as same,
        pytest.raises(OSError, match="not open for writing"),
    ):
        a.extend(same)


def test_ordered_extend_copies_slices_not_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardcat.storage.column import BlockColumn

    with TensorBlob.open(tmp_path / "a", "w", dtype="int32", shape=64, block_size=1000) as a:
        a.write(torch.zeros(3, 64, dtype=torch.int32))
    with TensorBlob.open(tmp_path / "b", "w", dtype="int32", shape=64, block_size=1000) as b:
        b.write(torch.arange(40_000 * 64, dtype=torch.int32).view(-1, 64))
    calls = {"row": 0, "read": 0, "write": 0}
    for name in calls:
        real = getattr(BlockColumn, name)

        def spy(self: Any, *args: Any, _real: Any = real, _name: str = name) -> Any:
            calls[_name] += 1
            return _real(self, *args)

        monkeypatch.setattr(BlockColumn, name, spy)
    with TensorBlob.open(tmp_path / "a", "a") as a, TensorBlob.open(tmp_path / "b") as b:
        a.extend(b, maintain_order=True)  # 3 rows in: no block boundary lines up
        assert calls == {"row": 0, "read": 1, "write": 1}  # 10 MB: one slice, 41 block copies
        assert torch.equal(a[3:], b[:])


@pytest.mark.parametrize("cut", [0, 1, 3, 4, 5, 8, 13, 14, 50])
def test_truncate_across_block_boundaries(tmp_path: Path, cut: int) -> None:
    path = make(tmp_path / "b", 14)
    with TensorBlob.open(path, "r+") as b:
        assert b.truncate(cut) == min(cut, 14)  # never grows, as in tensorblob
        assert len(b) == b.tell() == min(cut, 14)
    assert len(block_files(path)) == math.ceil(min(cut, 14) / 4)
    with TensorBlob.open(path, "a+") as b:
        assert torch.equal(b[:], rows(min(cut, 14)))
        b.write(rows(6, 500))
        assert torch.equal(b[:], torch.cat([rows(min(cut, 14)), rows(6, 500)]))


def test_truncate_defaults_to_the_position(tmp_path: Path) -> None:
    with TensorBlob.open(make(tmp_path / "b", 10), "r+") as b:
        b.seek(6)
        assert b.truncate() == 6
        with pytest.raises(ValueError, match="non-negative"):
            b.truncate(-1)
        assert len(b) == 6


def test_unlink(tmp_path: Path) -> None:
    path = make(tmp_path / "b", 9)
    assert TensorBlob.unlink(path) is True
    assert not path.exists()
    assert TensorBlob.unlink(path) is True
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "keep.txt").write_text("x")
    with pytest.warns(UserWarning, match="Failed to unlink"):
        assert TensorBlob.unlink(tmp_path / "mine") is False
    assert (tmp_path / "mine" / "keep.txt").exists()
    with TensorDB.open(tmp_path / "db", "w", schema={"x": ("int8", 1)}):
        pass
    with pytest.warns(UserWarning, match="holds a TensorDB"):
        assert TensorBlob.unlink(tmp_path / "db") is False
    assert TensorDB.unlink(tmp_path / "db") is True


# -- when writes commit ------------------------------------------------------------------------


def committed_rows(path: Path) -> Any:
    """The rows another object (or process) sees now."""
    with TensorBlob.open(path) as b:
        return b[:]


def test_writes_commit_at_flush_and_close(tmp_path: Path) -> None:
    path = tmp_path / "b"
    with TensorBlob.open(path, "w+", dtype="float32", shape=(2, 3), block_size=4) as b:
        assert b.write(rows(6)) == 6
        assert (len(b), b.tell()) == (6, 6)
        assert torch.equal(b[:], rows(6))  # this object reads its writes at once
        assert len(committed_rows(path)) == 0  # others see the last commit
        assert len(block_files(path)) == 2  # the blocks exist, uncommitted
        b.flush()
        assert torch.equal(committed_rows(path), rows(6))
        b.write(rows(3, 6))
        b.flush()
        b.flush()  # nothing new: no commit
        b.write(rows(2, 9))
        assert len(committed_rows(path)) == 9
    assert torch.equal(committed_rows(path), rows(11))  # the end of the with block commits
    with TensorBlob.open(path, "a") as b:
        b.write(rows(1, 11))
        b.close()  # close commits too
    assert torch.equal(committed_rows(path), rows(12))


def test_truncate_and_extend_commit_unflushed_writes(tmp_path: Path) -> None:
    make(tmp_path / "o", 3)
    with TensorBlob.open(make(tmp_path / "b", 2), "a") as b:
        b.write(rows(8, 2))
        b.truncate(7)
        assert torch.equal(committed_rows(tmp_path / "b"), rows(7))
        assert len(block_files(tmp_path / "b")) == 2
        b.write(rows(2, 7))
        with TensorBlob.open(tmp_path / "o") as other:
            b.extend(other)
        assert torch.equal(committed_rows(tmp_path / "b"), torch.cat([rows(9), rows(3)]))


def test_overwritten_rows_change_in_copies_of_their_blocks(tmp_path: Path) -> None:
    path = make(tmp_path / "b", 10)  # blocks of 4 rows
    before = block_files(path)
    expected = rows(10)
    expected[2:5] = -rows(3, 2)
    with TensorBlob.open(path, "r+") as b:
        b.seek(3)
        b.write(-rows(2, 3))  # rows 3 and 4: blocks 0 and 1 are copied first
        assert len(block_files(path)) == 5
        b.seek(2)
        b.write(-rows(1, 2))  # block 0 again: its copy takes it
        b.seek(0, io.SEEK_END)
        b.write(rows(1, 10))  # past the commit, in place in block 2
        assert len(block_files(path)) == 5
        assert torch.equal(b[:10], expected)
        assert torch.equal(committed_rows(path), rows(10))  # the committed rows are intact
        b.flush()
        assert torch.equal(committed_rows(path), torch.cat([expected, rows(1, 10)]))
        after = block_files(path)
        assert len(after) == 3 and len(set(after) & set(before)) == 1  # the copies replaced 0, 1
        b.seek(1)
        b.write(rows(1, 1))  # a new commit, a new copy
        assert len(block_files(path)) == 4
    assert len(block_files(path)) == 3


def test_a_reader_follows_blocks_replaced_by_a_commit(tmp_path: Path) -> None:
    path = make(tmp_path / "b", 12)
    with TensorBlob.open(path, max_cached_blocks=1) as reader:
        assert torch.equal(reader[0], rows(1)[0])  # block 0 looked up and mapped
        assert torch.equal(reader[11], rows(1, 11)[0])  # ... and unmapped
        with TensorBlob.open(path, "r+") as b:
            b.write(-rows(1))  # the commit replaces block 0 and deletes its file
        assert torch.equal(reader[0], -rows(1)[0])


def test_a_failed_commit_drops_the_writes_since_the_last_one(tmp_path: Path) -> None:
    path = make(tmp_path / "b", 6)
    with TensorBlob.open(path, "r+") as b:
        b.seek(2)
        b.write(-rows(7, 2))  # copies of blocks 0 and 1, a new block 2
        b._meta.version += 1  # as if another writer had committed
        with pytest.raises(StaleWriterError):
            b.flush()
        assert (len(b), b.tell()) == (6, 6)
        assert torch.equal(b[:], rows(6))
        assert len(block_files(path)) == 2
        b._meta.version -= 1
        b.write(rows(1, 6))
    assert torch.equal(committed_rows(path), rows(7))


def test_an_interrupt_just_after_a_commit_keeps_its_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = storage_meta.Metadata.commit

    def commit(self: Any, *args: Any) -> Any:
        real(self, *args)
        raise KeyboardInterrupt

    with TensorBlob.open(tmp_path / "b", "w", dtype="float32", shape=(2, 3), block_size=4) as b:
        b.write(rows(6))
        monkeypatch.setattr(storage_meta.Metadata, "commit", commit)
        with pytest.raises(KeyboardInterrupt):
            b.flush()  # the writer discards its blocks, but they committed: they stay
        monkeypatch.undo()
    assert torch.equal(committed_rows(tmp_path / "b"), rows(6))
    assert len(block_files(tmp_path / "b")) == 2


# -- metadata in SQLite ----------------------------------------------------------------------


def test_metadata_lives_in_one_sqlite_file(tmp_path: Path) -> None:
    path = make(tmp_path / "b", 10)
    names = sorted(os.listdir(path))
    assert names == sorted([META_FILE, *block_files(path)])  # no .conf/.stat, no WAL after close
    conn = sqlite3.connect(path / META_FILE)
    meta = dict(conn.execute("SELECT name, value FROM storage_meta"))
    assert (meta["schema_version"], meta["kind"], meta["block_size"]) == ("1", "blob", "4")
    assert conn.execute("SELECT length FROM storage_state").fetchone() == (10,)
    listed = [r[0] for r in conn.execute("SELECT file FROM storage_blocks ORDER BY idx")]
    assert sorted(listed) == block_files(path)
    assert conn.execute("SELECT dtype, shape FROM storage_fields").fetchone() == (
        "float32",
        "[2, 3]",
    )
    conn.close()


def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    from shardcat import SchemaVersionError

    path = make(tmp_path / "b", 2)
    conn = sqlite3.connect(path / META_FILE)
    conn.execute("UPDATE storage_meta SET value = '99' WHERE name = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(SchemaVersionError, match="version 99"):
        TensorBlob.open(path)


def test_one_writer_at_a_time(tmp_path: Path) -> None:
    path = make(tmp_path / "b", 4)
    with TensorBlob.open(path, "a") as first:
        for mode in ("a", "r+", "w", "a+", "w+"):
            with pytest.raises(BlockingIOError, match="one writer at a time"):
                TensorBlob.open(path, mode)
        with TensorBlob.open(path) as reader:  # readers are not writers
            assert len(reader) == 4
        first.write(rows(1, 4))
    with TensorBlob.open(path, "a") as b:  # closed: free again
        assert len(b) == 5


def test_without_flock_a_second_writer_fails_at_its_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage_lock, "acquire", lambda directory: None)  # e.g. a network fs
    path = make(tmp_path / "b", 4)
    with TensorBlob.open(path, "a") as first, TensorBlob.open(path, "a") as second:
        first.write(rows(1, 4))
        first.flush()
        second.write(rows(2, 9))
        with pytest.raises(StaleWriterError, match="another writer"):
            second.flush()
        assert len(second) == 4  # its writes are dropped, and their new block deleted
        assert len(block_files(path)) == 2
    with TensorBlob.open(path) as b:
        assert torch.equal(b[:], rows(5))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_children_do_not_hold_the_writer_lock(tmp_path: Path) -> None:
    path = make(tmp_path / "b", 4)
    writer = TensorBlob.open(path, "a")

    def child(fd: int) -> None:  # pragma: no cover - runs in the child
        os.write(fd, b"up\n")
        time.sleep(600)

    pid, fd = _run_child(child)
    try:
        _read_lines(fd, lambda lines: "up" in lines)
        writer.close()
        with TensorBlob.open(path, "a") as b:  # the child is alive, the lock is free
            b.write(rows(1, 4))
    finally:
        _kill(pid, fd)


def test_a_writer_dropped_unclosed_releases_the_lock_and_its_blocks(tmp_path: Path) -> None:
    path = make(tmp_path / "b", 4)
    b = TensorBlob.open(path, "a")
    b.write(rows(9, 4))  # three new blocks, never committed
    assert len(block_files(path)) == 4
    del b
    gc.collect()
    with TensorBlob.open(path, "a") as b:  # as tensorblob: unflushed writes are gone
        assert len(b) == 4
        assert len(block_files(path)) == 1  # and so are their blocks


def test_pickle_reopens_read_only_blobs(tmp_path: Path) -> None:
    path = make(tmp_path / "b", 7)
    with TensorBlob.open(path) as b:
        b.seek(2)
        clone = pickle.loads(pickle.dumps(b))
        assert (clone.tell(), len(clone)) == (2, 7)
        assert torch.equal(clone.read(), rows(5, 2))
        clone.close()
    with TensorBlob.open(path, "r+") as b, pytest.raises(TypeError, match="open for writing"):
        pickle.dumps(b)


# -- crash consistency -----------------------------------------------------------------------


def _run_child(target: Callable[[int], None]) -> tuple[int, int]:
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


def _read_lines(fd: int, until: Callable[[list[str]], bool], timeout: float = 20.0) -> list[str]:
    buf, lines, deadline = b"", [], time.monotonic() + timeout
    while not until(lines):
        assert time.monotonic() < deadline, f"child said only {lines}"
        chunk = os.read(fd, 4096)
        assert chunk, f"child exited early after {lines}"
        buf += chunk
        *done, buf = buf.split(b"\n")
        lines += [d.decode() for d in done]
    return lines


def _kill(pid: int, fd: int) -> None:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(fd)


def _stall_before_commit(fd: int) -> None:
    """Patch Metadata.transaction (child only): run the transaction, then hang before COMMIT."""
    real = storage_meta.Metadata.transaction

    @contextlib.contextmanager
    def transaction(self: Any) -> Any:
        with real(self) as conn:
            yield conn
            os.write(fd, b"in-commit\n")  # everything written, nothing committed
            time.sleep(600)

    storage_meta.Metadata.transaction = transaction  # type: ignore[method-assign]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_killed_with_unflushed_writes_leaves_the_flushed_rows(tmp_path: Path) -> None:
    path = make(tmp_path / "b", 5, shape=(1,), block_size=8)

    def child(fd: int) -> None:  # pragma: no cover - runs in the child
        blob = TensorBlob.open(path, "r+")
        blob.seek(0, io.SEEK_END)
        blob.write(rows(10, 5, shape=(1,)))
        blob.flush()  # 15 rows committed, in blocks 0 and 1
        blob.write(rows(20, 15, shape=(1,)))  # into block 1, past the commit, and blocks 2..4
        blob.seek(2)
        blob.write(-rows(12, 2, shape=(1,)))  # committed rows: into copies of blocks 0 and 1
        os.write(fd, b"written\n")
        time.sleep(600)

    pid, fd = _run_child(child)
    _read_lines(fd, lambda lines: "written" in lines)
    assert len(block_files(path)) == 7
    with TensorBlob.open(path) as b:  # meanwhile, other processes see the flushed rows
        assert torch.equal(b[:], rows(15, shape=(1,)))
    _kill(pid, fd)
    with TensorBlob.open(path) as b:
        assert torch.equal(b[:], rows(15, shape=(1,)))
    assert len(block_files(path)) == 7  # a reader leaves the dead writer's blocks alone
    with TensorBlob.open(path, "a") as b:  # a writer deletes them
        assert len(block_files(path)) == 2
        b.write(rows(3, 15, shape=(1,)))
    with TensorBlob.open(path) as b:
        assert torch.equal(b[:], rows(18, shape=(1,)))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
@pytest.mark.parametrize("flock", [True, False], ids=["flock", "no-flock"])
def test_a_killed_writer_not_yet_waited_for_is_taken_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flock: bool
) -> None:
    """A zombie writer (killed, not yet waited for) still answers kill(pid, 0): it holds nothing.

    With ``flock`` the kernel frees the lock; without it, the next writer
    tells the zombie's reserved blocks from a live writer's by the owner.
    """
    if not flock:
        monkeypatch.setattr(storage_lock, "acquire", lambda directory: None)  # e.g. a network fs
    path = make(tmp_path / "b", 4)

    def child(fd: int) -> None:  # pragma: no cover - runs in the child
        blob = TensorBlob.open(path, "a")
        blob.write(rows(9, 4))  # three new blocks, never committed
        os.write(fd, b"written\n")
        time.sleep(600)

    pid, fd = _run_child(child)
    try:
        _read_lines(fd, lambda lines: "written" in lines)
        assert len(block_files(path)) == 4
        if flock:
            with pytest.raises(BlockingIOError, match="one writer at a time"):
                TensorBlob.open(path, "a")
        else:
            with TensorBlob.open(path, "a"):  # a live writer's blocks are left alone
                assert len(block_files(path)) == 4
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while _proc_state(pid) != "Z":
            assert time.monotonic() < deadline, "the writer never became a zombie"
            time.sleep(0.01)
        with TensorBlob.open(path, "a") as b:  # the zombie's lock and blocks are taken over
            assert len(block_files(path)) == 1
            b.write(rows(1, 4))
    finally:
        os.waitpid(pid, 0)
        os.close(fd)
    with TensorBlob.open(path) as b:
        assert torch.equal(b[:], rows(5))


def _proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0].decode()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_killed_during_flush_leaves_the_previous_commit(tmp_path: Path) -> None:
    path = make(tmp_path / "b", 30, shape=(1,), block_size=8)

    def child(fd: int) -> None:  # pragma: no cover - runs in the child
        blob = TensorBlob.open(path, "r+")
        blob.seek(0, io.SEEK_END)
        blob.write(rows(20, 30, shape=(1,)))  # fills block 3, adds blocks 4..6
        blob.seek(1)
        blob.write(-rows(2, 1, shape=(1,)))  # a copy of block 0
        _stall_before_commit(fd)
        blob.flush()

    pid, fd = _run_child(child)
    _read_lines(fd, lambda lines: "in-commit" in lines)
    assert len(block_files(path)) == 8  # 4 committed, 3 new, 1 copy
    _kill(pid, fd)
    with TensorBlob.open(path) as b:
        assert torch.equal(b[:], rows(30, shape=(1,)))
    with TensorBlob.open(path, "a") as b:
        assert len(block_files(path)) == 4
        b.write(rows(3, 30, shape=(1,)))
    with TensorBlob.open(path) as b:
        assert torch.equal(b[:], rows(33, shape=(1,)))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_killed_while_writing_and_flushing_in_a_loop(tmp_path: Path) -> None:
    path = make(tmp_path / "b", 5, shape=(1,), block_size=16)

    def child(fd: int) -> None:  # pragma: no cover - runs in the child
        blob = TensorBlob.open(path, "a")
        for i in itertools.count(1):
            blob.write(rows(7, len(blob), shape=(1,)))
            if i % 3 == 0:
                blob.flush()
                os.write(fd, f"{len(blob)}\n".encode())

    pid, fd = _run_child(child)
    lines = _read_lines(fd, lambda lines: len(lines) >= 40)
    _kill(pid, fd)
    flushed = int(lines[-1])
    with TensorBlob.open(path, "a") as b:
        assert len(b) >= flushed and (len(b) - 5) % 21 == 0  # a flushed state, never between
        assert torch.equal(b[:], rows(len(b), shape=(1,)))
        assert len(block_files(path)) == math.ceil(len(b) / 16)


# -- the LRU of mapped blocks ----------------------------------------------------------------


def _mappings(path: Path) -> int:
    """Block files of ``path`` mapped in this process (SQLite maps its -shm file too)."""
    with open("/proc/self/maps") as f:
        return sum(
            str(path) in line and bool(UUID.match(line.rstrip().rpartition("/")[2])) for line in f
        )


def test_default_cache_size_comes_from_max_map_count(tmp_path: Path) -> None:
    with TensorBlob.open(make(tmp_path / "b", 2)) as b:
        try:
            limit = int(Path("/proc/sys/vm/max_map_count").read_text())
        except OSError:
            limit = 65530
        assert b.max_cached_blocks == max(limit // 16, 128)
    with TensorBlob.open(tmp_path / "b", max_cached_blocks=0) as b:
        assert b.max_cached_blocks == max(limit // 16, 128)  # 0 means the default, as in tensorblob


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc")
def test_cache_bounds_mapped_blocks(tmp_path: Path) -> None:
    path = make(tmp_path / "b", 40, block_size=4)  # 10 blocks
    data = rows(40)
    with TensorBlob.open(path, max_cached_blocks=3) as b:
        order = list(range(40))
        random.Random(5).shuffle(order)
        for i in order:
            assert torch.equal(b[i], data[i])
            assert b.mapped_blocks <= 3
            assert _mappings(path) <= 3
        assert torch.equal(b[order], data[order])  # a gather over all 10 blocks
        assert torch.equal(b[::-1], data.flip(0))
        assert torch.equal(torch.stack(list(b)), data)
        assert b.mapped_blocks == 3 and _mappings(path) == 3
    assert _mappings(path) == 0  # close unmaps everything


# -- tensorblob directories ----------------------------------------------------------------


def test_tensorblob_directory_is_converted_in_place(tmp_path: Path) -> None:
    tensorblob = need("tensorblob", why="shardcat[bench]")
    data = rows(37)
    with tensorblob.TensorBlob.open(
        tmp_path / "b", "w", dtype="float32", shape=(2, 3), block_size=8
    ) as b:
        b.write(data)
    before = {n: os.stat(tmp_path / "b" / n).st_ino for n in block_files(tmp_path / "b")}
    assert len(before) == 5
    with (
        pytest.warns(ShardcatWarning, match="converting the tensorblob TensorBlob"),
        TensorBlob.open(tmp_path / "b", "r+") as b,
    ):
        assert (len(b), b.dtype, b.shape, b.block_size) == (37, "float32", (2, 3), 8)
        assert torch.equal(b[:], data)
        assert torch.equal(b[[36, 0, 17]], data[[36, 0, 17]])
    after = {n: os.stat(tmp_path / "b" / n).st_ino for n in block_files(tmp_path / "b")}
    assert after == before  # the same files: nothing copied
    assert not (tmp_path / "b" / ".conf").exists() and not (tmp_path / "b" / ".stat").exists()
    with TensorBlob.open(tmp_path / "b", "a") as b:
        b.write(rows(5, 37))
    with TensorBlob.open(tmp_path / "b") as b:
        assert torch.equal(b[:], rows(42))


def test_tensorblob_conversion_recovers_from_being_killed(tmp_path: Path) -> None:
    tensorblob = need("tensorblob", why="shardcat[bench]")
    data = rows(9)
    for name in ("before", "after"):
        with tensorblob.TensorBlob.open(tmp_path / name, "w", dtype="float32", shape=(2, 3)) as b:
            b.write(data)
    (tmp_path / "before" / META_FILE).write_bytes(b"")  # killed before its commit
    with TensorBlob.open(tmp_path / "before") as b:  # read in place: the JSON is what holds
        assert torch.equal(b[:], data)
    with pytest.warns(ShardcatWarning), TensorBlob.open(tmp_path / "before", "r+") as b:
        assert torch.equal(b[:], data)
    conf = (tmp_path / "after" / ".conf").read_bytes()
    stat = (tmp_path / "after" / ".stat").read_bytes()
    with pytest.warns(ShardcatWarning), TensorBlob.open(tmp_path / "after", "r+"):
        pass
    (tmp_path / "after" / ".conf").write_bytes(conf)  # killed after its commit, before cleanup
    (tmp_path / "after" / ".stat").write_bytes(stat)
    with TensorBlob.open(tmp_path / "after") as b:  # the SQLite metadata wins
        assert torch.equal(b[:], data)
    with TensorBlob.open(tmp_path / "after", "a"):  # a writer removes the stale JSON
        assert not (tmp_path / "after" / ".conf").exists()


def test_tensorblob_directory_with_an_unsupported_dtype_is_left_alone(tmp_path: Path) -> None:
    tensorblob = need("tensorblob", why="shardcat[bench]")
    with tensorblob.TensorBlob.open(tmp_path / "c", "w", dtype="complex64", shape=2) as b:
        b.write(torch.ones(3, 2, dtype=torch.complex64))
    with pytest.raises(ValueError, match="cannot be stored"):
        TensorBlob.open(tmp_path / "c")
    assert (tmp_path / "c" / ".conf").exists() and (tmp_path / "c" / ".stat").exists()
    assert not (tmp_path / "c" / META_FILE).exists()


def test_tensorblob_blob_extends_a_shardcat_blob(tmp_path: Path) -> None:
    tensorblob = need("tensorblob", why="shardcat[bench]")
    with tensorblob.TensorBlob.open(tmp_path / "t", "w", dtype="float32", shape=(2, 3)) as t:
        t.write(rows(9, 100))
        make(tmp_path / "b", 3)
        with TensorBlob.open(tmp_path / "b", "a") as b:
            with pytest.raises(ValueError, match="Block sizes must match"):  # 4 and 8192
                b.extend(t)
            b.extend(t, maintain_order=True)
            assert torch.equal(b[:], torch.cat([rows(3), rows(9, 100)]))


def test_same_results_as_tensorblob(tmp_path: Path) -> None:
    """A random sequence of operations gives the same rows and positions in both."""
    tensorblob = need("tensorblob", why="shardcat[bench]")
    rng = random.Random(11)
    for trial in range(6):
        opened = [
            cls.open(tmp_path / f"{name}{trial}", "w+", dtype="float32", shape=(2, 3), block_size=4)
            for name, cls in (("ours", TensorBlob), ("theirs", tensorblob.TensorBlob))
        ]
        counter = 0
        for _ in range(40):
            op = rng.choice(["write", "seek", "read", "truncate", "index", "slice", "gather"])
            n = len(opened[0])
            args: tuple[Any, ...]
            if op == "write":
                k = rng.randint(0, 9)
                args = (rows(k, counter),)
                counter += k
            elif op == "seek":
                args = (rng.randint(-12, 12), rng.choice([0, 1, 2]))
            elif op == "read":
                args = (rng.choice([None, 0, 1, 3, 7, 20]),)
            elif op == "truncate":
                args = (rng.choice([None, 0, n // 2, n, n + 3]),)
            elif op == "index":
                args = (rng.randint(-n, n - 1),) if n else ()
            elif op == "slice":
                args = (slice(rng.randint(-n - 2, n + 2), None, rng.choice([1, 2, -1, -3])),)
            else:
                args = ([rng.randint(-n, n - 1) for _ in range(5)],) if n else ()
            results = []
            for b in opened:
                if op in ("write", "seek", "read", "truncate"):
                    results.append(getattr(b, op)(*args))
                elif args:
                    results.append(b[args[0]])
            for ours, theirs in zip(results[::2], results[1::2], strict=True):
                if isinstance(ours, torch.Tensor):
                    assert torch.equal(ours, theirs), op
                else:
                    assert ours == theirs, op
            assert len(opened[0]) == len(opened[1]) and opened[0].tell() == opened[1].tell(), op
        for b in opened:
            b.close()


# -- without torch -----------------------------------------------------------------------------


def test_imports_without_torch_and_hints_at_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "sys.modules['tensordict'] = None\n"
        "import shardcat\n"
        "from shardcat import TensorBlob, TensorDB, Catalog\n"
        "for cls in (TensorBlob, TensorDB):\n"
        "    try:\n"
        "        cls.open('x', 'r')\n"
        "    except ImportError as exc:\n"
        "        print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout.splitlines()
    assert len(out) == 2
    assert all("pip install 'shardcat[torch]'" in line for line in out)


# -- tensorblob's README examples ----------------------------------------------------------------

# Verbatim from tensorblob 0.3.0's README, but for the import line (the one change a
# user makes). test_examples_match_the_readme checks them against the package's README.
QUICK_START = """\
import torch
from shardcat import TensorBlob

# Create a new storage for a collection of randomly generated fake embeddings;
# need to specify the data type and shape of each tensor for creation
with TensorBlob.open("embeddings.blob", "w", dtype="float32", shape=768) as blob:
    blob.write(torch.randn(100_000, 768))
    print(f"Wrote {len(blob)} embeddings")

# No need to specify the configurations again after creation
with TensorBlob.open("embeddings.blob", "r") as blob:
    e1 = blob[42]
    e2 = blob[-1:16384:-12345]
    print(f"Similarity: {torch.cosine_similarity(e1, e2)}")
"""

LARGE_DATASETS = """\
with TensorBlob.open("data/images.blob", "w", dtype="float32", shape=(3, 224, 224)) as blob:
    for image_batch in data_loader:
        blob.write(preprocess(image_batch))

with TensorBlob.open("data/images.blob", "r") as blob:
    for image in blob:
        result = model(image)
"""

INCREMENTAL = """\
with TensorBlob.open("positions.blob", "w", dtype="float32", shape=3) as blob:
    blob.write(initial_position)

# Later: append more data by opening the blob in append mode
with TensorBlob.open("positions.blob", "a") as blob:
    for pos in trajectory_queue.get():
        blob.write(pos)
    print(f"Total trajectory recorded: {len(blob)}")
"""

RANDOM_ACCESS = """\
import io

with TensorBlob.open("data/features.blob", "r+") as blob:
    blob.seek(1000)
    print(f"Current position: {blob.tell()}")

    batch = blob.read(size=100)
    print(f"Read {batch.shape} tensors")

    # Update specific positions, whence is also supported
    blob.seek(-500, whence=io.SEEK_END)
    blob.write(updated_features)

    # Append new data
    blob.seek(len(blob))
    blob.write(additional_features)
"""

EXTEND_TRUNCATE = """\
with TensorBlob.open("data/features.blob", "a") as blob:
    blob.extend(other_blob)

# Extension without maintaining the order is faster
with TensorBlob.open("data/features.blob", "r+") as blob:
    blob.extend(other_blob, maintain_order=False)

with TensorBlob.open("data/features.blob", "r+") as blob:
    blob.truncate(1000)
    print(f"Truncated to {len(blob)} tensors")
"""

CACHE = """\
# Increase cache for better random access performance
with TensorBlob.open("large.blob", "r", max_cached_blocks=10_000) as blob:
    for idx in random_indices:
        tensor = blob[idx]  # Cached blocks reused efficiently

# Decrease cache for memory-constrained environments
with TensorBlob.open("data.blob", "r", max_cached_blocks=100) as blob:
    for tensor in blob:  # Sequential access works fine with small cache
        process(tensor)
"""

BLOB_EXAMPLES = [QUICK_START, LARGE_DATASETS, INCREMENTAL, RANDOM_ACCESS, EXTEND_TRUNCATE, CACHE]


def readme_examples() -> list[str]:
    """The python blocks of the installed tensorblob's README, import switched to shardcat."""
    from importlib.metadata import metadata

    text = metadata("tensorblob").get_payload()  # type: ignore[attr-defined]
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    return [
        "\n".join(
            line.rstrip() for line in b.replace("from tensorblob", "from shardcat").split("\n")
        )
        for b in blocks
    ]


def test_examples_match_the_readme() -> None:
    need("tensorblob", why="shardcat[bench]")
    examples = readme_examples()
    assert len(examples) == 8  # 6 TensorBlob examples; the 2 TensorDB ones are in test_storage_db
    assert [examples[i] for i in (0, 1, 2, 3, 4, 7)] == BLOB_EXAMPLES


def test_readme_blob_examples_run_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    gen = torch.Generator().manual_seed(0)
    loaded: list[Any] = []
    ns: dict[str, Any] = {
        "data_loader": [torch.rand(2, 3, 224, 224, generator=gen) for _ in range(3)],
        "preprocess": lambda batch: batch * 2 - 1,
        "model": lambda image: loaded.append(image) or image.mean(),
    }
    exec(QUICK_START, ns)
    out = capsys.readouterr().out
    assert "Wrote 100000 embeddings" in out
    assert ns["e1"].shape == (768,) and ns["e2"].shape == (7, 768)

    exec(LARGE_DATASETS, ns)
    assert torch.equal(torch.stack(loaded), torch.cat(ns["data_loader"]) * 2 - 1)

    class Queue:
        def get(self) -> list[Any]:
            return [torch.full((3,), float(i)) for i in range(4)]

    ns.update(initial_position=torch.zeros(2, 3), trajectory_queue=Queue())
    exec(INCREMENTAL, ns)
    assert "Total trajectory recorded: 6" in capsys.readouterr().out
    with TensorBlob.open("positions.blob") as b:
        assert torch.equal(b[2:][:, 0], torch.arange(4.0))

    features = torch.arange(2000 * 4, dtype=torch.float32).view(2000, 4)
    with TensorBlob.open("data/features.blob", "w", dtype="float32", shape=4, block_size=256) as b:
        b.write(features)
    ns.update(updated_features=-torch.ones(500, 4), additional_features=torch.ones(10, 4))
    exec(RANDOM_ACCESS, ns)
    assert "Current position: 1000" in capsys.readouterr().out
    assert torch.equal(ns["batch"], features[1000:1100])
    with TensorBlob.open("data/features.blob") as b:
        assert len(b) == 2010
        assert torch.equal(b[:1500], features[:1500])
        assert torch.equal(b[1500:2000], -torch.ones(500, 4))
        assert torch.equal(b[2000:], torch.ones(10, 4))

    with TensorBlob.open("other.blob", "w", dtype="float32", shape=4, block_size=256) as other:
        other.write(torch.full((300, 4), 5.0))
    with TensorBlob.open("other.blob") as other_blob:
        ns["other_blob"] = other_blob
        exec(EXTEND_TRUNCATE, ns)
    assert "Truncated to 1000 tensors" in capsys.readouterr().out
    with TensorBlob.open("data/features.blob") as b:
        assert torch.equal(b[:], features[:1000])

    make(tmp_path / "large.blob", 300, block_size=16)
    make(tmp_path / "data.blob", 50, block_size=4)
    processed: list[Any] = []
    ns.update(random_indices=[299, 0, 150, 7], process=processed.append)
    exec(CACHE, ns)
    assert torch.equal(ns["tensor"], rows(50)[-1])
    assert torch.equal(torch.stack(processed), rows(50))


def test_catalog_migrate_converts_tensorblob_directories(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from shardcat.cli import app

    tensorblob = need("tensorblob", why="shardcat[bench]")
    data = rows(21)
    with tensorblob.TensorBlob.open(tmp_path / "b", "w", dtype="float32", shape=(2, 3)) as b:
        b.write(data)
    with tensorblob.TensorDB.open(
        tmp_path / "d", "w", schema={"x": ("int64", (2,)), "y": ("float32", ())}
    ) as db:
        db.write({"x": torch.arange(8).reshape(4, 2), "y": torch.ones(4)})
    runner = CliRunner()
    dry = runner.invoke(app, ["migrate", str(tmp_path / "b"), "--dry-run"])
    assert dry.exit_code == 0 and "would be converted in place" in dry.output
    assert (tmp_path / "b" / ".conf").exists()
    result = runner.invoke(app, ["migrate", str(tmp_path / "b"), str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    assert f"{tmp_path / 'b'}: tensorblob TensorBlob of 21 rows converted in place" in result.output
    assert f"{tmp_path / 'd'}: tensorblob TensorDB of 4 rows converted in place" in result.output
    assert not (tmp_path / "b" / ".conf").exists()
    with TensorBlob.open(tmp_path / "b") as b:
        assert torch.equal(b[:], data)
    from shardcat import TensorDB

    with TensorDB.open(tmp_path / "d") as db:
        assert torch.equal(db[:]["x"], torch.arange(8).reshape(4, 2))


# -- the two write paths: os.pwrite into the block file, or a copy into its mapping -------


@pytest.fixture(params=["pwrite", "mapped"])
def write_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every write goes through os.pwrite (threshold 0) or through the mapping (never pwrite)."""
    from shardcat.storage import column

    monkeypatch.setattr(column, "PWRITE_BYTES", 0 if request.param == "pwrite" else 1 << 62)
    return str(request.param)


def test_both_write_paths_store_the_same_rows(tmp_path: Path, write_path: str) -> None:
    path = make(tmp_path / "b", 6)
    with TensorBlob.open(path, "r+") as b:
        assert torch.equal(b[5], rows(1, 5)[0])  # block 1 mapped before it is written
        b.seek(3)
        b.write(-rows(9, 3))  # committed rows (block copies), the mapped block, new blocks
        b.seek(10)
        b.write(rows(1, 77))  # rows written twice before the commit: the last one wins
        expected = torch.cat([rows(3), -rows(7, 3), rows(1, 77), -rows(1, 11)])
        assert torch.equal(b[:], expected)  # this object reads its writes at once
        with TensorBlob.open(path) as reader:  # other objects: the committed rows only
            assert torch.equal(reader[:], rows(6))
    with TensorBlob.open(path) as b:
        assert torch.equal(b[:], expected)
        assert torch.equal(b[[11, 0, 10]], expected[[11, 0, 10]])


def test_a_failed_commit_after_large_writes_keeps_the_previous_commit(
    tmp_path: Path, write_path: str
) -> None:
    shape = (64, 256)  # 64 KB rows: every piece of a write is large
    path = make(tmp_path / "b", 5, shape=shape)
    with TensorBlob.open(path, "r+") as b:
        b.seek(1)
        b.write(-rows(9, 1, shape=shape))
        b._meta.version += 1  # as if another writer had committed
        with pytest.raises(StaleWriterError):
            b.flush()
        assert (len(b), b.tell()) == (5, 5)
        assert torch.equal(b[:], rows(5, shape=shape))
        assert len(block_files(path)) == 2
        b._meta.version -= 1
    with TensorBlob.open(path) as b:
        assert torch.equal(b[:], rows(5, shape=shape))
