"""``Catalog.dedup`` (``catalog dedup``): exact duplicate records within a dataset and
across datasets of one catalog, and (``mark``) all but the first of each
soft-deleted (:meth:`Catalog.delete <shardcat.Catalog.delete>`).

**Candidates** are records with the same payload CRC32C, taken from each record's
stored check (:mod:`shardcat.formats.checks`: the check XOR its key's CRC32C), so
finding them reads no shard. A record without a stored check (indexed before
schema version 7) is read and its CRC32C computed (counted in ``computed``).
Datasets whose records have no bytes of their own (Parquet rows: ``Format.OWN_BYTES``)
are refused: their duplicates are a SQL ``GROUP BY`` away. A record made of parts (a tar
sample) is signed by its members' names and CRC32Cs: two samples are duplicates
when every member, name and bytes, is. The lengths the catalog stores are the
payload's for some formats only (framing included for others), so the bytes
decide, length included.

**Confirmed** by comparing the bytes (checked reads): records with the same
CRC32C but other bytes are never reported (counted in ``collisions``).

**First**, the record kept: that of the dataset named first (``dataset``, then
``across`` in order), then the lowest position. Soft-deleted records take no part,
so after ``mark`` a second run finds nothing and marks nothing; ``undelete``
restores the marked ones.

Records are signed a page at a time and grouped in SQL on disk
(:class:`~shardcat.catalog.dedup.Candidates`); only one group's bytes are held
at a time, so memory does not grow with the datasets (the report holds the
duplicates found).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from shardcat.catalog.dedup import Candidates, Page, live_records
from shardcat.catalog.store import Store
from shardcat.errors import CatalogError
from shardcat.formats.checks import crc32c, key_check
from shardcat.formats.registry import get_format
from shardcat.readers.reader import Reader

__all__ = ["Copy", "DedupProgress", "DedupReport", "DuplicateGroup", "dedup"]

#: ``progress(stage, done, total)``: stage ``"scan"`` (records signed), then
#: ``"compare"`` (candidates read and compared)
DedupProgress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class Copy:
    """One record: its dataset and key (its position, for a dataset keyed by position)."""

    dataset: str
    key: str


@dataclass(frozen=True)
class DuplicateGroup:
    """Records with the same bytes: ``kept``, the first, and the ``duplicates`` in
    order (dataset named, then position); ``length``: the bytes of each (of a tar
    sample, its members')."""

    kept: Copy
    duplicates: tuple[Copy, ...]
    length: int


@dataclass
class DedupReport:
    """What :func:`dedup` found: the ``datasets`` compared, their live ``records``,
    the duplicate ``groups`` (by their kept record's dataset, then position), the
    ``candidates`` (records sharing a payload CRC32C with another), the
    ``bytes_compared`` reading them, the ``collisions`` (candidates whose bytes
    equal no other's), the records whose CRC32C was ``computed`` from their bytes
    (no stored check), and how many records ``mark`` newly deleted per dataset."""

    datasets: list[str]
    records: int = 0
    groups: list[DuplicateGroup] = field(default_factory=list)
    candidates: int = 0
    bytes_compared: int = 0
    collisions: int = 0
    computed: int = 0
    marked: dict[str, int] = field(default_factory=dict)

    @property
    def duplicates(self) -> int:
        """The records that duplicate a kept one (what ``mark`` deletes)."""
        return sum(len(g.duplicates) for g in self.groups)

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values (``catalog dedup --json``)."""

        def copy(c: Copy) -> dict[str, str]:
            return {"dataset": c.dataset, "key": c.key}

        groups = [
            {"kept": copy(g.kept), "duplicates": list(map(copy, g.duplicates)), "length": g.length}
            for g in self.groups
        ]
        return {
            "datasets": self.datasets,
            "records": self.records,
            "duplicates": self.duplicates,
            "groups": groups,
            "candidates": self.candidates,
            "bytes_compared": self.bytes_compared,
            "collisions": self.collisions,
            "computed": self.computed,
            "marked": self.marked,
        }


class _Catalog(Protocol):
    """What of a :class:`shardcat.Catalog` dedup uses."""

    store: Store

    def dataset(self, name: str) -> Reader: ...

    def delete(self, dataset: str, *, keys: Sequence[str]) -> int: ...


@dataclass(frozen=True)
class _Side:
    """One dataset compared: its place in the order named, id, reader and kind."""

    index: int
    name: str
    id: int
    reader: Reader
    parts: bool
    by_position: bool

    def key(self, place: int, stored: str) -> str:
        """A record's key as readers know it (by position: its position)."""
        return str(place) if self.by_position else stored

    def read(self, places: Sequence[int], keys: Sequence[str]) -> list[Any]:
        """The records' bytes (``{member: bytes}`` for parts), checked; None for a
        record deleted since it was listed."""
        if self.by_position:  # (no deletes: a position is its place)
            return list(self.reader.get_many_at(list(places), raw=True))
        return [self.reader.get_raw(k) for k in keys]


def dedup(
    catalog: _Catalog,
    names: Sequence[str],
    *,
    mark: bool = False,
    progress: DedupProgress | None = None,
) -> DedupReport:
    """Find the exact duplicate records of the datasets ``names`` (see the module
    docstring); ``mark``: soft-delete all but the first of each group."""
    if not names:
        raise CatalogError("name a dataset to deduplicate")
    twice = sorted({n for n in names if list(names).count(n) > 1})
    if twice:
        raise CatalogError(f"dataset {twice[0]!r} named twice")
    if mark:
        catalog.store.check_writable()
    report = DedupReport(list(names))
    with contextlib.ExitStack() as stack:
        sides = [_open(catalog, i, name, stack, mark) for i, name in enumerate(names)]
        found = stack.enter_context(Candidates())
        total = sum(len(side.reader) for side in sides)
        for side in sides:
            for page in live_records(catalog.store.reader_connection, side.id, side.parts):
                found.add(_signed(side, page, report))
                report.records += len(page)
                if progress is not None:
                    progress("scan", report.records, total)
        _confirm(sides, found, report, progress)
    if mark:
        keys: dict[str, list[str]] = {}
        for group in report.groups:
            for c in group.duplicates:
                keys.setdefault(c.dataset, []).append(c.key)
        report.marked = {name: catalog.delete(name, keys=k) for name, k in keys.items()}
    return report


def _open(
    catalog: _Catalog, index: int, name: str, stack: contextlib.ExitStack[Any], mark: bool
) -> _Side:
    row = catalog.store.dataset_row(name)  # CatalogError naming the datasets when missing
    by_position = row.key_rule == "position"
    if mark and by_position:
        raise CatalogError(
            f"dataset {name!r} is keyed by position: marking duplicates deleted needs a "
            "dataset keyed by a feature (without marking, dedup lists them)"
        )
    fmt = get_format(row.format)
    if not fmt.OWN_BYTES:
        raise CatalogError(
            f"dataset {name!r} is {fmt.TITLE}: its records have no bytes of their own to "
            "compare; find duplicate rows with SQL (GROUP BY its fields HAVING count(*) > 1)"
        )
    reader = stack.enter_context(catalog.dataset(name))
    return _Side(index, name, row.id, reader, fmt.PARTS, by_position)


def _signature(data: Any) -> int:
    """The CRC32C of a record's bytes; of a record with parts, the CRC32C of its
    members' names and CRC32Cs."""
    if isinstance(data, dict):
        return _parts_signature([(name, crc32c(value)) for name, value in data.items()])
    return crc32c(data)


def _parts_signature(members: Sequence[tuple[str, int]]) -> int:
    text = "".join(f"{name}\0{crc:08x}\n" for name, crc in sorted(members))
    return crc32c(text.encode("utf-8", "surrogateescape"))


def _signed(side: _Side, page: Page, report: DedupReport) -> list[tuple[int, int, int, str]]:
    """``(signature, dataset, place, key)`` of a page's records: from their stored
    checks (a keyed record's mixes in its key's CRC32C), else from their bytes, read
    in one batch."""
    signed: list[tuple[int, int, int, str]] = []
    unchecked: list[tuple[int, str]] = []
    for place, key, check in page:
        mix = 0 if side.by_position else key_check(key)
        if side.parts and all(crc is not None for _, crc in check):
            sig = _parts_signature([(name, crc ^ mix) for name, crc in check])
        elif not side.parts and check is not None:
            sig = check ^ mix
        else:
            unchecked.append((place, key))
            continue
        signed.append((sig, side.index, place, key))
    if unchecked:
        places, keys = [p for p, _ in unchecked], [k for _, k in unchecked]
        for place, key, data in zip(places, keys, side.read(places, keys), strict=True):
            if data is not None:
                signed.append((_signature(data), side.index, place, key))
        report.computed += len(unchecked)
    return signed


def _size(data: Any) -> int:
    return sum(map(len, data.values())) if isinstance(data, dict) else len(data)


def _confirm(
    sides: Sequence[_Side],
    found: Candidates,
    report: DedupReport,
    progress: DedupProgress | None,
) -> None:
    """Read each group of candidates and split it by bytes: every set of two or more
    records with equal bytes is a :class:`DuplicateGroup`; the rest are collisions."""
    report.candidates = found.count()
    done = 0
    ordered: list[tuple[int, int, DuplicateGroup]] = []
    for group in found.groups():
        # each distinct content: (bytes, dataset, place, kept, duplicates)
        clusters: list[tuple[Any, int, int, Copy, list[Copy]]] = []
        for ds, place, stored in group:
            side = sides[ds]
            data = side.read([place], [stored])[0]
            if data is None:  # deleted since the scan
                continue
            report.bytes_compared += _size(data)
            copy = Copy(side.name, side.key(place, stored))
            same = next((c for c in clusters if c[0] == data), None)
            if same is None:
                clusters.append((data, ds, place, copy, []))
            else:
                same[4].append(copy)
        for data, ds, place, kept, duplicates in clusters:
            if duplicates:
                ordered.append((ds, place, DuplicateGroup(kept, tuple(duplicates), _size(data))))
            else:
                report.collisions += 1
        done += len(group)
        if progress is not None:
            progress("compare", done, report.candidates)
    ordered.sort(key=lambda item: (item[0], item[1]))
    report.groups = [group for _, _, group in ordered]
