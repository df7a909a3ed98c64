"""What every ingest takes: one frozen :class:`IngestOptions`, and the one shape of
progress callbacks.

``Catalog.ingest(...)``, ``catalog migrate`` (through :func:`shardcat.facade.migrate.migrate`)
and the drop-in readers build one :class:`IngestOptions` and hand it down as it
is, instead of threading each option through every signature.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from shardcat.catalog.claims import DEFAULT_LEASE
from shardcat.catalog.commit import BAD_RECORD_POLICIES, DUPLICATE_POLICIES
from shardcat.errors import CatalogError, Hint

__all__ = ["INGEST_ENGINES", "KEEP", "IngestOptions", "Keep", "Progress"]

#: where an ingest scans its shards: here (forked workers) or as Ray tasks
INGEST_ENGINES = ("local", "ray")

#: ``progress(done, total)``: called after each unit of work with what was just done
#: (a shard's :class:`~shardcat.facade.ingest.ShardOutcome`, a verified record count,
#: a migration step, a converted archive) and how many units there are in all.
Progress = Callable[[Any, int], None]


class Keep:
    """Default of ``key``: keep the dataset's key rule (new datasets: ``"key"``)."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP = Keep()


@dataclass(frozen=True)
class IngestOptions:
    """How shards are indexed (see :meth:`shardcat.Catalog.ingest` for each one).

    ``format`` None or ``"auto"``: detected from the first shard's bytes; ``key``
    :data:`KEEP`: as the dataset was ingested (None: by position); ``fields`` and
    ``grouping`` None: as stored; ``options``: further format options (they win
    over the others); ``workers`` None: one per shard up to the CPU count;
    ``wait_timeout``: seconds to wait for shards other live processes hold
    (None: as long as they take); ``engine``: where shards are scanned, ``"local"``
    (``workers`` processes here) or ``"ray"`` (tasks on the Ray cluster at
    ``ray_address``; None: ``ray.init()``'s usual discovery).
    """

    format: str | None = None
    key: str | Keep | None = KEEP
    fields: bool | None = None
    grouping: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    workers: int | None = None
    on_duplicate: str = "error"
    rescan: bool = False
    lease: float = DEFAULT_LEASE
    on_bad_record: str = "raise"
    wait_timeout: float | None = None
    engine: str = "local"
    ray_address: str | None = None

    def __post_init__(self) -> None:
        if self.engine not in INGEST_ENGINES:
            raise CatalogError(
                f"engine must be one of {', '.join(INGEST_ENGINES)}, not {self.engine!r}"
            )
        if self.on_bad_record not in BAD_RECORD_POLICIES:
            raise CatalogError(
                f"must be one of {', '.join(BAD_RECORD_POLICIES)}, not {self.on_bad_record!r}",
                hint=Hint("on_bad_record", "--on-bad-record", lead=True),
            )
        if self.on_duplicate not in DUPLICATE_POLICIES:
            raise CatalogError(
                f"must be one of {', '.join(DUPLICATE_POLICIES)}, not {self.on_duplicate!r}",
                hint=Hint("on_duplicate", "--on-duplicate", lead=True),
            )

    def explicit(self) -> dict[str, Any]:
        """The format options these set (what overrides detected and stored ones)."""
        return {
            **({} if isinstance(self.key, Keep) else {"key": self.key}),
            **({} if self.fields is None else {"fields": self.fields}),
            **({} if self.grouping is None else {"grouping": self.grouping}),
            **self.options,
        }

    def with_(self, **changes: Any) -> IngestOptions:
        """A copy with ``changes``."""
        return replace(self, **changes)
