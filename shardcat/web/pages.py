"""What the pages show, read through the public :class:`~shardcat.Catalog` API: the
datasets with their sizes, a page of a dataset's records (key order, filters,
facets), a histogram of a numeric field, the SQL box's rows and the tensor stores.
Every statement runs through :meth:`~shardcat.Catalog.query_rows`, the guard of
``catalog query`` (read-only, time limit, memory budget)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardcat.catalog import DatasetInfo
from shardcat.errors import CatalogError, StorageValueError
from shardcat.facade.catalog import Catalog

__all__ = [
    "Histogram",
    "Limits",
    "RecordsPage",
    "SqlResult",
    "Summary",
    "TensorStore",
    "histogram",
    "quote",
    "records_page",
    "run_sql",
    "summaries",
    "tensor_store",
]

NUMERIC = ("INTEGER", "REAL", "BIGINT", "DOUBLE PRECISION", "FLOAT")
BINS = 20  # bars of a histogram
FACET_VALUES = 30  # values listed per facet


@dataclass(frozen=True)
class Limits:
    """What one statement may take: ``timeout`` seconds, ``memory`` bytes of rows,
    and ``rows`` shown by the SQL box."""

    timeout: float | None = 10.0
    memory: int | None = 64 * 2**20
    rows: int = 1000


def quote(name: str) -> str:
    """A SQL identifier (a dataset or field name the catalog gave, never user text)."""
    return '"' + name.replace('"', '""') + '"'


def _rows(
    cat: Catalog, sql: str, params: Sequence[Any], limits: Limits, most: int | None = None
) -> tuple[list[str], list[tuple[Any, ...]], bool]:
    """At most ``most`` rows of ``sql`` (all without ``most``) and whether more were left."""
    with cat.query_rows(sql, params, timeout=limits.timeout, memory=limits.memory) as (
        columns,
        rows,
    ):
        if most is None:
            return columns, list(rows), False
        got = list(itertools.islice(rows, most + 1))
    return columns, got[:most], len(got) > most


@dataclass(frozen=True)
class Summary:
    """A dataset as the datasets page lists it: its info, bytes of its shards and
    how many records were set aside as bad."""

    info: DatasetInfo
    size: int
    bad: int


def summaries(cat: Catalog) -> list[Summary]:
    return [
        Summary(
            info,
            sum(state[0] or 0 for state in cat.store.shard_states(info.name).values()),
            len(cat.bad_records(info.name)),
        )
        for info in cat.datasets()
    ]


@dataclass(frozen=True)
class RecordsPage:
    """A page of records in key order: ``columns`` (key and the SQL fields), ``rows``,
    the key after which the next page starts (None: last page), the facets
    (field -> [(value, count)]) and the numeric fields (a histogram each)."""

    columns: list[str]
    rows: list[tuple[Any, ...]]
    next_after: str | None
    facets: dict[str, list[tuple[Any, int]]] = field(default_factory=dict)
    numeric: list[str] = field(default_factory=list)


def _typed(value: str, sql_type: str) -> Any:
    """A filter value from the URL as the field's SQL type compares it."""
    try:
        if sql_type.upper() in ("INTEGER", "BIGINT"):
            return int(value)
        if sql_type.upper() in NUMERIC:
            return float(value)
    except ValueError:
        raise CatalogError(f"{value!r} is not a number") from None
    return value


def _where(info: DatasetInfo, filters: Mapping[str, str]) -> tuple[list[str], list[Any]]:
    clauses, params = [], []
    for name, value in filters.items():
        if name not in info.fields:
            raise CatalogError(f"dataset {info.name!r} has no field {name!r}")
        clauses.append(f"{quote(name)} = ?")
        params.append(_typed(value, info.fields[name]))
    return clauses, params


def records_page(
    cat: Catalog,
    info: DatasetInfo,
    *,
    filters: Mapping[str, str],
    facets: Sequence[str],
    after: str | None,
    size: int,
    limits: Limits,
) -> RecordsPage:
    """The ``size`` records after key ``after`` matching ``filters`` (field = value),
    with the value counts of the ``facets`` fields under the same filters."""
    table = quote(info.name)
    clauses, params = _where(info, filters)
    columns = ["key", *info.fields]
    paged = [*clauses, "key > ?"] if after is not None else clauses
    sql = f"SELECT {', '.join(quote(c) for c in columns)} FROM {table}"
    if paged:
        sql += " WHERE " + " AND ".join(paged)
    sql += f" ORDER BY key LIMIT {int(size) + 1}"
    names, rows, more = _rows(
        cat, sql, [*params, *([after] if after is not None else [])], limits, size
    )
    counted = {}
    for name in facets:
        if name not in info.fields:
            raise CatalogError(f"dataset {info.name!r} has no field {name!r}")
        where = " WHERE " + " AND ".join(clauses) if clauses else ""
        counted[name] = [
            (row[0], int(row[1]))
            for row in _rows(
                cat,
                f"SELECT {quote(name)}, count(*) FROM {table}{where} "
                f"GROUP BY {quote(name)} ORDER BY count(*) DESC LIMIT {FACET_VALUES}",
                params,
                limits,
                FACET_VALUES,
            )[1]
        ]
    numeric = [name for name, kind in info.fields.items() if kind.upper() in NUMERIC]
    return RecordsPage(names, rows, str(rows[-1][0]) if more else None, counted, numeric)


@dataclass(frozen=True)
class Histogram:
    """``bars``: (low, high, count) per bin; ``missing``: records without a value."""

    field: str
    bars: list[tuple[float, float, int]]
    missing: int


def histogram(cat: Catalog, info: DatasetInfo, name: str, limits: Limits) -> Histogram:
    """The distribution of the numeric field ``name``: :data:`BINS` equal bins from its
    smallest to its largest value (one per value for integers spanning fewer)."""
    if info.fields.get(name, "").upper() not in NUMERIC:
        raise CatalogError(f"dataset {info.name!r} has no numeric field {name!r}")
    table, column = quote(info.name), quote(name)
    low, high, missing = _rows(
        cat,
        f"SELECT min({column}), max({column}), count(*) - count({column}) FROM {table}",
        [],
        limits,
    )[1][0]
    if low is None:
        return Histogram(name, [], int(missing))
    integer = info.fields[name].upper() in ("INTEGER", "BIGINT")
    span = high - low
    bins = int(span) + 1 if integer and span < BINS else BINS
    width = (span / bins) if span else 1.0
    counts = [0] * bins
    sql = f"SELECT {column}, count(*) FROM {table} WHERE {column} IS NOT NULL GROUP BY {column}"
    with cat.query_rows(sql, timeout=limits.timeout, memory=limits.memory) as (_, rows):
        for value, count in rows:
            counts[min(int((value - low) / width), bins - 1)] += int(count)
    bars = [(low + i * width, low + (i + 1) * width, n) for i, n in enumerate(counts)]
    return Histogram(name, bars, int(missing))


@dataclass(frozen=True)
class SqlResult:
    columns: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool


def run_sql(cat: Catalog, sql: str, limits: Limits) -> SqlResult:
    """The first :attr:`Limits.rows` rows of one read-only statement (the guard of
    ``catalog query`` refuses anything else, stops it after the time limit)."""
    return SqlResult(*_rows(cat, sql, [], limits, limits.rows))


@dataclass(frozen=True)
class TensorStore:
    """A TensorBlob or TensorDB as the datasets page lists it: ``fields`` maps each
    field to (dtype, shape of one row)."""

    name: str
    kind: str
    rows: int
    fields: dict[str, tuple[str, tuple[int, ...]]]


def tensor_store(name: str, path: str | Path) -> TensorStore:
    """Open the TensorDB or TensorBlob directory ``path`` read-only (mode ``r``) and
    describe it."""
    from shardcat.storage import TensorBlob, TensorDB

    try:
        with TensorDB.open(path, "r") as db:
            return TensorStore(name, "TensorDB", len(db), dict(db.schema))
    except StorageValueError:  # (a TensorBlob)
        with TensorBlob.open(path, "r") as blob:
            return TensorStore(name, "TensorBlob", len(blob), {"data": (blob.dtype, blob.shape)})
    except FileNotFoundError:
        raise CatalogError(f"tensor store {name!r}: no TensorBlob or TensorDB at {path}") from None
