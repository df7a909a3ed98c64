"""Shard rows against the files of a dataset: which shards are new, changed,
unchanged or gone, how shard paths are stored, positions, and the bookkeeping
every commit shares (the dataset's ``version``, dropped-duplicate counts).

``sync_shards`` makes a dataset's shard rows match a set of files in one write
transaction: new files become ``pending`` rows, changed files become
``pending`` *keeping their indexed version* (records, identity, positions)
until the re-index commits, failed shards are retried, and rows of files no
longer in the set are dropped. Whether a file is still the indexed version is
the caller's judgement (the facade compares file identities and fingerprints):
the store never opens a shard.

**Dropped duplicates** (:data:`DROPPED`): records dropped by ``on_duplicate``
are counted per shard, in the commit that drops them, in the dataset's options
(``{shard path: records of that shard the dataset does not serve}``). A shard
without an entry holds exactly what a scan of its file gives, so another
dataset may copy its rows instead of reading it (:mod:`shardcat.catalog.reuse`).
Datasets created before this bookkeeping have no entry at all.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, bindparam, delete, select, update

from shardcat.catalog import schema, shares
from shardcat.catalog.backend import run

__all__ = [
    "DROPPED",
    "absolute_path",
    "bump_version",
    "clear_shards",
    "note_dropped",
    "recompute_positions",
    "stored_path",
    "sync_shards",
]

# The dataset option that counts the records dropped as duplicates, per shard path
# (see the module docstring); its presence says the counts are complete.
DROPPED = "dropped_duplicates"

# Whether a file is still the version a shard row indexed: True, False, or None for
# the same content under another inode/ctime (the stored identity needs updating).
Judge = Callable[[Any, str], "bool | None"]


def stored_path(path: str, catalog_dir: str) -> str:
    """How a shard path is stored: relative to the catalog's directory when below it
    (a server catalog has none: ``catalog_dir`` "", every path absolute; a URL,
    ``scheme://...``, as it is)."""
    if not catalog_dir or "://" in path:
        return path
    rel = os.path.relpath(path, catalog_dir)
    return path if rel.startswith(os.pardir) else Path(rel).as_posix()


def absolute_path(stored: str, catalog_dir: str) -> str:
    return (
        stored
        if os.path.isabs(stored) or not catalog_dir or "://" in stored
        else os.path.join(catalog_dir, stored)
    )


def bump_version(conn: Connection, dataset_id: int) -> None:
    """Tell open readers that the dataset's shards or records changed."""
    d = schema.datasets
    conn.execute(update(d).where(d.c.id == dataset_id).values(version=d.c.version + 1))


def clear_shards(conn: Connection, dataset_id: int, shard_ids: Sequence[int]) -> None:
    """Delete the rows of the dataset's shards ``shard_ids`` (the shard rows stay),
    once every dataset reading them by reference owns a copy."""
    if not shard_ids:
        return
    ids = list(shard_ids)
    shares.release(conn, dataset_id, ids)
    conn.execute(delete(schema.members).where(schema.members.c.shard_id.in_(ids)))
    conn.execute(delete(schema.seek_indexes).where(schema.seek_indexes.c.shard_id.in_(ids)))
    conn.execute(delete(schema.bad_records).where(schema.bad_records.c.shard_id.in_(ids)))
    table = schema.records_table_name(dataset_id)
    run(conn, f"DELETE FROM {table} WHERE shard_id IN ({', '.join(str(int(i)) for i in ids)})")


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


def sync_shards(
    conn: Connection,
    dataset_id: int,
    files: Mapping[str, os.stat_result],
    same_file: Judge,
    rescan: bool,
) -> dict[str, int]:
    """Make the dataset's shard rows match ``files`` (stored path -> the file's
    stat); returns counts per action. ``same_file(row, stored path)`` judges
    whether a file is still the version its row indexed (see :data:`Judge`).

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
    for key, st in files.items():
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
        same = same_file(row, key)
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
        clear_shards(conn, dataset_id, gone)
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
