"""Parquet: one record per row, located by its row group and its row within it.

A Parquet file is ``PAR1``, the column chunks of its row groups, and a footer
(Thrift ``FileMetaData``, its little-endian ``uint32`` length, ``PAR1``) that
says where every column chunk lives. To decode one row a reader needs the
column chunks of its row group and the footer, nothing else, so a row's
:class:`~shardcat.formats.base.Location` is:

- ``offset``/``length``: the span of its row group (first column chunk to
  the end of the last; a row group's chunks are contiguous);
- ``extents``: the byte ranges to read, ``((row group), (footer))`` -- the
  footer range runs to the end of the file, magic included;
- ``item``: the row's index within its row group.

:meth:`ParquetFormat.read` fetches exactly those ranges through
``source.pread`` and returns a small container (see :func:`_pack`): a header
naming the file, the row group offset, the row and the ranges, then the
ranges' bytes. :meth:`ParquetFormat.decode` serves those bytes to pyarrow as
a sparse file (:class:`_SparseFile`: the ranges at their offsets, zeros
elsewhere) and returns the row as ``{column: value}``.

Keys: the value of the key column (option ``key``, default ``"key"``; a
string or integer column), or positions with ``key=None``. Scalar columns
(integers, floats, booleans, strings of at most ``MAX_TEXT_FIELD`` bytes)
become SQL fields; ``fields=False`` turns that off.

Checksums: pyarrow writes page CRCs when asked (``write_page_checksum=True``).
The scan decodes every row group with page checksum verification (a file
written without CRCs is checked for framing only), ``read(verify=True)``
does the same for the record's row group; damage is a
:class:`~shardcat.errors.CorruptRecordError` with the file and the row
group's offset. A page's CRC covers its data, not its Thrift header: a
damaged header is found when it no longer parses or disagrees with the
footer, a changed statistic in it is not found at all.

Parquet compresses its pages itself: ``STREAMS`` is False, and a gzip/bz2/xz
compressed Parquet file is a :class:`~shardcat.errors.CatalogError`.

pyarrow is imported on first use (``pip install 'shardcat[parquet]'``): without
it this module imports, ``sniff`` works, and ``scan``/``read``/``decode`` raise
:class:`~shardcat.errors.CatalogError` with that hint. The format is
registered through the ``shardcat.formats`` entry point, like a third-party
format.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from shardcat.errors import CatalogError, CorruptRecordError, ShardcatError
from shardcat.formats.base import Entry, Format, Location, Scalar, float32_shortest
from shardcat.sources.compressed import detect_compression

if TYPE_CHECKING:
    from shardcat.sources.rawio import Source

__all__ = ["INSTALL_HINT", "ParquetFormat"]

MAGIC = b"PAR1"
INSTALL_HINT = "pip install 'shardcat[parquet]'"
MAX_TEXT_FIELD = 256
_TAIL = struct.Struct("<I4s")  # footer length, magic
_HEAD = struct.Struct("<4sBIIQH")  # magic, version, item, ranges, row group offset, path length
_ITEM_AT = 5  # where the row number is in the header
_RANGE = struct.Struct("<QQ")
_CONTAINER = b"SCPQ"
_VERSION = 1
_FLAG_VERIFY = 0x80


def _pyarrow() -> Any:
    """``pyarrow.parquet`` (imported on first use), or the install hint."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise CatalogError(f"the parquet format needs pyarrow: {INSTALL_HINT}") from None
    return pq


def _said(exc: BaseException) -> str:
    """pyarrow's message on one line."""
    return " ".join(str(exc).split())


def _arrow_errors() -> tuple[type[BaseException], ...]:
    """What pyarrow raises for bytes it cannot decode."""
    import pyarrow as pa

    return (pa.ArrowException, OSError, ValueError, IndexError, EOFError)


class _SparseFile:
    """A read-only file of ``size`` bytes holding ``ranges`` (``(offset, bytes)``)
    at their offsets and zeros elsewhere: what pyarrow sees of a shard when only
    one row group and the footer were read."""

    def __init__(self, size: int, ranges: Sequence[tuple[int, bytes]]) -> None:
        self.size = size
        self.ranges = sorted(ranges)
        self.pos = 0
        self.closed = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def read(self, n: int = -1) -> bytes:
        start = self.pos
        end = self.size if n is None or n < 0 else min(self.size, start + n)
        if end <= start:
            return b""
        out = bytearray(end - start)
        for at, data in self.ranges:
            lo, hi = max(start, at), min(end, at + len(data))
            if lo < hi:
                out[lo - start : hi - start] = data[lo - at : hi - at]
        self.pos = end
        return bytes(out)

    def close(self) -> None:
        self.closed = True


def _pread(source: Source, path: str, offset: int, at: int, length: int) -> bytes:
    """``source.pread(length, at)``; a range no read can serve (negative, or a
    length of 2**63 from a damaged catalog) is a :class:`CorruptRecordError` at the
    record's ``offset``. The result may be short."""
    if at < 0 or length < 0:
        raise CorruptRecordError(path, offset, f"cannot read {length} bytes at byte {at}")
    try:
        return source.pread(length, at)
    except ShardcatError:
        raise
    except (OverflowError, MemoryError, ValueError) as exc:
        raise CorruptRecordError(
            path, offset, f"cannot read {length} bytes at byte {at} ({type(exc).__name__})"
        ) from None


def _span(row_group: Any) -> tuple[int, int]:
    """``(offset, length)`` of a row group's column chunks (contiguous in files
    written by pyarrow and parquet-mr; the span covers them all in any case)."""
    start, end = None, 0
    for j in range(row_group.num_columns):
        chunk = row_group.column(j)
        first = chunk.dictionary_page_offset if chunk.has_dictionary_page else None
        first = chunk.data_page_offset if first is None else min(first, chunk.data_page_offset)
        start = first if start is None else min(start, first)
        end = max(end, first + chunk.total_compressed_size)
    if start is None:
        return 0, 0
    return start, end - start


def _footer(path: str, f: Any, size: int) -> tuple[int, int]:
    """``(offset, length)`` of the footer of the Parquet file ``f`` (of ``size``
    bytes), magic and length included; framing checked."""
    if size < 12:
        raise CorruptRecordError(path, 0, f"not a Parquet file: {size} bytes")
    f.seek(0)
    if f.read(4) != MAGIC:
        raise CorruptRecordError(path, 0, "not a Parquet file: no PAR1 magic at its start")
    f.seek(size - _TAIL.size)
    length, magic = _TAIL.unpack(f.read(_TAIL.size))
    at = size - _TAIL.size
    if magic == b"PARE":
        raise CatalogError(f"{path}: encrypted Parquet files are not supported")
    if magic != MAGIC:
        raise CorruptRecordError(
            path, at, "no Parquet footer at the end of the file (truncated or damaged)"
        )
    if length > size - 12:
        raise CorruptRecordError(
            path, at, f"footer length {length} runs past the start of the file (damaged)"
        )
    return size - _TAIL.size - length, length + _TAIL.size


def _scalar(value: Any, kind: str) -> Scalar | None:
    if value is None:
        return None
    if kind == "bool":
        return int(value)
    if kind == "float32":
        return float32_shortest(float(value))
    if kind == "text":
        return value if len(value.encode("utf-8")) <= MAX_TEXT_FIELD else None
    return value  # type: ignore[no-any-return]


def _kinds(schema: Any, skip: str | None) -> dict[str, str]:
    """Column name -> how its values become SQL fields, for the scalar columns."""
    import pyarrow as pa

    out = {}
    for column in schema:
        if column.name == skip:
            continue
        t = column.type
        if pa.types.is_boolean(t):
            out[column.name] = "bool"
        elif pa.types.is_integer(t):
            out[column.name] = "int"
        elif pa.types.is_float32(t) or pa.types.is_float16(t):
            out[column.name] = "float32"
        elif pa.types.is_floating(t):
            out[column.name] = "float"
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            out[column.name] = "text"
    return out


def _key_column(path: str, schema: Any, key: str) -> None:
    import pyarrow as pa

    names = schema.names
    if key not in names:
        raise CatalogError(
            f"{path}: no key column {key!r} (columns: {', '.join(names)}); "
            "pass key= one of them, or key=None to key by position"
        )
    t = schema.field(key).type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)):
        raise CatalogError(f"{path}: key column {key!r} is {t}; it must hold strings or integers")


def _pack(
    path: str, location: Location, ranges: Sequence[tuple[int, bytes]], verify: bool
) -> bytes:
    """The container :meth:`ParquetFormat.read` returns: a header (magic, version
    with the verify flag, row, number of ranges, row group offset, the file's
    name), each range's ``(offset, length)``, then the ranges' bytes."""
    name = path.encode("utf-8", "surrogateescape")[:0xFFFF]
    item = location.item or 0
    version = _VERSION | (_FLAG_VERIFY if verify else 0)
    head = _HEAD.pack(_CONTAINER, version, item, len(ranges), location.offset, len(name))
    table = b"".join(_RANGE.pack(at, len(data)) for at, data in ranges)
    return b"".join([head, name, table, *(data for _, data in ranges)])


def _unpack(raw: bytes) -> tuple[str, int, int, bool, list[tuple[int, bytes]]]:
    """``(path, row group offset, row, verify, ranges)`` of a container."""
    view = memoryview(raw)
    try:
        magic, version, item, n, offset, name_length = _HEAD.unpack_from(view, 0)
    except struct.error:
        raise CorruptRecordError("", 0, "not a Parquet record container (too short)") from None
    if magic != _CONTAINER or version & ~_FLAG_VERIFY != _VERSION:
        raise CorruptRecordError("", 0, "not a Parquet record container")
    pos = _HEAD.size
    path = bytes(view[pos : pos + name_length]).decode("utf-8", "surrogateescape")
    pos += name_length
    table = [_RANGE.unpack_from(view, pos + i * _RANGE.size) for i in range(n)]
    pos += n * _RANGE.size
    ranges = []
    for at, length in table:
        data = bytes(view[pos : pos + length])
        if len(data) != length:
            raise CorruptRecordError(path, offset, "Parquet record container is truncated")
        ranges.append((at, data))
        pos += length
    return path, offset, item, bool(version & _FLAG_VERIFY), ranges


class ParquetFormat(Format):
    """Parquet files, one record per row (see the module docstring)."""

    NAME = "parquet"
    TITLE = "Parquet"
    EXTENSIONS = (".parquet", ".pq")
    PARTS = False
    OWN_BYTES = False  # a raw record is its row group's bytes and its row's index
    STREAMS = False

    def __init__(self) -> None:
        # the last row group decoded: (its container without the row number, table).
        # Rows of one row group come in runs (get_many, positions, verify): each is
        # read again (its location says so) but decoded once. Bytes are compared,
        # so a changed file never gets another version's rows.
        self._last: tuple[bytes, Any] | None = None

    def sniff(self, head: bytes) -> bool:
        return head[:4] == MAGIC

    def key_rule(self, options: Mapping[str, Any]) -> str:
        key = options.get("key", "key")
        return "position" if key is None else f"column:{key}"

    def scan(self, path: str, options: Mapping[str, Any]) -> Iterator[Entry]:
        """One :class:`Entry` per row, row group by row group. Every row group is
        decoded (page checksums verified where the file has them)."""
        compression = detect_compression(path)
        if compression is not None:
            raise CatalogError(
                f"{path}: a {compression}-compressed Parquet file cannot be indexed "
                "(Parquet compresses its pages itself); decompress it"
            )
        pq = _pyarrow()
        errors = _arrow_errors()
        key: str | None = options.get("key", "key")
        want_fields: bool = options.get("fields", True)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            footer = _footer(path, f, size)
            try:
                pf = pq.ParquetFile(f, page_checksum_verification=True)
                meta = pf.metadata
                groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
                schema = pf.schema_arrow
            except ShardcatError:
                raise
            except errors as exc:
                raise CorruptRecordError(
                    path, footer[0], f"bad Parquet footer: {_said(exc)}"
                ) from None
            if key is not None:
                _key_column(path, schema, key)
            kinds = _kinds(schema, key) if want_fields else {}
            for index, group in enumerate(groups):
                offset, length = _span(group)
                if offset < 4 or offset + length > footer[0]:
                    raise CorruptRecordError(
                        path, offset, f"row group {index} lies outside the file's data"
                    )
                try:
                    table = pf.read_row_group(index, use_threads=False)
                except errors as exc:
                    raise CorruptRecordError(
                        path, offset, f"row group {index} cannot be decoded: {_said(exc)}"
                    ) from None
                if table.num_rows != group.num_rows:
                    raise CorruptRecordError(
                        path,
                        offset,
                        f"row group {index}: {table.num_rows} rows decoded, "
                        f"the footer says {group.num_rows}",
                    )
                extents = ((offset, length), footer)
                keys = table.column(key).to_pylist() if key is not None else None
                columns = {name: table.column(name).to_pylist() for name in kinds}
                for row in range(table.num_rows):
                    fields: dict[str, Scalar] = {}
                    for name, kind in kinds.items():
                        value = _scalar(columns[name][row], kind)
                        if value is not None:
                            fields[name] = value
                    entry_key = None
                    if keys is not None:
                        if keys[row] is None:
                            raise CorruptRecordError(
                                path, offset, f"row {row} of row group {index} has no key"
                            )
                        entry_key = str(keys[row])
                    yield Entry(entry_key, offset, length, fields, extents=extents, item=row)

    def read(self, source: Source, location: Location, verify: bool = False) -> bytes:
        """The row group's bytes and the footer (a container :meth:`decode` takes);
        with ``verify``, the row group is decoded with its page checksums checked."""
        _pyarrow()  # decode needs it: say so before any read
        path = str(getattr(source, "path", "") or "")
        if location.extents is None or location.item is None:
            raise CorruptRecordError(
                path, location.offset, "a Parquet location needs its extents and row"
            )
        ranges = []
        for at, length in location.extents:
            data = _pread(source, path, location.offset, at, length)
            if len(data) != length:
                raise CorruptRecordError(
                    path,
                    location.offset,
                    f"truncated: {len(data)} of {length} bytes at byte {at}",
                )
            ranges.append((at, data))
        raw = _pack(path, location, ranges, verify)
        if verify:
            self._row(raw)
        return raw

    def decode(self, raw: Any, options: Mapping[str, Any]) -> dict[str, Any]:
        """The row as ``{column: value}``."""
        return self._row(bytes(raw))

    def _row(self, raw: bytes) -> dict[str, Any]:
        pq = _pyarrow()
        errors = _arrow_errors()
        path, offset, item, verify, ranges = _unpack(raw)
        if not ranges:
            raise CorruptRecordError(path, offset, "a Parquet record needs its footer")
        group = raw[:_ITEM_AT] + raw[_ITEM_AT + 4 :]
        last = self._last
        try:
            if last is not None and last[0] == group:
                table = last[1]
            else:
                table = self._row_group(pq, path, offset, verify, ranges)
                self._last = (group, table)
            if not 0 <= item < table.num_rows:
                raise CorruptRecordError(
                    path, offset, f"row {item} is not in the row group of {table.num_rows} rows"
                )
            row: dict[str, Any] = table.slice(item, 1).to_pylist()[0]
        except ShardcatError:
            raise
        except errors as exc:
            raise CorruptRecordError(
                path, offset, f"cannot decode the row group: {_said(exc)}"
            ) from None
        return row

    @staticmethod
    def _row_group(
        pq: Any, path: str, offset: int, verify: bool, ranges: Sequence[tuple[int, bytes]]
    ) -> Any:
        """The row group at ``offset`` decoded from the ranges read (a pyarrow Table)."""
        footer_at, footer = ranges[-1]
        pf = pq.ParquetFile(
            _SparseFile(footer_at + len(footer), ranges), page_checksum_verification=verify
        )
        meta = pf.metadata
        for index in range(meta.num_row_groups):
            if _span(meta.row_group(index))[0] == offset:
                return pf.read_row_group(index, use_threads=False)
        raise CorruptRecordError(path, offset, "no row group at this offset (stale shard?)")

    def feature_list(self, record: Any, name: str) -> Sequence[Any] | None:
        """``[value]`` (a list column: its values), None for a missing column or a null."""
        if name not in record:
            return None
        value = record[name]
        if value is None:
            return None
        return list(value) if isinstance(value, list) else [value]

    def features(self, record: Any) -> dict[str, list[Any]]:
        return {
            name: [] if value is None else list(value) if isinstance(value, list) else [value]
            for name, value in record.items()
        }

    def describe(self, record: Any) -> dict[str, str]:
        return {name: type(value).__name__ for name, value in sorted(record.items())}
