"""What TensorBlob and TensorDB share: modes, the file position, indexing, commits."""

from __future__ import annotations

import dataclasses
import io
import operator
import os
import shutil
import sqlite3
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch

from shardcat.errors import ShardcatWarning, StorageTypeError, StorageValueError
from shardcat.storage.column import (
    BlockColumn,
    default_max_cached_blocks,
    parse_dtype,
    parse_shape,
)
from shardcat.storage.convert import import_tensorblob, read_tensorblob
from shardcat.storage.meta import KINDS, META_FILE, FieldSpec, Layout, Metadata, probe

__all__ = ["Chunk", "Storage", "check_mode"]

S = TypeVar("S", bound="Storage")
# One piece of rows to write: first position, {field: rows}, optional keys.
Chunk = tuple[int, dict[str, torch.Tensor], Sequence[str | None] | None]
_CHUNK_BYTES = 1 << 24  # rows copied per step when extending row-wise


def check_mode(mode: str) -> None:
    """tensorblob's mode rules: one of r/w/a, at most one '+', nothing else."""
    chars = set(mode)
    if chars - set("raw+") or len(mode) > len(chars):
        raise StorageValueError(f"Invalid mode: {mode}")
    if sum(c in "raw" for c in mode) != 1 or mode.count("+") > 1:
        raise StorageValueError(
            f"Must have exactly one of read/write/append mode and at most one plus: {mode}"
        )


class Storage:
    """Fields of row-aligned tensors in block files, with file-like access.

    Subclasses set ``kind`` and provide the user-facing API. Writes change the
    blocks and the in-memory state (``_length``, ``_fresh``); :meth:`_commit`
    turns that state into the committed one in one SQLite transaction (see
    :mod:`shardcat.storage.meta`), and :meth:`_discard` drops it.
    """

    kind: ClassVar[str]
    noun: ClassVar[str]

    def __init__(
        self, path: Path, mode: str, meta: Metadata, max_cached_blocks: int | None
    ) -> None:
        self.filename = os.fspath(path)
        self.mode = mode
        self.block_size = meta.block_size
        self._readable = "r" in mode or "+" in mode
        self._writable = mode != "r"
        self._append = "a" in mode
        self._closed = False
        self._meta = meta
        self._max_cached_arg = max_cached_blocks
        if max_cached_blocks is not None and max_cached_blocks < 0:
            raise StorageValueError(f"max_cached_blocks must be positive, got {max_cached_blocks}")
        # None or 0 means the default (as in tensorblob); a TensorDB's default is
        # shared out among its fields, an explicit number applies to each field.
        per_field = max_cached_blocks or max(default_max_cached_blocks() // len(meta.fields), 16)
        self.max_cached_blocks = max_cached_blocks or default_max_cached_blocks()
        self._columns = {
            spec.name: BlockColumn(
                path,
                spec,
                meta.block_size,
                meta,
                per_field,
                self._writable,
                "the blob" if self.kind == "blob" else f"field {spec.name!r}",
            )
            for spec in meta.fields
        }
        self._length = meta.length  # with the rows written since the last commit
        # blocks whose files are new since the last commit (the same for every field)
        self._fresh: set[int] = set()
        self._dirty = False  # anything to commit
        self._pos = meta.length if self._append else 0

    # -- opening -------------------------------------------------------------------------

    @classmethod
    def _open(
        cls: type[S],
        filename: str | os.PathLike[str],
        mode: str,
        max_cached_blocks: int | None,
        layout: Callable[[], Layout],
    ) -> S:
        check_mode(mode)
        path = Path(filename).expanduser().resolve()
        name = KINDS[cls.kind]
        writable = mode != "r"
        meta: Metadata | None = None
        state = probe(path)
        if state == "shardcat":
            meta = Metadata.load(path, writable=writable)
            if meta is None:  # a creation or conversion that was killed before it committed
                state = probe(path, ignore_metadata=True)
        if state == "tensorblob":
            meta = cls._tensorblob(path, mode)
        if meta is None:
            if state == "foreign" and "w" in mode:
                raise FileExistsError(
                    f"{str(path)!r} exists and is not a {name} (it has no {META_FILE}); "
                    "choose a new path"
                )
            if state == "foreign" or "r" in mode or "a" in mode:
                raise FileNotFoundError(f"{cls.noun.capitalize()} not found: {str(path)!r}")
            meta = Metadata.create(path, layout())  # missing, or an empty directory
        elif meta.kind != cls.kind:
            meta.close()
            raise StorageValueError(f"{str(path)!r} holds a {KINDS[meta.kind]}, not a {name}")
        try:
            storage = cls(path, mode, meta, max_cached_blocks)
            if "w" in mode and meta.length:
                storage._truncate_at(0)
        except BaseException:
            meta.close()
            raise
        return storage

    @classmethod
    def _tensorblob(cls, path: Path, mode: str) -> Metadata:
        """The metadata of a directory written by the tensorblob package: read where it
        is for mode ``r`` (kept in memory; nothing on disk changes), else converted in
        place (:func:`~shardcat.storage.convert.import_tensorblob`), with a warning
        saying so: the tensorblob package can no longer open it afterwards."""
        if mode == "r":
            return Metadata.in_memory(path, read_tensorblob(path, cls.kind, _check_field).fill)
        warnings.warn(
            f"converting the tensorblob {KINDS[cls.kind]} at {str(path)!r} to shardcat "
            f"storage in place (mode {mode!r} writes): its .conf/.stat JSON files are "
            f"replaced by {META_FILE}, so the tensorblob package can no longer open it; "
            "open it with mode 'r' to read it without converting",
            ShardcatWarning,
            stacklevel=4,
        )
        import_tensorblob(path, cls.kind, _check_field)
        return Metadata(path, writable=True)

    @classmethod
    def _convert(cls, directory: Path) -> int:
        """Convert the tensorblob directory ``directory`` in place, without a warning
        (``catalog migrate``, which says so itself); returns its row count."""
        import_tensorblob(directory, cls.kind, _check_field)
        with cls._open(directory, "r", None, cls._no_layout) as storage:
            return len(storage)

    @classmethod
    def _unlink(cls, filename: str | os.PathLike[str]) -> bool:
        """Remove a storage directory (tensorblob's semantics: True when gone, else warn)."""
        path = Path(filename).expanduser().resolve()
        if not path.exists():
            return True
        try:
            state = probe(path)
            if state == "shardcat":
                meta = Metadata.load(path, writable=False)
                if meta is not None:
                    meta.close()
                    if meta.kind != cls.kind:
                        raise StorageValueError(f"it holds a {KINDS[meta.kind]}")
            elif state not in ("tensorblob", "empty"):
                raise StorageValueError(f"not a {KINDS[cls.kind]} directory")
            shutil.rmtree(path)
        except (OSError, ValueError) as exc:
            warnings.warn(f"Failed to unlink {cls.noun} at {str(path)!r}: {exc}", stacklevel=3)
            return False
        return True

    # -- file-like ---------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return self._length

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def tell(self) -> int:
        """The current row position."""
        self._check_closed()
        return self._pos

    def seek(self, pos: int = 0, whence: int = io.SEEK_SET) -> int:
        """Move to a row position (clamped to ``0 .. len``); returns it."""
        self._check_closed()
        if whence == io.SEEK_SET:
            target = pos
        elif whence == io.SEEK_CUR:
            target = self._pos + pos
        elif whence == io.SEEK_END:
            target = len(self) + pos
        else:
            raise StorageValueError(f"Invalid whence: {whence!r}")
        self._pos = max(min(target, len(self)), 0)
        return self._pos

    def flush(self) -> None:
        """Commit the rows written since the last commit, in one transaction.

        Until then, other processes (and other objects) see the rows of the
        last commit; this object sees its own writes at once. If the commit
        fails, those writes are dropped (the last commit stays).
        """
        self._check_writable()
        if self._dirty:
            self._commit()

    def truncate(self, pos: int | None = None) -> int:
        """Cut every field to ``pos`` rows (default: the current position); returns the length.

        The position moves to the cut, clamped to the length as in tensorblob
        (truncate never grows). Commits (with any unflushed writes); unused
        block files are deleted.
        """
        self._check_writable()
        if pos is not None and pos < 0:
            raise StorageValueError(f"Truncate position must be non-negative, got {pos}!")
        self.seek(pos if pos is not None else self.tell())
        self._truncate_at(self._pos)
        return self._pos

    def close(self) -> None:
        """Commit unflushed writes (as :meth:`flush`), unmap every block, close (idempotent)."""
        if self._closed:
            return
        try:
            if self._dirty:
                self._commit()
        finally:
            self._closed = True
            for column in self._columns.values():
                column.clear()
            self._meta.close()

    def _check_closed(self) -> None:
        if self._closed:
            raise OSError(f"I/O operation on closed {self.noun}.")

    def _check_writable(self) -> None:
        if not self._writable:
            raise OSError(f"{self.noun.capitalize()} is not open for writing (mode='{self.mode}')")
        self._check_closed()

    def _check_readable(self) -> None:
        if not self._readable:
            raise OSError(f"{self.noun.capitalize()} is not open for reading (mode='{self.mode}')")
        self._check_closed()

    def __getstate__(self) -> dict[str, Any]:
        if self._writable:
            raise StorageTypeError(
                f"cannot pickle a {KINDS[self.kind]} open for writing (mode {self.mode!r}); "
                "pickle one opened with mode 'r'"
            )
        return {
            "filename": self.filename,
            "mode": self.mode,
            "max_cached_blocks": self._max_cached_arg,
            "pos": self._pos,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        fresh = self._open(
            state["filename"], state["mode"], state["max_cached_blocks"], self._no_layout
        )
        self.__dict__.update(fresh.__dict__)
        self._pos = state["pos"]

    @staticmethod
    def _no_layout() -> Layout:
        raise FileNotFoundError("the storage was removed")

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self)} rows"
        return f"{KINDS[self.kind]}({self.filename!r}, mode={self.mode!r}, {state})"

    # -- reading -----------------------------------------------------------------------

    def _n_blocks(self, length: int) -> int:
        return -(-length // self.block_size)

    def _select(self, idx: Any, names: Iterable[str]) -> dict[str, torch.Tensor]:
        """Rows of ``names`` at an int, a slice, or a batch of positions."""
        self._check_closed()
        n = len(self)
        columns = [self._columns[name] for name in names]
        if isinstance(idx, (torch.Tensor, np.ndarray)) and idx.ndim == 0:
            if not _is_integer(idx):
                raise StorageTypeError(f"Index must have an integer dtype, got {idx.dtype}")
            idx = int(idx)
        if isinstance(idx, int):
            i = idx + n if idx < 0 else idx
            if not 0 <= i < n:
                raise IndexError(f"Index out of bounds: {idx!r} (length: {n})")
            return {c.name: c.row(i) for c in columns}
        if isinstance(idx, slice):
            rng = range(*idx.indices(n))
            if not rng:
                return {c.name: c.empty(0) for c in columns}
            if rng.step > 0:
                return {c.name: c.read(rng.start, rng.stop, rng.step) for c in columns}
            low, high = rng[-1], rng[0] + 1
            return {c.name: c.read(low, high, -rng.step).flip(0) for c in columns}
        if isinstance(idx, (list, tuple, torch.Tensor, np.ndarray)):
            positions = _positions(idx, n)
            return {c.name: c.gather(positions) for c in columns}
        try:
            i = operator.index(idx)
        except TypeError:
            raise StorageTypeError(
                f"Index must be int, slice, or a sequence of int, got {type(idx).__name__!r}!"
            ) from None
        return self._select(i, names)

    def _read_at_position(self, size: int | None, names: Iterable[str]) -> dict[str, torch.Tensor]:
        self._check_readable()
        n = len(self)
        end = n if size is None or size < 0 else min(self._pos + size, n)
        end = max(end, self._pos)
        out = {name: self._columns[name].read(self._pos, end) for name in names}
        self._pos = end
        return out

    def _iter_rows(self, names: Sequence[str]) -> Iterator[dict[str, torch.Tensor]]:
        """Rows from the current position to the end, read a few MB at a time."""
        row_bytes = sum(self._columns[name].row_bytes for name in names) or 1
        step = max(1, min(self.block_size, _CHUNK_BYTES // 4 // row_bytes))
        while self._pos < len(self):
            start = self._pos
            stop = min(start + step, len(self))
            chunk = {name: self._columns[name].read(start, stop) for name in names}
            for j in range(stop - start):
                self._pos = start + j + 1
                yield {name: rows[j].clone() for name, rows in chunk.items()}

    # -- writing and committing ------------------------------------------------------------

    def _record(self, pos: int, n: int, keys: Sequence[str | None] | None) -> None:
        """Note rows ``pos ... pos + n`` for the SQL mirror's next commit (TensorDB)."""

    def _mirror(self, conn: sqlite3.Connection) -> None:
        """Bring the SQL mirror up to the in-memory state; inside the commit (TensorDB)."""

    def _forget_mirror(self) -> None:
        """Drop what :meth:`_record` noted (committed or discarded)."""

    def _directories(self) -> dict[str, Path]:
        return {name: column.directory for name, column in self._columns.items()}

    def _fresh_files(self, blocks: Iterable[int]) -> list[tuple[str, str]]:
        return [(f, c.file(b)) for f, c in self._columns.items() for b in blocks]

    def _add_blocks(
        self, blocks: Sequence[int], sources: Sequence[tuple[Storage, int] | None]
    ) -> None:
        """New files for ``blocks``: copies of ``(storage, block)`` sources, or empty (None).

        Their names are recorded as pending (one small commit) before any
        file exists, so a killed writer's files are found and deleted.
        """
        names = self._meta.reserve({f: len(blocks) for f in self._columns})
        try:
            for field, column in self._columns.items():
                for name, source in zip(names[field], sources, strict=True):
                    origin = None if source is None else (source[0]._columns[field], source[1])
                    column.create_file(name, origin)
        except BaseException:
            self._meta.release([(f, n) for f, ns in names.items() for n in ns], self._directories())
            raise
        for field, column in self._columns.items():
            column.adopt(dict(zip(blocks, names[field], strict=True)))
        self._fresh.update(blocks)
        self._dirty = True

    def _write_rows(
        self, pos: int, n: int, data: dict[str, np.ndarray], keys: Sequence[str | None] | None
    ) -> None:
        """Write ``n`` byte rows per field (:meth:`BlockColumn.as_rows`) at ``pos <= len``.

        They go where no commit looks: rows past the last block get new
        blocks, and committed rows are overwritten in copies of their blocks,
        made on the first such write after a commit (copy-on-write).
        """
        end = pos + n
        bs, committed = self.block_size, self._meta.length
        have = self._n_blocks(self._length)
        copies = []
        if pos < committed:  # blocks whose committed rows are overwritten, not copied yet
            last = self._n_blocks(min(end, committed))
            copies = [b for b in range(pos // bs, last) if b not in self._fresh]
        if copies or end > have * bs:
            new = range(have, self._n_blocks(end))
            self._add_blocks([*copies, *new], [(self, b) for b in copies] + [None] * len(new))
        for field, rows in data.items():
            self._columns[field].write(pos, rows)
        self._record(pos, n, keys)
        if end > self._length:
            self._length = end
        self._dirty = True

    def _commit(self, work: Callable[[sqlite3.Connection], None] | None = None) -> None:
        """Commit the in-memory state in one transaction, then delete unused block files.

        ``work(conn)`` runs first inside the transaction. On failure, the
        uncommitted state is dropped (:meth:`_discard`).
        """
        meta = self._meta
        cut = self._n_blocks(self._length)
        fresh = sorted(self._fresh)

        def run(conn: sqlite3.Connection) -> None:
            if work is not None:
                work(conn)
            self._mirror(conn)

        try:
            dropped = meta.commit(
                self._length,
                {f: [(b, c.file(b)) for b in fresh] for f, c in self._columns.items()},
                cut if cut < self._n_blocks(meta.length) else None,
                run,
            )
        except BaseException:
            self._discard()
            raise
        self._fresh.clear()
        self._dirty = False
        self._forget_mirror()
        meta.release(dropped, self._directories())

    def _discard(self) -> None:
        """Go back to the last commit: drop the rows written since and their new files."""
        gone = self._fresh_files(self._fresh)
        for column in self._columns.values():
            column.forget(self._fresh)
        self._fresh.clear()
        self._length = self._meta.length
        self._pos = min(self._pos, self._length)
        self._dirty = False
        self._forget_mirror()
        self._meta.release(gone, self._directories())

    def _truncate_at(self, length: int) -> None:
        """Drop rows ``length ...`` and commit, then delete the unused block files."""
        cut = self._n_blocks(length)
        gone = [b for b in self._fresh if b >= cut]
        self._meta.release(self._fresh_files(gone), self._directories())
        self._fresh.difference_update(gone)
        for column in self._columns.values():
            column.forget(range(cut, self._n_blocks(self._length)))
        self._length = length
        self._commit()

    def _check_block_size(self, other: Any, maintain_order: bool) -> None:
        """tensorblob's rule: without ``maintain_order`` whole blocks move, so sizes must match.

        Checked (as tensorblob does) after the writable check and the seek to
        the end, before anything else, even when ``other`` is empty.
        """
        if not maintain_order and getattr(other, "block_size", None) != self.block_size:
            raise StorageValueError(
                f"Block sizes must match to extend {self.noun}s in non-order-preserving mode!"
            )

    def _extend(
        self,
        other: Any,
        maintain_order: bool,
        fetch: Callable[[int, int], Chunk],
        work: Callable[[sqlite3.Connection], None] | None = None,
    ) -> None:
        """Append a compatible, non-empty ``other`` and commit; the position ends at the end.

        ``other``'s full block files are copied whole when it is of this class
        with the same block size and either ``maintain_order`` is off or this
        storage ends on a block boundary (:meth:`_extend_blocks`, ``work`` in
        its commit); otherwise its rows come through ``fetch``, in order.
        """
        if (
            isinstance(other, type(self))
            and other.block_size == self.block_size
            and (not maintain_order or len(self) % self.block_size == 0)
        ):
            self._extend_blocks(other, work)
        else:
            self._extend_rows(other, fetch)
        self.seek(0, io.SEEK_END)

    def _extend_rows(self, other: Any, fetch: Callable[[int, int], Chunk]) -> None:
        """Append ``other``'s rows in order, a few MB at a time, then commit (all or nothing)."""
        start_len, total = len(self), len(other)
        row_bytes = sum(c.row_bytes for c in self._columns.values()) or 1
        step = max(1, _CHUNK_BYTES // row_bytes)
        try:
            for start in range(0, total, step):
                stop = min(start + step, total)
                first, data, keys = fetch(start, stop)
                rows = {f: self._columns[f].as_rows(t) for f, t in data.items()}
                self._write_rows(start_len + first, stop - start, rows, keys)
        except BaseException:
            self._discard()
            raise
        self._commit()

    def _extend_blocks(
        self, other: Storage, work: Callable[[sqlite3.Connection], None] | None = None
    ) -> None:
        """Append ``other`` (same block size) by copying its full block files, then commit.

        ``self``'s partial last block and ``other``'s partial last block are
        combined into new blocks after ``other``'s full blocks; with a full
        last block this keeps the row order. ``work(conn)`` runs in the
        commit (TensorDB: moves the SQL rows to match).
        """
        bs = self.block_size
        length, other_length = len(self), len(other)
        full, other_full = length // bs, other_length // bs
        tails = {
            name: torch.cat(
                [
                    column.read(full * bs, length),
                    other._columns[name].read(other_full * bs, other_length),
                ]
            )
            for name, column in self._columns.items()
        }
        tail_blocks = self._n_blocks(length - full * bs + other_length - other_full * bs)
        try:
            self._add_blocks(
                range(full, full + other_full + tail_blocks),
                [(other, b) for b in range(other_full)] + [None] * tail_blocks,
            )
            self._length = length + other_length
            for name, column in self._columns.items():
                if tail_blocks:
                    column.write((full + other_full) * bs, column.as_rows(tails[name]))
        except BaseException:
            self._discard()
            raise
        self._commit(work)


def _check_field(spec: FieldSpec) -> FieldSpec:
    """A field read from tensorblob's JSON, with its dtype and shape checked and normalized."""
    return dataclasses.replace(spec, dtype=parse_dtype(spec.dtype), shape=parse_shape(spec.shape))


def _is_integer(value: torch.Tensor | np.ndarray) -> bool:
    if isinstance(value, torch.Tensor):
        return not (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool)
    return bool(np.issubdtype(value.dtype, np.integer))


def _positions(idx: Any, n: int) -> torch.Tensor:
    """A batch index (list, tuple, 1-D tensor or array of ints) as in-range int64 positions."""
    if isinstance(idx, np.ndarray):
        if idx.size and not np.issubdtype(idx.dtype, np.integer):
            raise StorageTypeError(
                f"Batch index must have an integer dtype, got dtype {idx.dtype}!"
            )
        positions = torch.from_numpy(np.asarray(idx, dtype=np.int64))
    else:
        try:
            positions = torch.as_tensor(idx)
        except (RuntimeError, TypeError):
            raise StorageTypeError(
                f"Index must be int, slice, or a sequence of int, got {idx!r}"
            ) from None
        if positions.numel() and not _is_integer(positions):
            got = (
                f"dtype {idx.dtype}"
                if isinstance(idx, torch.Tensor)
                else f"elements of type {type(idx[0]).__name__!r}"
            )
            raise StorageTypeError(f"Batch index must have an integer dtype, got {got}!")
    if positions.ndim != 1:
        raise StorageValueError(f"Batch index must be 1-dimensional, got {positions.ndim}!")
    positions = positions.to(torch.int64)
    if not positions.numel():
        return positions
    positions = torch.where(positions < 0, positions + n, positions)
    if bool(((positions < 0) | (positions >= n)).any()):
        raise IndexError(f"Index out of bounds (length: {n})")
    return positions
