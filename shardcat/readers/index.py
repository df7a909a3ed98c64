"""``reader.index``: tfd-utils' ``{key: location}`` index, read from the catalog.

tfd-utils loads its whole index into a dict; code and tests written for it
read ``reader.index`` (``len``, ``in``, ``index[key]``, iteration, ``items()``).
:class:`DatasetIndex` gives the same answers without ever holding the rows:

- ``index[key]``, ``key in index``, ``index.get(key)``: one indexed point query;
- ``len(index)``: the reader's count (its shard list already knows);
- iterating keys, ``items()`` and ``values()``: streamed in position order,
  shard by shard, one query per :data:`PAGE` records (tar: their members).

Values are what tfd-utils stores: for TFRecord (and RecordIO)
``{"file": path, "offset": frame offset, "length": payload length}``; for tar
``{feature: {"file": path, "member_name": name, "data_offset": offset,
"size": size}}`` (``member_name`` as the ``tfd`` grouping rebuilds it,
``<key>.<feature>``; offsets of compressed shards are decompressed offsets,
as tfd-utils' are). Files are paths as the reader was given them (relative
when given relative, as tfd-utils'), else absolute.

It is read-only: every method that would change it raises ``TypeError``. It
subclasses ``dict`` only because tfd-utils' own tests check
``isinstance(reader.index, dict)``; the dict itself stays empty, every answer
comes from the catalog, and copying it (``dict(index)``) is what loads every
row, on request. It follows the reader: the same snapshot and shard versions.
"""

from __future__ import annotations

from collections.abc import Callable, ItemsView, Iterator, KeysView, Mapping, Sequence, ValuesView
from typing import Any, NoReturn, Protocol

from shardcat.catalog import lookup
from shardcat.catalog.lookup import ReadConnection


class _Reader(Protocol):
    """What the index reads of its :class:`~shardcat.readers.reader.Reader`."""

    dataset: str
    _id: int
    _sql: lookup.RecordStatements
    _by_position: bool
    _parts: bool
    _deleted: frozenset[str]

    @property
    def _shards(self) -> Mapping[int, Any]: ...

    @property
    def _order(self) -> Sequence[Any]: ...

    def __len__(self) -> int: ...

    def contains_key(self, key: Any) -> bool: ...

    def _conn(self) -> ReadConnection: ...

    def _exclusively(self, function: Callable[..., Any], *args: Any) -> Any: ...

    def _position_of_key(self, key: str) -> int | None: ...

    def _row_at(self, conn: ReadConnection, position: int) -> tuple[Any, ...]: ...


__all__ = ["PAGE", "DatasetIndex"]

#: The most rows one query of an iteration reads.
PAGE = 10_000


def _read_only(*args: Any, **kwargs: Any) -> NoReturn:
    raise TypeError("reader.index is read-only: it is the catalog's index of the dataset")


class DatasetIndex(dict):  # type: ignore[type-arg]
    """A read-only mapping key -> location over one reader's dataset (see the
    module docstring). A ``collections.abc.Mapping`` (as every ``dict`` is),
    whose every method answers from the catalog."""

    __slots__ = ("_names", "_reader")

    def __init__(self, reader: _Reader, names: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self._reader = reader
        self._names = names or {}  # absolute shard path -> the path as given

    # -- Mapping -----------------------------------------------------------------

    def __getitem__(self, key: Any) -> Any:
        found = self._lookup(key) if isinstance(key, str) else None  # keys are str
        if found is None:
            raise KeyError(key)
        return found

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._reader.contains_key(key)

    def __len__(self) -> int:
        return len(self._reader)

    def __iter__(self) -> Iterator[str]:
        return (key for key, _ in self._items())

    def get(self, key: Any, default: Any = None) -> Any:  # type: ignore[override]
        found = self._lookup(key) if isinstance(key, str) else None
        return default if found is None else found

    def keys(self) -> KeysView[str]:  # type: ignore[override]
        return KeysView(self)

    def items(self) -> ItemsView[str, Any]:  # type: ignore[override]
        return _Items(self)

    def values(self) -> ValuesView[Any]:  # type: ignore[override]
        return _Values(self)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return len(self) == len(other) and dict(self._items()) == dict(other.items())

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # type: ignore[assignment]  # as every dict

    def __repr__(self) -> str:
        return f"<index of dataset {self._reader.dataset!r}: {len(self)} keys>"

    def __reduce__(self) -> NoReturn:
        raise TypeError("reader.index cannot be pickled: pickle the reader (or dict(index))")

    def __reversed__(self) -> NoReturn:
        raise TypeError("reader.index is not reversible")

    # dict's own methods that would change it or copy its (empty) storage
    __setitem__ = __delitem__ = __ior__ = _read_only
    update = pop = popitem = clear = setdefault = _read_only

    def copy(self) -> dict[str, Any]:
        """A plain dict of every key and location (this loads them all)."""
        return dict(self._items())

    def __or__(self, other: Any) -> dict[str, Any]:  # type: ignore[override]
        return {**self.copy(), **other}

    def __ror__(self, other: Any) -> dict[str, Any]:  # type: ignore[override]
        return {**other, **self.copy()}

    # -- the catalog -------------------------------------------------------------

    def _lookup(self, key: str) -> Any:
        return self._reader._exclusively(self._find, key)

    def _find(self, key: str) -> Any:
        reader = self._reader
        conn = reader._conn()
        real: str | None = key  # the key as the catalog's records hold it
        if reader._by_position:
            position = reader._position_of_key(key)
            if position is None:
                return None
            real = None
            key = str(reader._row_at(conn, position)[-1])
        if key in reader._deleted:
            return None
        if reader._parts:
            rows = lookup.members_by_key(conn, reader._sql, key)
            if not rows:
                return None
            return {name: self._member(sid, real, name, o, n) for sid, name, o, n in rows}
        row = lookup.record_by_key(conn, reader._sql, key)
        at = reader._sql.offset
        return None if row is None else self._record(row[1], row[at], row[at + 1])

    def _file(self, shard_id: int) -> str:
        path = self._reader._shards[shard_id].path
        return self._names.get(path, path)

    def _record(self, shard_id: int, offset: int, length: int) -> dict[str, Any]:
        return {"file": self._file(shard_id), "offset": offset, "length": length}

    def _member(
        self, shard_id: int, key: str | None, name: str, offset: int, size: int
    ) -> dict[str, Any]:
        """A member's location; its name is ``<key>.<feature>`` (just the feature in
        datasets keyed by position, which do not know their member names)."""
        return {
            "file": self._file(shard_id),
            "member_name": name if key is None else f"{key}.{name}",
            "data_offset": offset,
            "size": size,
        }

    def _page(self, shard_id: int, start: int) -> list[Any]:
        """One page of a shard's records (members, for formats whose records have
        parts), in its own snapshot: as every public call."""
        reader = self._reader
        conn = reader._conn()
        if reader._parts:
            return lookup.page_of_members(conn, reader._sql, shard_id, start, start + PAGE)
        return lookup.page_of_records(conn, reader._sql, shard_id, start, PAGE)

    def _items(self) -> Iterator[tuple[str, Any]]:
        """(key, location) in position order: one query per :data:`PAGE` records."""
        reader = self._reader
        by_position = reader._by_position
        for shard in list(reader._order):
            for start in range(0, shard.count, PAGE):
                if not reader._parts:
                    rows = reader._exclusively(self._page, shard.id, start)
                    for ordinal, key, offset, length in rows:
                        if key in reader._deleted:
                            continue
                        name = str(shard.first + ordinal) if by_position else key
                        yield name, self._record(shard.id, offset, length)
                    continue
                samples: dict[int, tuple[str, dict[str, Any]]] = {}
                members = reader._exclusively(self._page, shard.id, start)
                for ordinal, key, feature, offset, size in members:
                    if key in reader._deleted:
                        continue
                    real = None if by_position else key
                    name = str(shard.first + ordinal) if by_position else key
                    location = samples.setdefault(ordinal, (name, {}))[1]
                    location[feature] = self._member(shard.id, real, feature, offset, size)
                yield from samples.values()


class _Items(ItemsView[str, Any]):
    _mapping: DatasetIndex

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return self._mapping._items()


class _Values(ValuesView[Any]):
    _mapping: DatasetIndex

    def __iter__(self) -> Iterator[Any]:
        return (location for _, location in self._mapping._items())
