"""The ingest session: what one indexing process asks of the store while it indexes
a dataset's shards — claim a shard, commit its scan, fail it, give it back.

:class:`IngestSession` is all the facade's ingest (:mod:`shardcat.facade.ingest`)
and the Ray executor use of the store: they scan shards, the session writes.
It keeps one connection open across this process's claims, commits and
releases (a forked worker opens its own session: a connection never crosses
``fork``) and, in a pool of forked workers of one ingest, the lock through
which they take turns at the catalog's write lock (see :meth:`IngestSession.turn`).
The transactions themselves are in :mod:`~shardcat.catalog.claims` and
:mod:`~shardcat.catalog.commit`.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Container, Iterator
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from shardcat.catalog import claims, commit
from shardcat.catalog.backend import make_engine
from shardcat.catalog.claims import ClaimedShard, Waiting, owner_id
from shardcat.catalog.commit import IngestJob, ShardVersion
from shardcat.catalog.engine import fork_generation

__all__ = ["ClaimedShard", "IngestSession", "ShardVersion", "open_sessions"]

# Every session with a connection open in this process (tests check none is left).
_open: weakref.WeakSet[IngestSession] = weakref.WeakSet()


def open_sessions() -> list[IngestSession]:
    """The sessions of this process that keep a connection open."""
    return [s for s in _open if s._engine is not None and s._born == fork_generation()]


class IngestSession:
    """One process's ingest of one dataset (``job``): claims, commits, failures and
    releases on one kept connection, opened when first needed and closed by
    :meth:`close` (before forking workers, and when the ingest ends).

    ``turns``: the lock the forked workers of one ingest share (None: this process
    writes alone, or on a server catalog, which takes concurrent writers).
    ``tag``: added to this process's owner id (``host:pid:start-time:tag``): one
    attempt of a Ray task names itself so (see :meth:`claim`'s ``retry_of``).
    """

    def __init__(self, job: IngestJob, *, turns: Any = None, tag: str = "") -> None:
        self.job = job
        self._tag = f":{tag}" if tag else ""
        self.owner = owner_id() + self._tag
        self._turns = turns
        self._engine: Engine | None = None
        self._born = fork_generation()

    # -- the connection -----------------------------------------------------------

    @property
    def engine(self) -> Engine:
        """The engine keeping this process's one connection (opened on first use)."""
        if self._engine is None or self._born != fork_generation():
            if self._born != fork_generation():  # a forked child claims as itself
                self.owner, self._born = owner_id() + self._tag, fork_generation()
            self._engine = make_engine(self.job.catalog, keep_connection=True)
            _open.add(self)
        return self._engine

    def close(self) -> None:
        """Close the kept connection (idempotent; the next call opens another). One
        inherited from a parent process is left alone: it was closed before the fork."""
        if self._engine is not None and self._born == fork_generation():
            self._engine.dispose()
        self._engine = None

    def __enter__(self) -> IngestSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """This process's turn at the write lock among the workers of one ingest: a
        waiting worker wakes as soon as the other is done, where SQLite's busy
        handler sleeps in steps of up to 100 ms and lets a worker that commits and
        claims again at once starve the other one. Other processes (another ingest)
        still meet at the catalog's own locks. A no-op without ``turns``."""
        if self._turns is None:
            yield
            return
        with self._turns:
            yield

    # -- one shard ----------------------------------------------------------------

    def claim(
        self, only: Container[str] | None = None, retry_of: str | None = None
    ) -> ClaimedShard | None:
        """Claim a pending shard (or one whose claimer died); None when there is none.
        ``only``: only shards whose stored path is in it; ``retry_of``: also take over
        the claim of an earlier attempt of this task (see
        :func:`~shardcat.catalog.claims.claim_next`). Not in a :meth:`turn` by
        itself: the caller takes one (or claims in :meth:`commit`'s ``then``)."""
        job = self.job
        return claims.claim_next(
            self.engine, job.dataset_id, job.lease, self.owner, only=only, retry_of=retry_of
        )

    def commit(
        self,
        shard: ClaimedShard,
        version: ShardVersion,
        then: Callable[[], None] | None = None,
    ) -> tuple[int, int] | None:
        """Commit a scanned version of a claimed shard, in one transaction, if this
        process still holds the claim (None: it was lost to another process);
        returns the records committed and those dropped as duplicate keys.
        ``then`` runs after the commit in the same :meth:`turn` (a worker claims
        its next shard there); a database error in it is ignored (the caller meets
        it again)."""
        with self.turn():
            with self.engine.begin() as conn:
                if not claims.still_mine(conn, shard):
                    return None
                counts = commit.commit_shard(conn, self.job, shard, version)
            if then is not None:
                with contextlib.suppress(SQLAlchemyError):
                    then()
        return counts

    def fail(self, shard: ClaimedShard, message: str) -> bool:
        """End the claim with the shard ``failed`` (``message``), without records;
        False when the claim was no longer ``shard``'s (taken over)."""
        return claims.release(self.engine, self.job.dataset_id, shard, failed=message)

    def release(self, shard: ClaimedShard) -> None:
        """Give the claimed shard back (``pending``), for this or another process."""
        claims.release(self.engine, self.job.dataset_id, shard, failed=None)

    # -- the whole dataset --------------------------------------------------------

    def open_shards(self) -> int:
        """How many shards are still pending or being indexed."""
        return claims.open_shards(self.engine, self.job.dataset_id)

    def waiting(self, timeout: float | None) -> Waiting:
        """A wait for the shards other processes hold (see :class:`Waiting`)."""
        job = self.job

        def held() -> dict[str, int]:
            return claims.held_by_others(self.engine, job.dataset_id, job.lease)

        return Waiting(held, timeout)

    def give_back(self, tagged: str | None = None) -> None:
        """Give back the claims of this process and of its workers (gone by now), and
        those whose owner's tag starts with ``tagged`` (an ingest's Ray tasks)."""
        claims.give_back(self.engine, self.job.dataset_id, self.owner, tagged=tagged)

    def pending_shards(self) -> list[tuple[int, str]]:
        """The (id, stored path) of each shard still pending or being indexed."""
        return claims.pending_shards(self.engine, self.job.dataset_id)

    def defer_key_index(self) -> None:
        """Drop the key index of a dataset without records (see
        :func:`~shardcat.catalog.commit.defer_key_index`)."""
        commit.defer_key_index(self.engine, self.job.dataset_id)

    def finish_key_index(self) -> tuple[dict[str, str], dict[str, int]]:
        """Build the key index if it is missing (see
        :func:`~shardcat.catalog.commit.finish_key_index`)."""
        return commit.finish_key_index(self.engine, self.job)
