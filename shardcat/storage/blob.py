"""TensorBlob: tensorblob's API, with the metadata in SQLite."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from shardcat.errors import StorageTypeError, StorageValueError
from shardcat.storage.base import Storage
from shardcat.storage.column import parse_dtype, parse_shape
from shardcat.storage.meta import BLOB_FIELD, FieldSpec, Layout, Metadata

__all__ = ["TensorBlob"]

_FIELDS = (BLOB_FIELD,)


class TensorBlob(Storage):
    """A growable, memory-mapped sequence of same-shaped tensors with a file-like API.

    A drop-in for ``tensorblob.TensorBlob``: the same ``open`` arguments,
    modes, methods and errors. The directory holds block files of
    ``block_size`` rows (tensordict ``MemoryMappedTensor`` files) and
    ``.shardcat.sqlite``, where the row count and the block list commit
    together, when tensorblob saves its ``.stat``: at :meth:`flush`,
    :meth:`close` (and the end of a ``with`` block), :meth:`truncate` and
    :meth:`extend`, each one transaction. ``write`` only fills blocks: this
    object reads its writes at once, other processes see them after the
    commit, and a killed writer leaves exactly the rows of its last commit
    (overwritten rows too: they are written to copies of their blocks). One
    writer at a time: a second open for writing raises ``StorageBusyError`` (a ``BlockingIOError``).
    A directory written by the tensorblob package (``.conf``/``.stat``) is read
    where it is by mode ``r`` (nothing in it changes), and converted in place by
    a write mode, with a warning (its block files are kept as they are; the
    tensorblob package can no longer open it).
    """

    kind = "blob"
    noun = "blob"

    def __init__(
        self, path: Path, mode: str, meta: Metadata, max_cached_blocks: int | None
    ) -> None:
        super().__init__(path, mode, meta, max_cached_blocks)
        self._data = self._columns[BLOB_FIELD]
        self.dtype: str = self._data.dtype_name
        self.shape: tuple[int, ...] = self._data.shape

    @classmethod
    def open(
        cls,
        filename: str | os.PathLike[str],
        mode: str = "r",
        *,
        dtype: str | torch.dtype | None = None,
        shape: int | tuple[int, ...] | None = None,
        block_size: int = 8192,
        max_cached_blocks: int | None = None,
    ) -> TensorBlob:
        """Open (or create) the blob directory ``filename``.

        Modes as tensorblob (and ``open()``): ``r`` read; ``w`` create or
        truncate (an existing blob keeps its dtype, shape and block size);
        ``a`` append (writes always go to the end); ``r+``, ``w+``, ``a+`` read
        and write. ``dtype`` (a ``torch.dtype`` or its name) and ``shape`` (an
        int or a tuple: the shape of one row) are required to create a blob
        and ignored otherwise. ``max_cached_blocks`` bounds how many blocks
        are mapped at once (default: 1/16 of ``vm.max_map_count``).

        Raises ``FileNotFoundError`` (``r``/``a`` modes, no blob),
        ``ValueError`` (bad mode, no dtype/shape for a new blob) and
        ``TypeError`` (dtype neither str nor ``torch.dtype``).
        """

        def layout() -> Layout:
            if dtype is None or shape is None:
                raise StorageValueError(
                    "Arguments ``dtype`` and ``shape`` are required for new blob; "
                    f"got: {dtype!r} and {shape!r}"
                )
            if not isinstance(block_size, int) or block_size < 1:
                raise StorageValueError(f"block_size must be a positive int, got {block_size!r}")
            spec = FieldSpec(BLOB_FIELD, parse_dtype(dtype), parse_shape(shape), ".")
            return Layout("blob", block_size, (spec,))

        return cls._open(filename, mode, max_cached_blocks, layout)

    @classmethod
    def unlink(cls, filename: str | os.PathLike[str]) -> bool:
        """Delete a blob directory; True when it is gone (warns and returns False if not)."""
        return cls._unlink(filename)

    # -- indexing ------------------------------------------------------------------------

    def __getitem__(self, idx: Any) -> torch.Tensor:
        """Copies of rows: ``blob[i]``, ``blob[a:b:step]``, ``blob[[i, j, ...]]``.

        Ints may be negative (``IndexError`` out of range), slices take any
        step, and a list/tuple/1-D tensor/array of ints gathers rows in its
        order (repeats and negative positions allowed).
        """
        if type(idx) is int and not self._closed:  # the single-row hot path
            n = self._length
            i = idx + n if idx < 0 else idx
            if not 0 <= i < n:
                raise IndexError(f"Index out of bounds: {idx!r} (length: {n})")
            return self._data.row(i)
        return self._select(idx, _FIELDS)[BLOB_FIELD]

    def __iter__(self) -> Iterator[torch.Tensor]:
        """Rows from the current position to the end (the position follows)."""
        self._check_closed()
        for row in self._iter_rows(_FIELDS):
            yield row[BLOB_FIELD]

    @property
    def mapped_blocks(self) -> int:
        """How many block files are mapped right now (at most ``max_cached_blocks``)."""
        return self._data.mapped_blocks

    # -- file-like -------------------------------------------------------------------------

    def read(self, size: int | None = None) -> torch.Tensor:
        """Up to ``size`` rows (all when None) from the current position, which moves past them."""
        return self._read_at_position(size, _FIELDS)[BLOB_FIELD]

    def write(self, ts: torch.Tensor) -> int:
        """Write rows at the current position (the end in append modes); returns how many.

        ``ts`` is rows in C order, reshaped as tensorblob's
        ``ts.view(-1, *shape)``: one row, a batch (leading dims), or any
        tensor of whole rows (12 elements are 2 rows of shape ``(2, 3)``).
        Other element counts raise ``ValueError`` (also a ``RuntimeError``, as
        torch's in tensorblob), a dtype mismatch ``TypeError``: nothing is
        cast. The rows are committed at the next :meth:`flush`,
        :meth:`close`, :meth:`truncate` or :meth:`extend`.
        """
        self._check_writable()
        rows = self._data.as_rows(ts)
        if self._append:
            self._pos = self._length
        n = len(rows)
        if n:
            pos = self._pos
            self._write_rows(pos, n, {BLOB_FIELD: rows}, None)
            self._pos = pos + n
        return n

    def extend(self, other: Any, maintain_order: bool = False) -> None:
        """Append all rows of ``other`` (a blob of the same dtype and shape) and commit.

        As in tensorblob, ``maintain_order=False`` (the default) moves whole
        blocks and needs the same block size (else ``ValueError``, after the
        position moved to the end): ``other``'s full block files are copied
        and this blob's last partial block moves after them. With
        ``maintain_order`` the rows keep their order, any block sizes; block
        files are still copied whole where the blob ends on a block boundary,
        rows otherwise, a few MB at a time. ``other`` may also be a
        ``tensorblob.TensorBlob``. Unflushed writes are committed first; the
        extension is a second commit, all or nothing.
        """
        other_dtype, other_shape = getattr(other, "dtype", None), getattr(other, "shape", None)
        if other_dtype is None or other_shape is None:
            raise StorageTypeError(f"cannot extend a blob with {type(other).__name__!r}")
        if self.dtype != parse_dtype(other_dtype) or self.shape != tuple(other_shape):
            raise StorageValueError("Blob data types and shapes must match to extend blobs!")
        self.flush()
        self.seek(0, io.SEEK_END)
        self._check_block_size(other, maintain_order)
        if len(other) == 0:
            return

        def fetch(start: int, stop: int) -> tuple[int, dict[str, torch.Tensor], None]:
            return start, {BLOB_FIELD: other[start:stop]}, None

        self._extend(other, maintain_order, fetch)
