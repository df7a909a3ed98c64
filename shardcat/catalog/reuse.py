"""Which dataset a path set opens, and new datasets that reuse another's rows.

A dataset is a set of shards read with one rule: a format, a key rule and,
for tar, a grouping (``datasets.format``, ``key_rule``, ``grouping``). The same
files may serve several datasets, one per rule. Without a dataset name,
:meth:`~shardcat.Catalog.ingest` (and so every reader opened on paths) takes:

1. the dataset ingested from the same patterns whose rule is the one asked for;
2. else the one dataset whose shards are exactly the matched files with that rule;
3. else a new dataset. When another dataset over the same files has another
   rule, the new one is named after it with what differs: ``<name>_<format>``,
   ``<name>_<grouping>`` (``train_tfd``), ``<name>_by_<key feature>``
   (``train_by_id``) or ``<name>_by_position``; otherwise after the files
   (``train``, then ``train_2``, ...).

The rule asked for is computed as ingest computes it (options detected from
the first shard < stored with the candidate dataset < given), so options left
out keep the candidate's: ``catalog ingest`` without ``--key`` re-syncs a
dataset keyed by ``id``, a reader asking for ``key`` gets its own.

**Seeding.** A new dataset whose shards another dataset has already indexed
with the same rule and the same scan options (fields, TFRecord message type,
RecordIO header/idx) reads those shards' rows by reference instead of reading
the files (:mod:`~shardcat.catalog.shares`): records, members, seek points and
field values stay in the donor's tables; the new dataset gets its own shard
rows (file identity and ``indexed_at`` kept), so positions are its own. Only
shards that hold exactly what a scan of their file gives are taken: ready,
unchanged on disk, with no records dropped as duplicates (see
:data:`~shardcat.catalog.sync.DROPPED`), from a donor that reads its own rows;
the others are scanned. A reader over ``train-0000[0-4].tfrecord`` after
``train-*.tfrecord`` was indexed so opens without reading a shard or copying a
record, and is a dataset like any other: before a write to the rows it shares
(a changed shard re-indexed on either side, ...) it gets its own copy of them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select

from shardcat.catalog import schema, shares, tables
from shardcat.catalog.backend import dialect_of, run
from shardcat.catalog.sync import DROPPED, Judge, bump_version, recompute_positions

__all__ = ["Rule", "choose", "seed", "variant_name"]

# Options that say how records are keyed (compared through the rule), not how a
# shard is scanned, and bookkeeping.
_RULE_OPTIONS = ("key", "grouping", DROPPED, "legacy_index")
_COLUMNS = "id, name, format, key_rule, grouping, options"


@dataclass(frozen=True)
class Rule:
    """What a caller asks for: the format, the options detected from the first
    shard and the options given (``key``, ``grouping``, ``fields``, ...), and the
    format's key rule for a set of options."""

    format: str
    detected: Mapping[str, Any]
    explicit: Mapping[str, Any]
    key_rule: Callable[[Mapping[str, Any]], str]

    def options(self, stored: Mapping[str, Any]) -> dict[str, Any]:
        """The options ingest would use on a dataset that stores ``stored``."""
        merged = {**self.detected, **stored, **self.explicit}
        merged.pop(DROPPED, None)
        return merged

    def of(self, stored: Mapping[str, Any]) -> tuple[str, str, str | None]:
        """(format, key rule, grouping) on a dataset that stores ``stored``."""
        opts = self.options(stored)
        return self.format, self.key_rule(opts), opts.get("grouping")


def _rule_of(row: Sequence[Any]) -> tuple[str, str, str | None]:
    return row[2], row[3], row[4]


def _fits(row: Sequence[Any], rule: Rule) -> bool:
    return _rule_of(row) == rule.of(json.loads(row[5]))


def choose(
    conn: Any, source: Sequence[str], shard_paths: set[str], rule: Rule | None
) -> tuple[str | None, Sequence[Any] | None]:
    """``(dataset, other)``: the dataset these files open with ``rule`` (None: any
    rule), or None and the first dataset over the same files with another rule
    (None when there is none), to name a new one after.

    ``conn`` is a DBAPI connection; ``source`` the patterns as stored, and
    ``shard_paths`` the matched files as stored.
    """
    by_source = _ingestable(
        conn.execute(
            f"SELECT {_COLUMNS} FROM shardcat_datasets WHERE source = ? ORDER BY id",
            (json.dumps(source),),
        ).fetchall()
    )
    if rule is None and by_source:
        return str(by_source[0][1]), None
    fitting = [r for r in by_source if rule is not None and _fits(r, rule)]
    if fitting:
        return str(fitting[0][1]), None
    by_set = _ingestable(_same_shard_set(conn, shard_paths))  # only now: reads every shard row
    fitting = [r for r in by_set if rule is None or _fits(r, rule)]
    if len(fitting) == 1:
        return str(fitting[0][1]), None
    others = [*by_source, *by_set]
    return None, (others[0] if others and rule is not None else None)


def _ingestable(rows: Sequence[Any]) -> list[Any]:
    """The rows of datasets an ingest may write: not a tag's pinned dataset (``d@tag``)."""
    return [r for r in rows if schema.tag_of(str(r[1])) is None]


def _same_shard_set(conn: Any, shard_paths: set[str]) -> list[Any]:
    """Rows of the datasets whose shards are exactly ``shard_paths``, by id."""
    if not shard_paths:
        return []
    sets: dict[int, set[str]] = {}
    for dataset_id, path in conn.execute("SELECT dataset_id, path FROM shardcat_shards"):
        sets.setdefault(dataset_id, set()).add(path)
    return [
        conn.execute(f"SELECT {_COLUMNS} FROM shardcat_datasets WHERE id = ?", (i,)).fetchone()
        for i in sorted(i for i, paths in sets.items() if paths == shard_paths)
    ]


def variant_name(other: Sequence[Any], rule: Rule) -> str:
    """A name for a dataset over the same files as ``other`` read with ``rule``:
    ``other``'s name and what differs (see the module docstring)."""
    fmt, key_rule, grouping = rule.of({})
    if other[2] != fmt:
        suffix = fmt
    elif other[4] != grouping:
        suffix = grouping or "ungrouped"
    elif key_rule == "position":
        suffix = "by_position"
    else:
        suffix = "by_" + (key_rule.partition(":")[2] or key_rule)
    slug = re.sub(r"[^A-Za-z0-9_]+", "_", suffix).strip("_")[:48] or "other"
    return f"{str(other[1])[:72]}_{slug}"


def _scan_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """What decides a shard's rows besides the rule (fields default to on)."""
    return {"fields": True, **{k: v for k, v in options.items() if k not in _RULE_OPTIONS}}


def seed(
    conn: Connection,
    dataset_id: int,
    name: str,
    options: Mapping[str, Any],
    files: Mapping[str, Any],
    same_file: Judge,
) -> int:
    """Give the new dataset ``dataset_id``, by reference, the rows of the shards
    among ``files`` (stored path -> stat) that one other dataset with the same rule
    and scan options holds complete (see the module docstring), unless
    ``same_file`` says the file changed since; returns how many shards it took."""
    d = schema.datasets
    me = conn.execute(
        select(d.c.format, d.c.key_rule, d.c.grouping).where(d.c.id == dataset_id)
    ).one()
    if not files:
        return 0
    among, listed = dialect_of(conn).any_of("s.path", sorted(files))
    rows = run(
        conn,
        "SELECT s.dataset_id, s.id, s.path FROM shardcat_shards s JOIN shardcat_datasets d "
        "ON d.id = s.dataset_id "
        "WHERE s.dataset_id != ? AND s.state = 'ready' AND s.generation IS NOT NULL "
        # (a dataset reading another's rows is no donor: its donor is one itself)
        "AND NOT EXISTS (SELECT 1 FROM shardcat_shares x WHERE x.shard_id = s.id) "
        "AND d.format = ? AND d.key_rule = ? AND coalesce(d.grouping, '') = ? "
        f"AND {among}",
        (dataset_id, me.format, me.key_rule, me.grouping or "", listed),
    ).all()
    mine = _scan_options(options)
    donors: dict[int, list[tuple[int, str]]] = {}
    for donor_id, shard_id, path in rows:
        donors.setdefault(donor_id, []).append((shard_id, path))
    best: tuple[int, list[int]] | None = None
    for donor_id in sorted(donors):
        stored = json.loads(
            conn.execute(select(d.c.options).where(d.c.id == donor_id)).scalar_one()
        )
        dropped = stored.get(DROPPED)
        if not isinstance(dropped, dict) or _scan_options(stored) != mine:
            continue  # counts unknown (an older catalog), or scanned otherwise
        if not tables.has_key_index(conn, donor_id):
            continue  # its first ingest is settling duplicate keys yet
        whole = [shard_id for shard_id, path in donors[donor_id] if not dropped.get(path)]
        if whole and (best is None or len(whole) > len(best[1])):
            best = (donor_id, whole)
    if best is None:
        return 0
    donor_id, shard_ids = best
    among, listed = dialect_of(conn).any_of("id", shard_ids)
    rows = run(conn, f"SELECT * FROM shardcat_shards WHERE {among}", (listed,)).all()
    # (a file changed since is read again anyway)
    taken = [row.id for row in rows if same_file(row, row.path) is not False]
    if taken:
        shares.share(conn, dataset_id, name, donor_id, taken)
        bump_version(conn, dataset_id)
        recompute_positions(conn, dataset_id)
    return len(taken)
