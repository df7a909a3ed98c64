"""Snapshots: a compact, self-contained SQLite catalog of some datasets of another
catalog, for readers on many hosts (``Catalog(path, immutable=True)``).

The source is read through SQLAlchemy Core in one read transaction (one moment
of the catalog, whatever its writers commit meanwhile; the statements are
portable, so the source may be any backend the store runs on). A SQLite
source's records and members are copied by SQLite itself (the source attached
read-only: ``FAST_SQLITE``), checked to be the same moment by the dataset's
``version``. The snapshot is
a fresh catalog created the normal way (:class:`~shardcat.catalog.store.Store`),
filled with every shard that has an indexed version (what readers see: shards
waiting for a re-index keep their last indexed version; shards never indexed,
pending or failed, are left out and counted), their records, members and seek
points, the field registry, the key index (built after the rows), the field
indexes the source has and the views. Shard paths (and the dataset's source
patterns) are stored relative to the snapshot's directory when the shard lies
below it, absolute otherwise.

It is written to ``<out>.tmp-<pid>`` beside ``out`` in rollback-journal mode
(one file: no ``-wal``/``-shm`` needed to read it), synced, then renamed over
``out``: readers see the old file or the whole new one, and a failure leaves
neither a temporary file nor a partial ``out``. ``shardcat_meta`` records
where it came from: ``snapshot_of`` (the source's path, or its URL without the
password), ``snapshot_at`` (UTC, ISO 8601) and ``snapshot_datasets`` (JSON:
each dataset's ``version`` at that moment).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, column, create_engine, func, inspect, select, table, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import StaticPool

from shardcat.catalog import deletes, schema, shares, tables
from shardcat.catalog.backend import run
from shardcat.catalog.store import Store
from shardcat.catalog.sync import DROPPED, absolute_path, stored_path
from shardcat.errors import REPLACE, CatalogError, NetworkFilesystemWarning

__all__ = ["Provenance", "SnapshotResult", "provenance", "take"]

# Rows read from the source and written per batch.
BATCH = 20_000
# A SQLite source's records and members are copied by SQLite (the source attached
# read-only to the snapshot's connection) instead of through Python: ~10x faster.
FAST_SQLITE = True
_META = ("snapshot_of", "snapshot_at", "snapshot_datasets")
_RECORD_COLUMNS = shares.RECORD_COLUMNS
_MEMBER_COLUMNS = shares.MEMBER_COLUMNS


@dataclass(frozen=True)
class Provenance:
    """Where a snapshot came from: the source catalog, when, and each dataset's version."""

    snapshot_of: str
    snapshot_at: str
    versions: dict[str, int]

    def describe(self) -> str:
        return f"snapshot of {self.snapshot_of} taken at {self.snapshot_at}"


@dataclass(frozen=True)
class DatasetCopy:
    """One dataset as the snapshot holds it."""

    name: str
    version: int
    shards: int
    records: int
    # shards waiting for a re-index (or whose re-index failed): their last indexed version
    awaiting_reindex: int = 0
    # shards without an indexed version, by state (pending, indexing, failed): left out
    left_out: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SnapshotResult:
    path: str
    provenance: Provenance
    datasets: list[DatasetCopy]
    bytes: int
    seconds: float


def provenance(conn: Any) -> Provenance | None:
    """The provenance a snapshot records (None: the catalog is no snapshot); ``conn``
    is a store's read connection."""
    names = ", ".join(f"'{n}'" for n in _META)
    rows = conn.execute(f"SELECT name, value FROM shardcat_meta WHERE name IN ({names})")
    meta = dict(rows.fetchall())
    if "snapshot_of" not in meta:
        return None
    versions = json.loads(meta.get("snapshot_datasets", "{}"))
    return Provenance(meta["snapshot_of"], meta.get("snapshot_at", "?"), versions)


def take(
    store: Store, names: Sequence[str], out: str | os.PathLike[str], *, overwrite: bool = False
) -> SnapshotResult:
    """Write a snapshot of the datasets ``names`` of ``store`` to ``out`` (see the
    module docstring). An existing ``out`` is refused unless ``overwrite``
    (readers that have it open immutable then fail with "changed": reopen);
    the source catalog itself is always refused."""
    started = time.monotonic()
    wanted = list(dict.fromkeys(names))
    if not wanted:
        raise CatalogError("name at least one dataset to snapshot")
    for name in wanted:
        store.dataset_row(name)  # CatalogError naming the known datasets
    target = Path(out).expanduser().absolute()
    _check_target(store, target, overwrite)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    try:
        with warnings.catch_warnings():  # a snapshot is meant for network filesystems
            warnings.simplefilter("ignore", NetworkFilesystemWarning)
            Store(tmp).close()  # an empty catalog of the current schema
        attach = None
        source = store.backend.local_file
        if FAST_SQLITE and source is not None:  # a SQLite source: bulk rows in SQL
            attach = source.resolve().as_uri() + (
                "?mode=ro&immutable=1" if store.immutable else "?mode=ro"
            )
        with store.read_transaction() as src, _writer(tmp, attach) as dst:
            prov = Provenance(_source_name(store), _utc_now(), {})
            copies = [
                _copy_dataset(src, dst, name, store.directory, str(target.parent), attach)
                for name in wanted
            ]
            if attach is not None:  # DDL must not see the source's objects
                run(dst, "COMMIT")
                run(dst, "DETACH DATABASE src")
                run(dst, "BEGIN")
            for name in wanted:
                _index_and_view(src, dst, name)
            prov.versions.update({c.name: c.version for c in copies})
            dst.execute(
                schema.catalog_meta.insert(),
                [
                    {"name": "snapshot_of", "value": prov.snapshot_of},
                    {"name": "snapshot_at", "value": prov.snapshot_at},
                    {"name": "snapshot_datasets", "value": json.dumps(prov.versions)},
                ],
            )
            dst.commit()
        _sync(tmp)
        _check_target(store, target, overwrite)  # (created meanwhile?)
        os.replace(tmp, target)
        _sync(target.parent)
    except BaseException as exc:
        for suffix in ("", "-journal", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                os.unlink(f"{tmp}{suffix}")
        if isinstance(exc, (SQLAlchemyError, sqlite3.Error, OSError)):
            reason = getattr(exc, "orig", None) or exc
            raise CatalogError(f"cannot write the snapshot {target}: {reason}") from None
        raise
    return SnapshotResult(
        str(target), prov, copies, target.stat().st_size, time.monotonic() - started
    )


def _check_target(store: Store, target: Path, overwrite: bool) -> None:
    if target.is_dir():
        raise CatalogError(f"cannot write the snapshot {target}: it is a directory")
    if not target.exists():
        return
    source = store.backend.local_file
    if source is not None and target.samefile(source):
        raise CatalogError(f"cannot write the snapshot over its own source catalog {target}")
    if not overwrite:
        raise CatalogError(f"{target} exists", hint=REPLACE)


def _source_name(store: Store) -> str:
    """The source's path, or its server URL without the password."""
    return str(store.path)


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@contextlib.contextmanager
def _writer(path: Path, attach: str | None) -> Iterator[Connection]:
    """A connection on the new file in one write transaction, in rollback-journal
    mode (the finished file needs no companion files) and unsynced (the caller
    syncs the file once, before it is renamed into place); ``attach``: a SQLite
    source's URI, attached read-only as ``src``."""
    raw = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    raw.execute("PRAGMA journal_mode = DELETE")
    raw.execute("PRAGMA synchronous = OFF")
    if attach is not None:
        raw.execute("ATTACH DATABASE ? AS src", (attach,))
    engine = create_engine("sqlite+pysqlite://", creator=lambda: raw, poolclass=StaticPool)
    try:
        with engine.connect() as conn:
            run(conn, "BEGIN")
            yield conn
    finally:
        engine.dispose()
        raw.close()


def _sync(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        if path.is_dir():
            return  # some filesystems cannot open a directory: nothing to sync then
        raise
    try:
        with contextlib.suppress(OSError):  # (a directory on some filesystems)
            os.fsync(fd)
    finally:
        os.close(fd)


def _copy_dataset(
    src: Connection, dst: Connection, name: str, src_dir: str, dst_dir: str, attached: str | None
) -> DatasetCopy:
    d, s, f = schema.datasets, schema.shards, schema.fields
    row = src.execute(select(d).where(d.c.name == name)).mappings().one()
    dataset_id = row["id"]

    def moved(path: str) -> str:
        return stored_path(os.path.normpath(absolute_path(path, src_dir)), dst_dir)

    options = json.loads(row["options"])
    if isinstance(options.get(DROPPED), dict):
        options[DROPPED] = {moved(p): n for p, n in options[DROPPED].items()}
    source = [moved(p) for p in json.loads(row["source"])]
    dst.execute(
        d.insert().values({**row, "options": json.dumps(options), "source": json.dumps(source)})
    )

    indexed = s.c.dataset_id == dataset_id, s.c.generation.is_not(None)
    shard_rows = src.execute(select(s).where(*indexed).order_by(s.c.id)).mappings().all()
    awaiting = sum(r["state"] != "ready" for r in shard_rows)
    never = src.execute(
        select(s.c.state, func.count())
        .where(s.c.dataset_id == dataset_id, s.c.generation.is_(None))
        .group_by(s.c.state)
    ).all()
    clean = {"state": "ready", "error": None, "claim_owner": None, "claimed_at": None}
    if shard_rows:
        dst.execute(s.insert(), [{**r, **clean, "path": moved(r["path"])} for r in shard_rows])
    shard_ids = select(s.c.id).where(*indexed).scalar_subquery()

    field_rows = (
        src.execute(select(f).where(f.c.dataset_id == dataset_id).order_by(f.c.idx))
        .mappings()
        .all()
    )
    tables.create_records_table(dst, dataset_id, key_index=False)
    records_name = schema.records_table_name(dataset_id)
    for r in field_rows:
        run(
            dst,
            f'ALTER TABLE "{records_name}" ADD COLUMN v{int(r["idx"])} '
            f"{tables.SQL_TYPES[r['sql_type']]}",
        )
    if field_rows:
        dst.execute(f.insert(), [dict(r) for r in field_rows])

    cols = [*_RECORD_COLUMNS, *(f"v{int(r['idx'])}" for r in field_rows)]
    ids = [int(r["id"]) for r in shard_rows]
    donor = tables.donor_of(src, dataset_id) if inspect(src).has_table("shardcat_shares") else None
    if donor is not None:  # rows read by reference: the snapshot's copy owns them
        n = _copy_shared(src, dst, dataset_id, donor)
    elif attached is not None:  # the same rows, copied by SQLite itself
        n = _copy_attached(dst, records_name, cols, ids, "shard_id, ordinal")
        _copy_attached(dst, schema.members.name, _MEMBER_COLUMNS, ids, "shard_id, ordinal, name")
        version = run(
            dst, "SELECT version FROM src.shardcat_datasets WHERE id = ?", (dataset_id,)
        ).scalar()
        if version != row["version"]:  # (a commit between the two reads)
            raise CatalogError(
                f"dataset {name!r} changed while the snapshot was taken: take it again"
            )
    else:
        n = _stream_records(src, dst, records_name, cols, shard_ids)
    if donor is None:
        _copy_shard_tables(src, dst, shard_ids)

    return DatasetCopy(
        name,
        int(row["version"]),
        len(shard_rows),
        n,
        awaiting,
        {str(state): int(count) for state, count in never},
    )


def _index_and_view(src: Connection, dst: Connection, name: str) -> None:
    """The key index, the field indexes the source has and the view of a copied dataset
    (after its rows: an index built at once is a sort, and compact)."""
    dataset_id = int(
        dst.execute(select(schema.datasets.c.id).where(schema.datasets.c.name == name)).scalar_one()
    )
    records_name = schema.records_table_name(dataset_id)
    have = {i["name"] for i in inspect(src).get_indexes(records_name)}
    if schema.key_index_name(dataset_id) in have:
        tables.create_key_index(dst, dataset_id)
    for column_name, _, idx in tables.field_columns(dst, dataset_id).values():
        if tables.field_index_name(dataset_id, idx) in have:
            tables.create_field_index(dst, dataset_id, name, column_name)
    deletes.copy_marks(src, dst, name, dataset_id)
    tables.create_view(dst, dataset_id, name)


def _copy_attached(
    dst: Connection, into: str, cols: Sequence[str], shard_ids: list[int], order: str
) -> int:
    """Copy the rows of the shards ``shard_ids`` of the attached source's table ``into``."""
    if not shard_ids:
        return 0
    names = ", ".join(f'"{c}"' for c in cols)
    ids = ", ".join(str(i) for i in shard_ids)
    done = run(
        dst,
        f'INSERT INTO main."{into}" ({names}) SELECT {names} FROM src."{into}" '
        f"WHERE shard_id IN ({ids}) ORDER BY {order}",
    )
    return int(done.rowcount)


def _stream(src: Connection, dst: Connection, query: Any, into: str, cols: Iterable[str]) -> int:
    """Copy the rows of ``query`` into the table ``into`` in batches; their count."""
    names = list(cols)
    sql = (
        f'INSERT INTO "{into}" ({", ".join(f"{chr(34)}{c}{chr(34)}" for c in names)}) '
        f"VALUES ({', '.join('?' * len(names))})"
    )
    cursor = dst.connection.driver_connection.cursor()  # type: ignore[union-attr]
    n = 0
    result = src.execute(query.execution_options(yield_per=BATCH))
    for part in result.partitions():
        cursor.executemany(sql, list(map(tuple, part)))
        n += len(part)
    return n


def _copy_shared(src: Connection, dst: Connection, dataset_id: int, donor: int) -> int:
    """The rows dataset ``dataset_id`` reads by reference from ``donor`` (records,
    members, seek points, bad records: :func:`shares.copies`), streamed under its
    own shard ids; returns the records copied."""
    counts = [
        _stream(src, dst, text(rows), into, columns)
        for into, columns, rows in shares.copies(src, dataset_id, donor)
    ]
    return counts[0]


def _stream_records(
    src: Connection, dst: Connection, records_name: str, cols: list[str], shard_ids: Any
) -> int:
    """The records and members of the shards ``shard_ids``, streamed from ``src`` to ``dst``
    (another database, not attached); returns the records copied."""
    records = table(records_name, *(column(c) for c in cols))
    n = _stream(
        src,
        dst,
        select(*records.c)
        .where(records.c.shard_id.in_(shard_ids))
        .order_by(records.c.shard_id, records.c.ordinal),
        records_name,
        cols,
    )
    m = schema.members
    _stream(
        src,
        dst,
        select(*(m.c[c] for c in _MEMBER_COLUMNS))
        .where(m.c.shard_id.in_(shard_ids))
        .order_by(m.c.shard_id, m.c.ordinal, m.c.name),
        m.name,
        _MEMBER_COLUMNS,
    )
    return n


def _copy_shard_tables(src: Connection, dst: Connection, shard_ids: Any) -> None:
    """The shards' seek indexes and the records ingest set aside (verify and stats list them)."""
    for t in (schema.seek_indexes, schema.bad_records):
        rows = src.execute(select(t).where(t.c.shard_id.in_(shard_ids))).mappings().all()
        if rows:
            dst.execute(t.insert(), [_plain(r) for r in rows])


def _plain(row: Any) -> dict[str, Any]:
    """A row as insertable values (memoryviews, as some drivers give blobs, as bytes)."""
    return {k: bytes(v) if isinstance(v, memoryview) else v for k, v in dict(row).items()}
