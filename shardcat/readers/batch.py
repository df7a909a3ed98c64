"""Batches of records as a training loop wants them: :class:`BatchReads`, the base of
:class:`~shardcat.readers.reader.Reader` that holds ``get_dicts``/``get_dicts_at``
(records as ``{feature: value}`` dicts, of every feature or of a chosen few) and the
native batch read behind them and ``get_many``/``get_many_at``.

On a SQLite catalog, a TFRecord dataset of plain local files reads a whole batch in
one call to C (:data:`shardcat.readers.hot.read_batch`): each key, or each
position's ``(shard, ordinal)`` (past soft-deleted records), looked up through a statement
prepared once on the calling thread's own catalog connection (the snapshot the call
reads), the payloads read in (shard, offset) order (nearby frames in one ``pread``)
and checked against the catalog's check of each record, each shard's file checked
once after, and the dicts built straight off the Examples' wire. Anything it is not
sure of comes back ``AGAIN`` and the batch is read by the Python path
(``Reader._load``), whose answers and errors are the reference;
``SHARDCAT_NATIVE=0`` turns it off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shardcat.catalog.lookup import ReadConnection
from shardcat.errors import KeyNotFoundError
from shardcat.readers import hot, record_view
from shardcat.readers.hot import AGAIN
from shardcat.readers.view import DatasetView, follows_reindex

__all__ = ["BatchReads"]


class BatchReads(DatasetView):
    """Batches read natively, and records as dicts (see the module docstring)."""

    if TYPE_CHECKING:  # (Reader's)

        def get_many(self, keys: Sequence[Any], *, raw: bool = False) -> list[Any]: ...

        def get_many_at(
            self, positions: Sequence[int] | slice, *, raw: bool = False
        ) -> list[Any]: ...

        def get_record(self, key: Any) -> Any: ...

        def get_record_at(self, position: int, *, raw: bool = False) -> Any: ...

    def _read_batch(
        self,
        conn: ReadConnection,
        items: list[Any],
        by_key: bool,
        dicts: bool,
        select: tuple[str, ...] | None,
    ) -> Any:
        """``items`` (keys, or positions) read in one native call: their payloads, or
        (``dicts``) their dicts of the ``select`` features (None: all; an item the
        wire cannot settle is ``AGAIN``), in batch order; ``AGAIN`` where the native
        read does not apply or is not sure (the caller reads the batch in Python)."""
        hot_lookups = self._hot if by_key else self._hot_at
        if hot_lookups is None or not self._files_only:
            return AGAIN
        if by_key:  # a soft-deleted key is a missing one: the Python path names it
            if self._deleted and not self._deleted.isdisjoint(items):
                return AGAIN
        elif self._positions_moved:  # the Python path raises StaleShardError
            return AGAIN
        lookup = hot_lookups.lookup(conn)
        if lookup is None:
            return AGAIN
        layout = None if by_key else self._layout_buffers
        keyed = not self._by_position
        for _ in range(2):  # once more after opening the shards it had no source for
            got = hot.read_batch(
                lookup, items, layout, self._pool.sources, self.verify_reads, keyed, dicts, select
            )
            if type(got) is not tuple:
                return got
            for shard_id in got[0]:
                if shard_id not in self._shards:  # (not in this snapshot: a broken row)
                    return AGAIN
                self._source(shard_id)
        return AGAIN

    def _native_records(
        self, conn: ReadConnection, items: list[Any], by_key: bool, raw: bool
    ) -> Any:
        """``get_many``/``get_many_at`` natively: payloads, or decoded records; AGAIN."""
        got = self._read_batch(conn, items, by_key, False, None)
        if got is AGAIN or raw:
            return got
        from shardcat.pb2 import Example  # (the native read is of Examples only)

        try:
            return list(map(Example.FromString, got))  # the format's decode, inlined
        except Exception:  # an undecodable record: the Python path names it
            return AGAIN

    @follows_reindex
    def get_dicts(self, keys: Sequence[Any], features: Sequence[str] | None = None) -> list[Any]:
        """Records for ``keys`` as :meth:`to_dict` gives them, of the ``features``
        named only (None: all; a feature a record lacks is left out), in one batch
        (as :meth:`get_many`: a missing key is a :class:`KeyNotFoundError`). TFRecord
        items come straight off the checked payloads' wire, no protobuf objects."""
        keys = [str(k) for k in keys]
        if self._by_position:
            return self.get_dicts_at(self._positions_of(keys), features)
        return self._dicts(keys, True, features)

    @follows_reindex
    def get_dicts_at(
        self, positions: Sequence[int] | slice, features: Sequence[str] | None = None
    ) -> list[Any]:
        """Records at ``positions`` (a sequence or a slice) as :meth:`get_dicts`."""
        if isinstance(positions, slice):
            positions = range(*positions.indices(self._len))
        return self._dicts(list(positions), False, features)

    def _dicts(self, items: list[Any], by_key: bool, features: Sequence[str] | None) -> list[Any]:
        select = None if features is None else tuple(features)
        got = self._read_batch(self._conn(), items, by_key, True, select)
        if got is AGAIN:
            dicts = self.native_dicts
            fetch = self.get_many if by_key else self.get_many_at
            records = fetch(items, raw=dicts is not None)
            got = (
                list(map(dicts, records)) if dicts is not None else list(map(self.to_dict, records))
            )
            if select is not None:
                got = [_chosen(item, select) for item in got]
        for n, item in enumerate(got):
            if item is AGAIN:  # an odd Example: decoded, as get_record does
                record = self.get_record(items[n]) if by_key else self.get_record_at(items[n])
                got[n] = (
                    self.to_dict(record)
                    if select is None
                    else _chosen(self.to_dict(record), select)
                )
        return got

    def _positions_of(self, keys: list[str]) -> list[int]:
        """The positions of the keys of a dataset keyed by position (a
        :class:`KeyNotFoundError` naming the missing ones)."""
        positions = [self._position_of_key(k) for k in keys]
        missing = [k for k, p in zip(keys, positions, strict=True) if p is None]
        if missing:
            raise KeyNotFoundError(self._missing_message(missing))
        return [p for p in positions if p is not None]

    def _missing_message(self, missing: list[str]) -> str:
        shown = ", ".join(repr(k) for k in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        return f"{len(missing)} key(s) not in dataset {self.dataset!r}: {shown}{more}"

    def features(self, record: Any) -> dict[str, list[Any]]:
        """A decoded record as ``{feature: [values]}``."""
        return record_view.features(self._fmt, record)

    def to_dict(self, record: Any) -> dict[str, Any]:
        """A decoded record as ``{feature: value}``: single values unwrapped, others lists."""
        return {k: v[0] if len(v) == 1 else v for k, v in self.features(record).items()}


def _chosen(item: Any, select: tuple[str, ...]) -> Any:
    """The ``select`` features of an item dict (``AGAIN`` stays ``AGAIN``)."""
    if item is AGAIN:
        return item
    return {name: item[name] for name in select if name in item}
