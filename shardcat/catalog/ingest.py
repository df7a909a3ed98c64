"""Indexing shards into the catalog: sync, claim, scan, commit.

Concurrency model (no lock files, no heartbeat threads):

1. ``sync_shards`` compares the files on disk with the dataset's shard rows
   in one write transaction: new files become ``pending`` rows, changed files
   (size or mtime; or inode/ctime with another fingerprint) become ``pending``
   *keeping their indexed version* (records, identity, positions) until the
   re-index commits, failed shards are retried, and rows of files no longer in
   the set are dropped.
2. Every indexing process (each ingest worker, each rank of a distributed
   job) loops: *claim* one pending shard in a short ``BEGIN IMMEDIATE``
   transaction (state ``indexing``, owner ``host:pid:start-time``), scan it
   without holding any lock, then *commit* its records, fields and ``ready``
   state in one transaction — only if it still owns the claim. The commit
   replaces the shard's previous version, increments its ``generation`` and
   the dataset's ``version`` (what open readers watch), and records the file
   identity the records were scanned from.
3. A claim whose owner is a dead process on this host is taken over at once;
   a claim from another host is taken over after ``lease`` seconds.

A reader therefore never sees half a shard nor a shard without records while it
is re-indexed, and a killed ingest leaves only whole shards plus a claim that
the next ingest takes over. A shard whose re-index fails loses its old records
(they describe bytes that are gone) and is ``failed``.

**Duplicate keys** (``on_duplicate``): ``error`` fails the shard; ``first`` /
``last`` keep one record per key in position order (shard path, then record
order). Records dropped that way are counted per shard, in the commit that
drops them, under :data:`DROPPED` in the dataset's options
(``{shard path: records of that shard the dataset does not serve}``): the
count is what readers report, and a shard without an entry holds exactly what
a scan of its file gives, so another dataset may copy its rows instead of
reading it (:mod:`shardcat.catalog.reuse`). Datasets created before this
bookkeeping have no :data:`DROPPED` entry at all and are never copied from.
"""

from __future__ import annotations

import json
import multiprocessing
import operator
import os
import socket
import time
from collections import defaultdict
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, delete, func, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from shardcat.catalog import fields as field_store
from shardcat.catalog import schema
from shardcat.catalog.bulk import insert_columns
from shardcat.catalog.engine import fork_generation, make_engine
from shardcat.errors import CatalogError, DuplicateKeyError, IngestError, ShardcatError
from shardcat.readers.compressed import ShardScan, scan_shard
from shardcat.readers.formats import Entry, get_format
from shardcat.readers.source import Identity, fingerprint_file, mismatch

__all__ = [
    "DROPPED",
    "IngestJob",
    "ProvideEntries",
    "ShardOutcome",
    "note_dropped",
    "run_ingest",
    "same_file",
    "stored_path",
    "sync_shards",
]

DUPLICATE_POLICIES = ("error", "first", "last")
# The dataset option that counts the records dropped as duplicates, per shard path
# (see the module docstring); its presence says the counts are complete.
DROPPED = "dropped_duplicates"
DEFAULT_LEASE = 600.0
POLL_SECONDS = 0.2
CLAIM_LOST = "claim lost to another process"

# Entries of a shard from elsewhere than scanning it (``catalog migrate``: a verified
# legacy index). Called with the shard's path and stat once the shard is claimed;
# None means "scan it after all". The result is committed like a scan's.
ProvideEntries = Callable[[str, os.stat_result], ShardScan | None]


@dataclass(frozen=True)
class IngestJob:
    """What an indexing process needs to know; small and picklable."""

    catalog: str
    catalog_dir: str
    dataset_id: int
    dataset_name: str
    format: str
    options: dict[str, Any]
    on_duplicate: str = "error"
    lease: float = DEFAULT_LEASE


@dataclass(frozen=True)
class ShardOutcome:
    """One shard indexed: its records, the records the commit dropped as duplicate
    keys (of this shard or of others it won against), or why it failed."""

    path: str
    records: int
    error: str | None = None
    duplicates: int = 0


# -- paths, owners, fingerprints ---------------------------------------------


def stored_path(path: str, catalog_dir: str) -> str:
    """How a shard path is stored: relative to the catalog's directory when below it."""
    rel = os.path.relpath(path, catalog_dir)
    return path if rel.startswith(os.pardir) else Path(rel).as_posix()


def absolute_path(stored: str, catalog_dir: str) -> str:
    return stored if os.path.isabs(stored) else os.path.join(catalog_dir, stored)


def _proc_stat(pid: int) -> tuple[str, str]:
    """(state, start time) of a process from /proc; ("?", "?") where /proc is missing."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return "?", "?"
    return fields[0].decode(), fields[19].decode()


def owner_id() -> str:
    """This process as a claim owner: host, pid and start time (guards pid reuse)."""
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_proc_stat(pid)[1]}"


def claim_is_dead(owner: str | None, claimed_at: float | None, lease: float) -> bool:
    if not owner:
        return True
    host, _, rest = owner.partition(":")
    pid_text, _, started = rest.partition(":")
    if host != socket.gethostname():
        return claimed_at is None or time.time() - claimed_at > lease
    pid = int(pid_text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, owned by another user
    state, now_started = _proc_stat(pid)
    # a zombie (killed, not yet waited for) is dead; a new start time means pid reuse
    return state in ("Z", "X") or started not in ("?", now_started)


def catalog_error(catalog: str, exc: SQLAlchemyError) -> CatalogError:
    """A database failure while writing the catalog (disk full, I/O error, locked)
    as one clear error; what was committed before stays."""
    orig = getattr(exc, "orig", None) or exc
    return CatalogError(f"cannot write the catalog {catalog}: {orig}")


def bump_version(conn: Connection, dataset_id: int) -> None:
    """Tell open readers that the dataset's shards or records changed."""
    d = schema.datasets
    conn.execute(update(d).where(d.c.id == dataset_id).values(version=d.c.version + 1))


# -- sync ---------------------------------------------------------------------


def _clear_shard(conn: Connection, dataset_id: int, shard_ids: Sequence[int]) -> None:
    if not shard_ids:
        return
    ids = list(shard_ids)
    conn.execute(delete(schema.records).where(schema.records.c.shard_id.in_(ids)))
    conn.execute(delete(schema.members).where(schema.members.c.shard_id.in_(ids)))
    conn.execute(delete(schema.seek_indexes).where(schema.seek_indexes.c.shard_id.in_(ids)))
    ftable = conn.dialect.identifier_preparer.quote_identifier(schema.field_table_name(dataset_id))
    conn.exec_driver_sql(
        f"DELETE FROM {ftable} WHERE shard_id IN ({', '.join(str(i) for i in ids)})"
    )


def same_file(row: Any, st: os.stat_result, path: str) -> bool | None:
    """Whether the file at ``path`` is still the version ``row`` indexed: False when
    size or mtime differ, or inode/ctime differ and so does the fingerprint; None when
    it is the same content under another inode/ctime (copied, chmod, ``touch -r``
    of unchanged bytes): the stored identity needs updating, not the records."""
    indexed = Identity(row.size, row.mtime_ns, row.ino, row.ctime_ns, row.fingerprint)
    if mismatch(indexed, st, lambda: fingerprint_file(path, st.st_size)) is not None:
        return False
    return True if (row.ino, row.ctime_ns) == (st.st_ino, st.st_ctime_ns) else None


def sync_shards(
    conn: Connection, dataset_id: int, files: Sequence[str], catalog_dir: str, rescan: bool
) -> dict[str, int]:
    """Make the dataset's shard rows match ``files``; returns counts per action.

    A changed shard keeps its indexed version (records, identity, position) until
    its re-index commits; one already pending or being indexed keeps its claim.
    """
    s = schema.shards
    existing = {
        r.path: r
        for r in conn.execute(
            select(
                s.c.id,
                s.c.path,
                s.c.size,
                s.c.mtime_ns,
                s.c.ino,
                s.c.ctime_ns,
                s.c.fingerprint,
                s.c.state,
                s.c.generation,
            ).where(s.c.dataset_id == dataset_id)
        )
    }
    counts = {"new": 0, "changed": 0, "unchanged": 0, "removed": 0, "retry": 0}
    wanted = set()
    for path in files:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue  # gone since it was listed: treated as not in the set
        key = stored_path(path, catalog_dir)
        wanted.add(key)
        row = existing.get(key)
        if row is None:
            conn.execute(
                s.insert().values(
                    dataset_id=dataset_id,
                    path=key,
                    size=st.st_size,
                    mtime_ns=st.st_mtime_ns,
                    num_records=0,
                    state="pending",
                )
            )
            counts["new"] += 1
            continue
        if row.state in ("pending", "indexing"):  # queued already: its claimer stats it
            counts["changed" if rescan else "unchanged"] += 1
            continue
        if row.state == "failed":
            conn.execute(update(s).where(s.c.id == row.id).values(state="pending", error=None))
            counts["retry"] += 1
            continue
        same = same_file(row, st, path)
        if rescan or same is False:
            conn.execute(
                update(s)
                .where(s.c.id == row.id)
                .values(state="pending", claim_owner=None, claimed_at=None, error=None)
            )
            counts["changed"] += 1
        else:
            if same is None:  # the same bytes under a new inode/ctime: note the new identity
                conn.execute(
                    update(s).where(s.c.id == row.id).values(ino=st.st_ino, ctime_ns=st.st_ctime_ns)
                )
            counts["unchanged"] += 1
    gone = [r.id for p, r in existing.items() if p not in wanted]
    if gone:
        _clear_shard(conn, dataset_id, gone)
        conn.execute(delete(s).where(s.c.id.in_(gone)))
        note_dropped(conn, dataset_id, {p: None for p in existing if p not in wanted})
        counts["removed"] = len(gone)
        bump_version(conn, dataset_id)
        recompute_positions(conn, dataset_id)
    return counts


def recompute_positions(conn: Connection, dataset_id: int) -> None:
    """Shards with an indexed version, in path order, get consecutive position ranges."""
    s = schema.shards
    rows = conn.execute(
        select(s.c.id, s.c.num_records, s.c.first_position, s.c.generation)
        .where(s.c.dataset_id == dataset_id)
        .order_by(s.c.path)
    ).all()
    position = 0
    changes = []
    for r in rows:
        indexed = r.generation is not None
        want = position if indexed else None
        if r.first_position != want:
            changes.append({"sid": r.id, "fp": want})
        if indexed:
            position += r.num_records
    if changes:
        conn.execute(
            update(s).where(s.c.id == bindparam("sid")).values(first_position=bindparam("fp")),
            changes,
        )


# -- claim and index one shard -------------------------------------------------

_engines: dict[tuple[str, int], Engine] = {}


def _engine(catalog: str) -> Engine:
    """One engine per catalog per process (a forked worker makes its own)."""
    key = (catalog, fork_generation())
    if key not in _engines:
        _engines[key] = make_engine(Path(catalog))
    return _engines[key]


def claim_next(
    engine: Engine, job: IngestJob, owner: str, only: Container[str] | None = None
) -> tuple[int, str] | None:
    """Claim a pending shard (or one whose claimer died); None when there is none.

    ``only``: claim only shards whose stored path is in it.
    """
    s = schema.shards
    with engine.begin() as conn:
        rows = conn.execute(
            select(s.c.id, s.c.path, s.c.state, s.c.claim_owner, s.c.claimed_at)
            .where(s.c.dataset_id == job.dataset_id, s.c.state.in_(("pending", "indexing")))
            .order_by(s.c.path)
        ).all()
        for r in rows:
            if only is not None and r.path not in only:
                continue
            if r.state == "pending" or claim_is_dead(r.claim_owner, r.claimed_at, job.lease):
                conn.execute(
                    update(s)
                    .where(s.c.id == r.id)
                    .values(state="indexing", claim_owner=owner, claimed_at=time.time(), error=None)
                )
                return r.id, r.path
    return None


def _still_mine(conn: Connection, shard_id: int, owner: str) -> bool:
    s = schema.shards
    current = conn.execute(
        select(s.c.claim_owner, s.c.state).where(s.c.id == shard_id)
    ).one_or_none()
    return current is not None and current.state == "indexing" and current.claim_owner == owner


def _dedupe_within(entries: list[Entry], path: str, policy: str) -> list[Entry]:
    distinct = set(map(_key, entries))
    if len(distinct) == len(entries) or distinct == {None}:  # the common case, at C speed
        return entries
    winner: dict[str, int] = {}
    for i, e in enumerate(entries):
        if e.key is None:
            continue
        j = winner.get(e.key)
        if j is None or policy == "last":
            winner[e.key] = i
        elif policy == "error":
            raise DuplicateKeyError(
                f"duplicate key {e.key!r} in {path}: records at bytes {entries[j].offset} "
                f"and {e.offset} (use on_duplicate='first' or 'last' to keep one)"
            )
    return [e for i, e in enumerate(entries) if e.key is None or winner[e.key] == i]


def _remove_ordinals(conn: Connection, dataset_id: int, shard_id: int, removed: list[int]) -> None:
    """Delete a shard's records at these ordinals and renumber the rest without gaps.

    Rows between the i-th and the next removed ordinal move down by i: one UPDATE
    per gap, so every row moves once however many are removed. Moved rows are
    negated on the way (then flipped back) so the unique (shard_id, ordinal)
    never sees a collision.
    """
    removed = sorted(removed)
    ftable = conn.dialect.identifier_preparer.quote_identifier(schema.field_table_name(dataset_id))
    for table in (schema.records.name, schema.members.name, ftable):
        conn.exec_driver_sql(
            f"DELETE FROM {table} "
            "WHERE shard_id = ? AND ordinal IN (SELECT value FROM json_each(?))",
            (shard_id, json.dumps(removed)),
        )
        for shift, (low, high) in enumerate(zip(removed, [*removed[1:], None], strict=True), 1):
            conn.exec_driver_sql(
                f"UPDATE {table} SET ordinal = -(ordinal - ?) - 1 "
                "WHERE shard_id = ? AND ordinal > ? AND (? IS NULL OR ordinal < ?)",
                (shift, shard_id, low, high, high),
            )
        conn.exec_driver_sql(
            f"UPDATE {table} SET ordinal = -ordinal - 1 WHERE shard_id = ? AND ordinal < 0",
            (shard_id,),
        )


def _conflicts(
    conn: Connection, dataset_id: int, keys: list[str]
) -> dict[str, tuple[int, str, int, int]]:
    """key -> (shard_id, shard path, ordinal, offset) of keys already in the dataset."""
    r, s = schema.records, schema.shards
    found = {}
    for i in range(0, len(keys), 500):
        rows = conn.execute(
            select(r.c.key, r.c.shard_id, s.c.path, r.c.ordinal, r.c.offset)
            .join(s, s.c.id == r.c.shard_id)
            .where(r.c.dataset_id == dataset_id, r.c.key.in_(keys[i : i + 500]))
        )
        for row in rows:
            found[row.key] = (row.shard_id, row.path, row.ordinal, row.offset)
    return found


def _resolve_across(
    conn: Connection, job: IngestJob, stored: str, entries: list[Entry]
) -> tuple[list[Entry], dict[str, int]]:
    """Settle keys this shard shares with shards already committed: the entries to
    insert, and how many records each other shard (by path) lost to this one."""
    clash = _conflicts(conn, job.dataset_id, [e.key for e in entries if e.key is not None])
    if not clash:
        return entries, {}
    if job.on_duplicate == "error":
        key, (_, other, _, other_offset) = next(iter(clash.items()))
        mine = next(e.offset for e in entries if e.key == key)
        more = f" ({len(clash) - 1} more keys are duplicated too)" if len(clash) > 1 else ""
        raise DuplicateKeyError(
            f"duplicate key {key!r}: in {other} at byte {other_offset} and in {stored} at "
            f"byte {mine}{more} (use on_duplicate='first' or 'last' to keep one)"
        )
    # "first"/"last" mean first/last in position order, i.e. by shard path.
    new_wins = {
        key: (stored < other) == (job.on_duplicate == "first")
        for key, (_, other, _, _) in clash.items()
    }
    losers: dict[int, list[int]] = defaultdict(list)
    lost: dict[str, int] = defaultdict(int)
    for key, wins in new_wins.items():
        if wins:
            shard_id, other, ordinal, _ = clash[key]
            losers[shard_id].append(ordinal)
            lost[other] += 1
    s = schema.shards
    for shard_id, ordinals in losers.items():
        _remove_ordinals(conn, job.dataset_id, shard_id, ordinals)
        conn.execute(
            update(s).where(s.c.id == shard_id).values(num_records=s.c.num_records - len(ordinals))
        )
    return [e for e in entries if e.key is None or new_wins.get(e.key, True)], dict(lost)


def _insert_fields(conn: Connection, job: IngestJob, shard_id: int, entries: list[Entry]) -> None:
    """One row per record in the dataset's field table, adding columns for new fields
    (and for the fields the format declares every dataset has, NULL where absent)."""
    declared = getattr(get_format(job.format), "field_types", None)
    types: dict[str, str] = {} if declared is None else dict(declared(job.options))
    for e in entries:
        for name, value in e.fields.items():
            if name not in types and value is not None:
                types[name] = field_store.sql_type_of(value)
    cols = field_store.ensure_field_columns(conn, job.dataset_id, job.dataset_name, types)
    values = {f"v{cols[name][2]}": [e.fields.get(name) for e in entries] for name in cols}
    insert_columns(
        conn,
        schema.field_table_name(job.dataset_id),
        {"shard_id": shard_id, "ordinal": range(len(entries)), **values},
    )


def _insert_records(conn: Connection, job: IngestJob, shard_id: int, entries: list[Entry]) -> None:
    n = len(entries)
    # the format's key rule decides (RecordIO without .idx files keys by position)
    by_position = get_format(job.format).key_rule(job.options) == "position"
    insert_columns(
        conn,
        schema.records.name,
        {
            "dataset_id": job.dataset_id,
            "key": [f"#{shard_id}:{i}" for i in range(n)] if by_position else [*map(_key, entries)],
            "shard_id": shard_id,
            "ordinal": range(n),
            "offset": [*map(_offset, entries)],
            "length": [*map(_length, entries)],
        },
    )


_key, _offset, _length = (operator.attrgetter(a) for a in ("key", "offset", "length"))


def _commit(
    conn: Connection,
    job: IngestJob,
    shard_id: int,
    stored: str,
    entries: list[Entry],
    st: os.stat_result,
    fp: str,
    compression: str | None = None,
    seek_index: tuple[str, bytes] | None = None,
    dropped: int = 0,
) -> tuple[int, int]:
    """Replace the shard's indexed version with ``entries``; returns the records
    committed and the records dropped as duplicates (``dropped`` of them within the
    shard already, before this call)."""
    _clear_shard(conn, job.dataset_id, [shard_id])  # the version this one replaces
    lost: dict[str, int] = {}
    try:
        with conn.begin_nested():
            _insert_records(conn, job, shard_id, entries)
    except IntegrityError:  # keys already in other shards: settle them, then insert
        before = len(entries)
        entries, lost = _resolve_across(conn, job, stored, entries)
        dropped += before - len(entries)
        _insert_records(conn, job, shard_id, entries)
    note_dropped(conn, job.dataset_id, {stored: dropped}, lost)
    members = [(i, *member) for i, e in enumerate(entries) for member in e.members]
    if members:  # tar samples: one row per member
        ordinal = [m[0] for m in members]
        columns: dict[str, Any] = {
            "shard_id": shard_id,
            "ordinal": ordinal,
            "name": [m[1] for m in members],
            "offset": [m[2] for m in members],
            "length": [m[3] for m in members],
        }
        if any(len(m) > 4 for m in members):  # pieces of sparse members (see schema)
            columns["extents"] = [
                json.dumps([list(p) for p in m[4]]) if len(m) > 4 and m[4] else None
                for m in members
            ]
        insert_columns(conn, schema.members.name, columns)
    if job.options.get("fields", True):  # without fields the view reads records alone
        _insert_fields(conn, job, shard_id, entries)
    s = schema.shards
    conn.execute(
        update(s)
        .where(s.c.id == shard_id)
        .values(
            state="ready",
            generation=func.coalesce(s.c.generation, 0) + 1,
            num_records=len(entries),
            size=st.st_size,
            mtime_ns=st.st_mtime_ns,
            ino=st.st_ino,
            ctime_ns=st.st_ctime_ns,
            fingerprint=fp,
            compression=compression,
            claim_owner=None,
            claimed_at=None,
            error=None,
            indexed_at=time.time(),
        )
    )
    # Seek points of a compressed shard commit with its records (schema version 2).
    conn.execute(delete(schema.seek_indexes).where(schema.seek_indexes.c.shard_id == shard_id))
    if seek_index is not None:
        conn.execute(
            schema.seek_indexes.insert().values(
                shard_id=shard_id, kind=seek_index[0], data=seek_index[1]
            )
        )
    bump_version(conn, job.dataset_id)
    recompute_positions(conn, job.dataset_id)
    return len(entries), dropped + sum(lost.values())


def note_dropped(
    conn: Connection,
    dataset_id: int,
    counts: Mapping[str, int | None],
    more: Mapping[str, int] | None = None,
) -> None:
    """Update the dataset's :data:`DROPPED` counts: ``counts`` sets a shard's count
    (0 or None: it drops nothing), ``more`` adds to the counts of others. A dataset
    without the option (created before it existed) is left alone."""
    d = schema.datasets
    text = conn.execute(select(d.c.options).where(d.c.id == dataset_id)).scalar_one()
    options = json.loads(text)
    if not isinstance(options.get(DROPPED), dict):
        return
    table: dict[str, int] = dict(options[DROPPED])
    for path, n in counts.items():
        if n:
            table[path] = n
        else:
            table.pop(path, None)
    for path, n in (more or {}).items():
        table[path] = table.get(path, 0) + n
    if table != options[DROPPED]:
        options[DROPPED] = table
        conn.execute(update(d).where(d.c.id == dataset_id).values(options=json.dumps(options)))


def index_claimed(
    engine: Engine,
    job: IngestJob,
    shard_id: int,
    stored: str,
    owner: str,
    provide: ProvideEntries | None = None,
) -> ShardOutcome:
    """Scan a claimed shard and commit it (or record why it failed).

    ``provide`` may hand in the shard's entries instead of a scan (see
    :data:`ProvideEntries`); they go through the same checks and commit.
    """
    path = absolute_path(stored, job.catalog_dir)
    fmt = get_format(job.format)
    try:
        st = os.stat(path)
        fp = fingerprint_file(path, st.st_size)
        scanned = None if provide is None else provide(path, st)
        if scanned is None:
            scanned = scan_shard(fmt, path, job.options)  # plain or compressed (+ seek points)
        after = os.stat(path)
        if (after.st_size, after.st_mtime_ns, after.st_ino) != (
            st.st_size,
            st.st_mtime_ns,
            st.st_ino,
        ) or fingerprint_file(path, after.st_size) != fp:
            raise ShardcatError(f"{path}: the file changed while it was being indexed")
        entries = _dedupe_within(scanned.entries, stored, job.on_duplicate)
        within = len(scanned.entries) - len(entries)
        seek = (
            None
            if scanned.seek_kind is None or scanned.seek_index is None
            else (scanned.seek_kind, scanned.seek_index)
        )
        with engine.begin() as conn:
            if not _still_mine(conn, shard_id, owner):
                return ShardOutcome(stored, 0, CLAIM_LOST)
            n, dropped = _commit(
                conn, job, shard_id, stored, entries, st, fp, scanned.compression, seek, within
            )
        return ShardOutcome(stored, n, duplicates=dropped)
    except SQLAlchemyError as exc:  # the catalog itself failed (disk full, I/O error)
        try:
            _release(engine, job, shard_id, owner, failed=None)
        except SQLAlchemyError:
            pass  # the claim dies with this process; the next ingest takes it over
        raise catalog_error(job.catalog, exc) from None
    except (ShardcatError, OSError) as exc:
        message = str(exc)
        if isinstance(exc, OSError) and not isinstance(exc, ShardcatError):
            message = f"{path}: {exc.strerror or exc}"
        _release(engine, job, shard_id, owner, failed=message)
        return ShardOutcome(stored, 0, message)
    except BaseException:
        _release(engine, job, shard_id, owner, failed=None)  # give it back; caller sees why
        raise


def _release(
    engine: Engine, job: IngestJob, shard_id: int, owner: str, *, failed: str | None
) -> None:
    """End this process's claim on a shard (if it still owns it): back to ``pending``,
    or with ``failed`` (the error), ``failed`` without records: the indexed version's
    records describe bytes the file no longer holds."""
    s = schema.shards
    with engine.begin() as conn:
        if not _still_mine(conn, shard_id, owner):
            return
        values: dict[str, Any] = {"claim_owner": None, "claimed_at": None}
        if failed is None:
            values["state"] = "pending"
        else:
            values.update(state="failed", error=failed, generation=None, num_records=0)
            _clear_shard(conn, job.dataset_id, [shard_id])
            stored = conn.execute(
                select(schema.shards.c.path).where(schema.shards.c.id == shard_id)
            ).scalar_one()
            note_dropped(conn, job.dataset_id, {stored: None})
        conn.execute(update(s).where(s.c.id == shard_id).values(**values))
        if failed is not None:
            bump_version(conn, job.dataset_id)
            recompute_positions(conn, job.dataset_id)


def _work_one(job: IngestJob) -> ShardOutcome | None:
    """Claim and index one shard in this process; None when nothing was claimable."""
    engine = _engine(job.catalog)
    owner = owner_id()
    claimed = claim_next(engine, job, owner)
    if claimed is None:
        return None
    return index_claimed(engine, job, claimed[0], claimed[1], owner)


def _open_shards(engine: Engine, dataset_id: int) -> int:
    """How many shards are still pending or being indexed."""
    s = schema.shards
    with engine.connect().execution_options(immediate=False) as conn:
        return int(
            conn.execute(
                select(func.count()).where(
                    s.c.dataset_id == dataset_id, s.c.state.in_(("pending", "indexing"))
                )
            ).scalar_one()
        )


def run_ingest(
    engine: Engine,
    job: IngestJob,
    workers: int,
    progress: Callable[[ShardOutcome], None] | None = None,
    provided: Mapping[str, ProvideEntries] | None = None,
) -> list[ShardOutcome]:
    """Index every pending shard of the dataset, sharing the work with any other
    process doing the same; returns once no shard is pending or being indexed.

    ``provided`` maps stored shard paths to where their entries come from
    instead of a scan: those shards are claimed and committed first, in this
    process; the rest are scanned by ``workers`` processes as usual.
    """
    outcomes: list[ShardOutcome] = []

    def note(outcome: ShardOutcome | None) -> None:
        if outcome is not None:
            outcomes.append(outcome)
            if progress is not None:
                progress(outcome)

    if provided:
        owner = owner_id()
        while (claimed := claim_next(engine, job, owner, only=provided)) is not None:
            shard_id, stored = claimed
            note(index_claimed(engine, job, shard_id, stored, owner, provided[stored]))
    idle = False
    while True:
        open_count = _open_shards(engine, job.dataset_id)
        if open_count == 0:
            return outcomes
        done = len(outcomes)
        if workers > 1 and open_count > 1 and not idle:
            ctx = multiprocessing.get_context("fork")
            with ctx.Pool(min(workers, open_count)) as pool:
                for outcome in pool.imap_unordered(_work_one, [job] * open_count):
                    note(outcome)
        else:
            note(_work_one(job))
        idle = len(outcomes) == done
        if idle:
            time.sleep(POLL_SECONDS)  # other processes hold the remaining claims


def raise_for_failures(outcomes: Iterable[ShardOutcome]) -> None:
    """Raise :class:`IngestError` naming every shard that failed (others stay committed)."""
    failed = [o for o in outcomes if o.error is not None and o.error != CLAIM_LOST]
    if failed:
        more = f" (and {len(failed) - 1} more failed shards)" if len(failed) > 1 else ""
        raise IngestError(f"{failed[0].error}{more}", failed)
