"""The sources a reader holds open, one per shard, keyed by process.

A reader opens a shard's source (:func:`~shardcat.sources.local.open_source`)
on its first read and keeps it, up to ``size`` of them (the oldest is closed
first). The pool belongs to the process that filled it: every call of a
reader begins with :meth:`SourcePool.for_this_process` (before any read of
that call), so after ``fork`` (DataLoader workers) a child starts from an
empty pool and never touches its parent's file descriptors, decompressors or
sessions (nor closes them). Sources of shard versions that are gone are closed
when the reader reloads its shard list.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from shardcat.sources.rawio import Source

__all__ = ["SourcePool"]

_generation = 0  # bumped in every forked child: a pool filled before the fork is its parent's


def _forked() -> None:
    global _generation
    _generation += 1


os.register_at_fork(after_in_child=_forked)


class SourcePool:
    """Open sources by shard id, for this process only (see the module docstring).

    ``sources`` is the map itself: reads look a source up there directly (a
    dict lookup is the whole cost on the hot path) after the call began with
    :meth:`for_this_process` (``generation``: the fork generation the pool
    belongs to, for callers that check it inline).
    """

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self.sources: dict[int, Source] = {}
        self.generation = _generation

    def for_this_process(self) -> None:
        """Forget the sources of the parent process in a forked child (they are
        never used nor closed here)."""
        if self.generation != _generation:
            self.sources, self.generation = {}, _generation

    def add(self, shard_id: int, source: Source) -> Source:
        """Keep ``source`` as the open source of ``shard_id``; the oldest is closed
        when the pool is full."""
        self.for_this_process()
        if len(self.sources) >= self.size:
            self.sources.pop(next(iter(self.sources))).close()
        self.sources[shard_id] = source
        return source

    def keep(self, current: Mapping[int, int], before: Mapping[int, int]) -> None:
        """Close the sources of shards whose indexed version (shard id -> generation)
        changed or went away between ``before`` and ``current``."""
        self.for_this_process()
        for shard_id in list(self.sources):
            if current.get(shard_id) is None or current.get(shard_id) != before.get(shard_id):
                self.sources.pop(shard_id).close()

    def close(self) -> None:
        """Close this process's sources (a forked child's inherited ones stay untouched)."""
        if self.generation == _generation:
            for source in self.sources.values():
                source.close()
        self.sources = {}
