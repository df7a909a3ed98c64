"""One field's rows in fixed-size memory-mapped block files, with an LRU of mappings;
the checks of a field's dtype and shape, and of a TensorDB schema."""

from __future__ import annotations

import functools
import math
import operator
import os
import shutil
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

try:
    import numpy as np
    import torch
    from tensordict import MemoryMappedTensor
except ImportError as exc:  # pragma: no cover - exercised without torch installed
    raise ImportError(
        "shardcat's TensorBlob and TensorDB need torch and tensordict: "
        "pip install 'shardcat[torch]'"
    ) from exc

from shardcat.errors import StorageShapeError, StorageTypeError, StorageValueError
from shardcat.storage.meta import FieldSpec, Layout, Metadata

__all__ = [
    "DTYPES",
    "BlockColumn",
    "db_layout",
    "default_max_cached_blocks",
    "parse_dtype",
    "parse_shape",
]

# Every dtype tensordict memory-maps and this module's tests cover.
DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_COPY_CHUNK = 1 << 30  # bytes per copy_file_range call
PWRITE_BYTES = 1 << 16  # pieces of a write at least this large go through os.pwrite


def parse_dtype(dtype: Any) -> str:
    """The canonical name of a dtype given as ``torch.float32``, ``"float32"`` or ``"float"``."""
    if isinstance(dtype, str):
        found = getattr(torch, dtype, None)
        if not isinstance(found, torch.dtype):
            raise StorageValueError(f"unknown dtype {dtype!r}; supported: {', '.join(DTYPES)}")
        dtype = found
    elif not isinstance(dtype, torch.dtype):
        raise StorageTypeError(f"dtype must be str or torch.dtype, got {type(dtype).__name__!r}")
    name = str(dtype).rpartition(".")[2]
    if name not in DTYPES:
        raise StorageValueError(f"dtype {name} cannot be stored; supported: {', '.join(DTYPES)}")
    return name


def parse_shape(shape: Any) -> tuple[int, ...]:
    """A row shape given as an int or a sequence of ints (``()`` for scalar rows)."""
    try:
        dims = (
            (operator.index(shape),)
            if not hasattr(shape, "__iter__")
            else tuple(operator.index(d) for d in shape)
        )
    except TypeError:
        raise StorageValueError(
            f"shape must be an int or a sequence of ints, got {shape!r}"
        ) from None
    if not all(d > 0 for d in dims):
        raise StorageValueError(f"shape must have positive dimensions, got {shape!r}")
    return dims


_RESERVED = {"position", "key", "rowid", "oid", "_rowid_"}
_SQL_OPTIONS = {"filter", "index"}


def _field_spec(name: Any, spec: Any) -> FieldSpec:
    """One TensorDB schema entry ``name: (dtype, shape[, options])``, checked."""
    if (
        not isinstance(name, str)
        or not name
        or name.startswith(".")
        or "/" in name
        or os.sep in name
        or (os.altsep and os.altsep in name)
        or "\0" in name
    ):
        raise StorageValueError(f"Invalid field name: {name!r}")
    if not isinstance(spec, (tuple, list)) or len(spec) not in (2, 3):
        raise StorageValueError(
            f"field {name!r}: expected (dtype, shape) or (dtype, shape, options)"
        )
    dtype, shape = parse_dtype(spec[0]), parse_shape(spec[1])
    options = dict(spec[2]) if len(spec) == 3 else {}
    unknown = set(options) - _SQL_OPTIONS
    if unknown:
        raise StorageValueError(
            f"field {name!r}: unknown options {sorted(unknown)}; use 'filter' or 'index'"
        )
    sql = "index" if options.get("index") else "filter" if options.get("filter") else None
    if sql is not None:
        if shape not in ((), (1,)):
            raise StorageValueError(
                f"field {name!r} has rows of shape {shape}: only fields with one value "
                "per row (shape () or (1,)) can be filtered with SQL"
            )
        if name.lower() in _RESERVED:
            raise StorageValueError(
                f"field {name!r} cannot be filterable: the name is taken in SQL"
            )
    return FieldSpec(name, dtype, shape, name, sql)


def db_layout(schema: Any, block_size: int) -> Layout:
    """The layout of a new TensorDB from ``TensorDB.open``'s ``schema`` and ``block_size``."""
    if schema is None:
        raise StorageValueError("Argument ``schema`` is required for new database!")
    if not isinstance(schema, Mapping) or not schema:
        raise StorageValueError(
            "Schema must be a non-empty dict mapping field names to (dtype, shape)!"
        )
    if not isinstance(block_size, int) or block_size < 1:
        raise StorageValueError(f"block_size must be a positive int, got {block_size!r}")
    fields = tuple(_field_spec(name, spec) for name, spec in schema.items())
    lowered = [f.name.lower() for f in fields if f.sql]
    if len(set(lowered)) != len(lowered):
        raise StorageValueError("filterable field names must differ in more than letter case")
    return Layout("db", block_size, fields)


@functools.cache
def default_max_cached_blocks() -> int:
    """1/16 of the kernel's per-process mapping limit (``vm.max_map_count``), at least 128.

    The rest stays for everything else the process maps (libraries, torch,
    other storages); ~4,000 with Linux's default limit of 65,530.
    """
    limit = 65530
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read().strip())
    except (OSError, ValueError):
        pass
    return max(limit // 16, 128)


def _create_block_file(path: Path, nbytes: int) -> None:
    """A block file of ``nbytes`` zero bytes (sparse: no data written)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        os.ftruncate(fd, nbytes)
    finally:
        os.close(fd)


def _copy_file(src: Path, dst: Path) -> None:
    """Copy a block file; in the kernel (and as a reflink where the filesystem can)."""
    copy_range = getattr(os, "copy_file_range", None)
    if copy_range is None:  # pragma: no cover - not Linux
        shutil.copyfile(src, dst)
        return
    with open(src, "rb") as fin, open(dst, "xb") as fout:
        remaining = os.fstat(fin.fileno()).st_size
        os.ftruncate(fout.fileno(), remaining)
        offset = 0
        while remaining:
            try:
                size = min(remaining, _COPY_CHUNK)
                n = copy_range(fin.fileno(), fout.fileno(), size, offset, offset)
            except OSError:  # e.g. across filesystems on old kernels
                fout.seek(offset)
                fin.seek(offset)
                shutil.copyfileobj(fin, fout)
                return
            if n == 0:
                raise OSError(f"{src}: file shorter than expected while copying")
            offset += n
            remaining -= n


def _pwrite_all(path: Path, data: np.ndarray, offset: int) -> None:
    """Write the bytes of the contiguous array ``data`` at ``offset`` of the file ``path``."""
    view = np.ascontiguousarray(data).data.cast("B")
    fd = os.open(path, os.O_WRONLY)
    try:
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], offset + done)
    finally:
        os.close(fd)


def _byte_rows(rows: torch.Tensor) -> np.ndarray:
    """The bytes of a batch of rows as a ``(rows, row_bytes)`` uint8 array (a view if possible)."""
    return rows.reshape(len(rows), -1).contiguous().view(torch.uint8).numpy()


class BlockColumn:
    """The block files of one field, mapped on demand, at most ``cache_size`` at a time.

    Block ``b`` holds rows ``b * block_size ... (b + 1) * block_size - 1``.
    Reads return copies, never views of a mapping, so an evicted block is
    unmapped as soon as it leaves the cache.
    """

    def __init__(
        self,
        root: Path,
        spec: FieldSpec,
        block_size: int,
        meta: Metadata,
        cache_size: int,
        writable: bool,
        label: str,
    ) -> None:
        self.name = spec.name
        self.label = label
        self.dtype_name = parse_dtype(spec.dtype)
        self.dtype = DTYPES[self.dtype_name]
        self.shape = parse_shape(spec.shape)
        self.block_size = block_size
        self.directory = root / spec.directory
        self.meta = meta
        self.cache_size = cache_size
        self.writable = writable
        self.row_items = math.prod(self.shape)
        self.row_bytes = self.row_items * self.dtype.itemsize
        self._files: dict[int, str] = {}
        # block -> (the mapping as a tensor, the same bytes as a (rows, row_bytes) array)
        self._cache: OrderedDict[int, tuple[torch.Tensor, np.ndarray]] = OrderedDict()

    # -- blocks ----------------------------------------------------------------------

    @property
    def mapped_blocks(self) -> int:
        return len(self._cache)

    def file(self, b: int) -> str:
        name = self._files.get(b)
        if name is None:
            name = self._files[b] = self.meta.block_file(self.name, b)
        return name

    def path(self, b: int) -> Path:
        return self.directory / self.file(b)

    def _map(self, path: Path) -> tuple[torch.Tensor, np.ndarray]:
        mapped = MemoryMappedTensor.from_filename(
            os.fspath(path),
            dtype=self.dtype,
            shape=(self.block_size, *self.shape),
            mode="r+" if self.writable else "r",
        )
        # a plain tensor on the same storage: indexing skips the subclass dispatch
        tensor = mapped.as_subclass(torch.Tensor)
        return tensor, _byte_rows(tensor)

    def _mapping(self, b: int) -> tuple[torch.Tensor, np.ndarray]:
        cache = self._cache
        mapped = cache.get(b)
        if mapped is not None:
            cache.move_to_end(b)
            return mapped
        path = self.path(b)
        try:
            mapped = self._map(path)
        except RuntimeError:  # tensordict's error for a missing file, among others
            if path.exists():
                raise
            del self._files[b]  # a writer's commit replaced the block since it was looked up
            mapped = self._map(self.path(b))
        cache[b] = mapped
        if len(cache) > self.cache_size:
            cache.popitem(last=False)
        return mapped

    def block(self, b: int) -> torch.Tensor:
        """Block ``b`` mapped (through the LRU), as a ``(block_size, *shape)`` tensor."""
        return self._mapping(b)[0]

    def create_file(self, name: str, source: tuple[BlockColumn, int] | None) -> None:
        """A block file not yet part of the column: a copy of ``(column, block)``, or empty."""
        if source is None:
            _create_block_file(self.directory / name, self.block_size * self.row_bytes)
        else:
            _copy_file(source[0].path(source[1]), self.directory / name)

    def adopt(self, blocks: Mapping[int, str]) -> None:
        """Blocks ``b`` are now the files ``blocks[b]`` (not committed yet)."""
        for b, name in blocks.items():
            self._files[b] = name
            self._cache.pop(b, None)

    def forget(self, blocks: Iterable[int]) -> None:
        """Drop what is known and mapped of ``blocks`` (truncated or discarded)."""
        for b in blocks:
            self._files.pop(b, None)
            self._cache.pop(b, None)

    def clear(self) -> None:
        self._cache.clear()

    # -- rows --------------------------------------------------------------------------

    def empty(self, n: int) -> torch.Tensor:
        return torch.empty((n, *self.shape), dtype=self.dtype)

    def row(self, i: int) -> torch.Tensor:
        b, o = divmod(i, self.block_size)
        return self.block(b)[o].clone()

    def read(self, start: int, stop: int, step: int = 1) -> torch.Tensor:
        """Rows ``range(start, stop, step)``, ``step > 0``, as a new tensor."""
        count = len(range(start, stop, step))
        out = self.empty(count)
        bs, k, i = self.block_size, 0, start
        while k < count:
            b, o = divmod(i, bs)
            take = min((bs - 1 - o) // step + 1, count - k)
            if step == 1:
                out[k : k + take].copy_(self.block(b)[o : o + take])
            else:
                out[k : k + take].copy_(self.block(b)[o : o + (take - 1) * step + 1 : step])
            k += take
            i += take * step
        return out

    def gather(self, idx: torch.Tensor) -> torch.Tensor:
        """Rows at the (in-range, non-negative) int64 positions ``idx``, in that order."""
        bs = self.block_size
        blocks = torch.div(idx, bs, rounding_mode="floor")
        offsets = idx - blocks * bs
        if len(idx) == 0:
            return self.empty(0)
        first = int(blocks[0])
        if bool((blocks == first).all()):
            return self.block(first).index_select(0, offsets)
        # group by block (one index_select per block), then put rows back in order;
        # indices already grouped by block (e.g. sorted) skip the reordering copy
        grouped = bool((blocks[1:] >= blocks[:-1]).all())
        order = None if grouped else torch.argsort(blocks, stable=True)
        if order is not None:
            blocks, offsets = blocks[order], offsets[order]
        ids, counts = torch.unique_consecutive(blocks, return_counts=True)
        buf = self.empty(len(idx))
        lo = 0
        for b, c in zip(ids.tolist(), counts.tolist(), strict=True):
            torch.index_select(self.block(b), 0, offsets[lo : lo + c], out=buf[lo : lo + c])
            lo += c
        if order is None:
            return buf
        out = self.empty(len(idx))
        out.index_copy_(0, order, buf)
        return out

    def write(self, pos: int, source: np.ndarray) -> None:
        """Copy byte rows (from :meth:`as_rows`) into positions ``pos ...`` (their blocks exist).

        Pieces of at least :data:`PWRITE_BYTES` go through ``os.pwrite`` into
        the block file (the page cache fills them without first faulting in
        zero pages, about half the time of a copy into fresh mapped memory;
        mappings of the file see the bytes at once, the kernel keeps them
        coherent). Smaller ones, e.g. one row at a time, are a single-threaded
        byte copy into the mapped block, which costs less than a system call.
        """
        bs, n, k = self.block_size, len(source), 0
        while k < n:
            b, o = divmod(pos + k, bs)
            take = min(bs - o, n - k)
            piece = source[k : k + take]
            if piece.nbytes >= PWRITE_BYTES:
                _pwrite_all(self.path(b), piece, o * self.row_bytes)
            else:
                self._mapping(b)[1][o : o + take] = piece
            k += take

    def as_rows(self, value: Any) -> np.ndarray:
        """``value`` as ``(rows, row_bytes)`` bytes: tensorblob's ``value.view(-1, *shape)``.

        Any tensor whose element count is a multiple of a row's is a batch of
        rows in C order: one row, rows with leading batch dims, a flat tensor
        (12 elements are 2 rows of shape ``(2, 3)``). Any other count raises
        :class:`StorageShapeError` (a ``ValueError``, and the ``RuntimeError``
        torch raises in tensorblob), checked first; then a dtype mismatch
        raises :class:`StorageTypeError`: nothing is cast. The result is a
        view of ``value`` where its layout allows (numpy's reshape and view
        cost a fraction of torch's on the row-by-row path).
        """
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(value)
        if not isinstance(value, torch.Tensor):
            raise StorageTypeError(f"expected a torch.Tensor, got {type(value).__name__!r}")
        numel = value.numel()
        if numel % self.row_items:
            raise StorageShapeError(
                f"tensor of shape {tuple(value.shape)} holds {numel} elements, not whole rows "
                f"of shape {self.shape} for {self.label}"
            )
        if value.dtype != self.dtype:
            raise StorageTypeError(
                f"Tensor dtype {value.dtype} does not match blob dtype {self.dtype} "
                f"of {self.label} (no implicit casts: use .to({self.dtype}))"
            )
        if not value.is_cpu:
            value = value.cpu()
        if value.requires_grad:
            value = value.detach()
        if self.dtype == torch.bfloat16:  # numpy has no bfloat16: the same bytes as int16
            value = value.view(torch.int16)
        rows = value.numpy().reshape(-1, self.row_items)
        return np.ascontiguousarray(rows).view(np.uint8)
