"""Claims: which process indexes which pending shard.

Every indexing process (each ingest worker, each rank of a distributed job)
loops: *claim* one pending shard in a short write transaction (state
``indexing``, owner ``host:pid:start-time``), index it without holding any
lock, then commit it only if it still owns the claim (:func:`still_mine`). A
claim whose owner is a dead process on this host is taken over at once; a
claim from another host after ``lease`` seconds (:data:`DEFAULT_LEASE`, ten
minutes: longer than any one shard takes to scan; a claim lives from its claim
to its commit, so committing is what renews it). No lock files, no heartbeat
threads. On a server catalog, processes on any host claim at the same time: each
locks the one row it takes with ``SELECT ... FOR UPDATE SKIP LOCKED`` and skips
rows another claimer holds.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, func, select, update

from shardcat.catalog import schema
from shardcat.catalog.backend import dialect_of
from shardcat.catalog.engine import BUSY_TIMEOUT_MS
from shardcat.catalog.processes import holder, is_dead, owner_id, tag_of
from shardcat.catalog.sync import bump_version, clear_shards, note_dropped, recompute_positions
from shardcat.errors import CatalogError, Hint, ShardcatWarning

__all__ = [
    "CLAIM_LOST",
    "DEFAULT_LEASE",
    "NAME_HOLDERS_AFTER",
    "ClaimedShard",
    "Waiting",
    "claim_next",
    "give_back",
    "held_by_others",
    "open_shards",
    "owner_id",
    "pending_shards",
    "release",
    "still_mine",
]

DEFAULT_LEASE = 600.0
NAME_HOLDERS_AFTER = 1.0  # a wait for other processes' shards longer than this is named
GIVE_BACK_WAIT = 2.0  # how long a stopped ingest waits to give its claims back
CLAIM_LOST = "claim lost to another process"


@dataclass(frozen=True)
class ClaimedShard:
    """A shard this process claimed: its row id, its path as stored (relative to the
    catalog when below it) and the claim's owner (``host:pid:start-time``)."""

    id: int
    stored: str
    owner: str


def claim_next(
    engine: Engine,
    dataset_id: int,
    lease: float,
    owner: str,
    only: Container[str] | None = None,
    retry_of: str | None = None,
) -> ClaimedShard | None:
    """Claim a pending shard (or one whose claimer died); None when there is none.

    ``only``: claim only shards whose stored path is in it. ``retry_of``: a claim
    whose owner's tag (:func:`~shardcat.catalog.processes.tag_of`) starts with it is
    taken over too: an earlier attempt of the same task, which the scheduler (Ray)
    retries only once it holds that attempt lost; should the attempt still run, its
    commit finds the claim gone (:func:`still_mine`).
    """
    s = schema.shards
    with engine.connect().execution_options(claim=True) as conn, conn.begin():
        rows = conn.execute(
            select(s.c.id, s.c.path, s.c.state, s.c.claim_owner, s.c.claimed_at)
            .where(s.c.dataset_id == dataset_id, s.c.state.in_(("pending", "indexing")))
            .order_by(s.c.path)
        ).all()
        for r in rows:
            if only is not None and r.path not in only:
                continue
            retried = retry_of is not None and tag_of(r.claim_owner).startswith(retry_of)
            if r.state == "pending" or retried or is_dead(r.claim_owner, r.claimed_at, lease):
                # Lock the row as it was read, skipping it when another process holds it
                # (a server catalog; a SQLite file has one writer at a time anyway).
                taken = conn.execute(
                    select(s.c.id)
                    .where(
                        s.c.id == r.id,
                        s.c.state == r.state,
                        s.c.claim_owner.is_(None)
                        if r.claim_owner is None
                        else s.c.claim_owner == r.claim_owner,
                    )
                    .with_for_update(skip_locked=True)
                ).first()
                if taken is None:
                    continue
                conn.execute(
                    update(s)
                    .where(s.c.id == r.id)
                    .values(state="indexing", claim_owner=owner, claimed_at=time.time(), error=None)
                )
                return ClaimedShard(r.id, r.path, owner)
    return None


def still_mine(conn: Connection, shard: ClaimedShard) -> bool:
    """Whether ``shard`` is still being indexed under this claim (in ``conn``'s
    transaction; the row stays locked until it ends, so on a server catalog no claim
    taken over meanwhile lets a commit through)."""
    s = schema.shards
    current = conn.execute(
        select(s.c.claim_owner, s.c.state).where(s.c.id == shard.id).with_for_update()
    ).one_or_none()
    return (
        current is not None and current.state == "indexing" and current.claim_owner == shard.owner
    )


def release(engine: Engine, dataset_id: int, shard: ClaimedShard, *, failed: str | None) -> bool:
    """End this process's claim on a shard (if it still owns it: else False): back to
    ``pending``, or with ``failed`` (the error), ``failed`` without records: the
    indexed version's records describe bytes the file no longer holds."""
    s = schema.shards
    shard_id = shard.id
    with engine.begin() as conn:
        if not still_mine(conn, shard):
            return False
        values: dict[str, Any] = {"claim_owner": None, "claimed_at": None}
        if failed is None:
            values["state"] = "pending"
        else:
            values.update(state="failed", error=failed, generation=None, num_records=0)
            clear_shards(conn, dataset_id, [shard_id])
            note_dropped(conn, dataset_id, {shard.stored: None})
        conn.execute(update(s).where(s.c.id == shard_id).values(**values))
        if failed is not None:
            bump_version(conn, dataset_id)
            recompute_positions(conn, dataset_id)
    return True


def give_back(
    engine: Engine,
    dataset_id: int,
    owner: str,
    wait: float = GIVE_BACK_WAIT,
    tagged: str | None = None,
) -> None:
    """The claims a stopped ingest leaves back to ``pending``: those ``owner`` holds
    and those of its workers, gone by now (every claim of a dead process on this
    host), and those whose owner's tag starts with ``tagged`` (its Ray tasks, on
    any host). Waits at most ``wait`` seconds for the write lock (SQLite), then
    leaves them: a dead process's claim is taken over at once anyway."""
    s = schema.shards
    with engine.connect() as conn:
        dialect = dialect_of(conn)
        dialect.lock_wait(conn, wait)
        with conn.begin():
            rows = conn.execute(
                select(s.c.id, s.c.claim_owner, s.c.claimed_at).where(
                    s.c.dataset_id == dataset_id, s.c.state == "indexing"
                )
            ).all()
            ids = [
                r.id
                for r in rows
                if r.claim_owner == owner
                or is_dead(r.claim_owner, r.claimed_at, math.inf)
                or (tagged is not None and tag_of(r.claim_owner).startswith(tagged))
            ]
            if ids:
                conn.execute(
                    update(s)
                    .where(s.c.id.in_(ids), s.c.state == "indexing")
                    .values(state="pending", claim_owner=None, claimed_at=None)
                )
        dialect.lock_wait(conn, BUSY_TIMEOUT_MS / 1000)  # as it was (a kept connection)


def open_shards(engine: Engine, dataset_id: int) -> int:
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


def pending_shards(engine: Engine, dataset_id: int) -> list[tuple[int, str]]:
    """The (id, stored path) of each shard still pending or being indexed, by path."""
    s = schema.shards
    with engine.connect().execution_options(immediate=False) as conn:
        rows = conn.execute(
            select(s.c.id, s.c.path)
            .where(s.c.dataset_id == dataset_id, s.c.state.in_(("pending", "indexing")))
            .order_by(s.c.path)
        ).all()
    return [(r.id, r.path) for r in rows]


def held_by_others(engine: Engine, dataset_id: int, lease: float) -> dict[str, int]:
    """The live claims on the dataset's shards: how many each holder (``host:pid``)
    has, most first (claims of dead processes are left out: they are taken over)."""
    s = schema.shards
    with engine.connect().execution_options(immediate=False) as conn:
        rows = conn.execute(
            select(s.c.claim_owner, s.c.claimed_at).where(
                s.c.dataset_id == dataset_id, s.c.state == "indexing"
            )
        ).all()
    held: dict[str, int] = {}
    for r in rows:
        if not is_dead(r.claim_owner, r.claimed_at, lease):
            who = holder(r.claim_owner)
            held[who] = held.get(who, 0) + 1
    return dict(sorted(held.items(), key=lambda item: -item[1]))


class Waiting:
    """This ingest's wait for shards that other processes hold: after
    :data:`NAME_HOLDERS_AFTER` seconds a :class:`ShardcatWarning` names them
    (``waiting for 3 shards held by host:pid``; again when they change), and
    after ``timeout`` seconds the wait ends with a :class:`CatalogError`."""

    def __init__(self, held: Callable[[], dict[str, int]], timeout: float | None) -> None:
        self.held = held  # the live claims now (see held_by_others)
        self.timeout = timeout
        self.started: float | None = None
        self.named = ""

    def still(self) -> None:
        """Called on each poll while the wait lasts (``started`` None: a new wait)."""
        now = time.monotonic()
        if self.started is None:
            self.started = now
        waited = now - self.started
        if waited < NAME_HOLDERS_AFTER and (self.timeout is None or waited < self.timeout):
            return
        held = self.held()
        what = ", ".join(
            f"{n} shard{'s' if n > 1 else ''} held by {owner}" for owner, n in held.items()
        )
        if self.timeout is not None and waited >= self.timeout:
            raise CatalogError(
                f"{what or 'shards other processes hold'}; run the same ingest again "
                "once they are done, or stop them",
                hint=Hint.naming(
                    "wait_timeout=",
                    "--wait-timeout",
                    before=f"gave up after waiting {self.timeout:g} s (",
                    after=") for",
                    lead=True,
                ),
            )
        if what and what != self.named:
            self.named = what
            said = ShardcatWarning(
                f"waiting for {what} (another ingest of this dataset; a process that "
                "ends gives its shards to this one;",
                hint=Hint.naming("wait_timeout=", "--wait-timeout", after=" bounds the wait)"),
            )
            warnings.warn(said, stacklevel=2)
