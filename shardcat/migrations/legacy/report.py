"""What a migration did: per shard, per dataset, in all (:func:`~shardcat.facade.migrate.migrate`
returns a :class:`MigrationReport`; ``catalog migrate`` prints it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["DatasetReport", "MigrationReport", "ShardReport"]


def _totals(shards: list[ShardReport], dry_run: bool) -> dict[str, int]:
    imported = "import" if dry_run else "imported"
    reindexed = "re-index" if dry_run else "re-indexed"
    return {
        "imported": sum(s.action == imported for s in shards),
        "verified": sum(s.verified for s in shards),
        "re-indexed": sum(s.action == reindexed for s in shards),
        "unchanged": sum(s.action == "unchanged" for s in shards),
        "failed": sum(s.action == "failed" for s in shards),
    }


@dataclass
class ShardReport:
    """What happened to one shard.

    ``action``: ``imported`` (legacy entries verified and committed),
    ``re-indexed`` (scanned from its data; ``reason`` says why), ``unchanged``
    (already in the catalog), ``failed`` (``reason`` holds the error), or with
    ``dry_run`` ``import``/``re-index``. ``checked``: entries re-read while
    verifying; ``verified``: whether the legacy entries passed.
    """

    path: str
    legacy: str | None
    action: str
    records: int = 0
    verified: bool = False
    checked: int = 0
    resolved_by: str = ""
    reason: str | None = None


@dataclass
class DatasetReport:
    """What happened to one dataset: where it went (``catalog``), how it is keyed,
    the ``legacy`` index files it came from, its ``source`` patterns and its shards.
    ``fill_fields``: the command that fills the SQL fields later; ``notes``:
    what else to know (e.g. RecordIO keyed by position); ``dropped``: records
    ``on_duplicate`` dropped."""

    dataset: str
    catalog: str
    format: str
    key_rule: str
    legacy: list[str]
    source: list[str]
    fields: bool
    shards: list[ShardReport]
    fill_fields: str | None = None  # the command that fills the SQL fields later
    notes: list[str] = field(default_factory=list)  # what the user should know (key rule...)
    dropped: int = 0  # records on_duplicate dropped (as the ingest reports them)

    def count(self, action: str) -> int:
        return sum(1 for s in self.shards if s.action == action)

    def totals(self, dry_run: bool) -> dict[str, int]:
        """Shards per outcome (``imported`` and ``re-indexed`` count the dry run's
        ``import``/``re-index`` too; ``verified``: legacy entries that passed)."""
        return _totals(self.shards, dry_run)

    @property
    def records(self) -> int:
        return sum(s.records for s in self.shards)


@dataclass
class MigrationReport:
    """The outcome of :func:`migrate`: one :class:`DatasetReport` per dataset,
    and the index-like files that were not imported, with the reason."""

    dry_run: bool
    datasets: list[DatasetReport]
    skipped: list[tuple[str, str]]
    on_duplicate: str = "error"  # the policy the datasets' duplicate keys followed

    def totals(self) -> dict[str, int]:
        """Shards per outcome, over every dataset (see :meth:`DatasetReport.totals`)."""
        return _totals([s for d in self.datasets for s in d.shards], self.dry_run)

    @property
    def failed(self) -> bool:
        return any(s.action == "failed" for d in self.datasets for s in d.shards)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "on_duplicate": self.on_duplicate,
            "totals": self.totals(),
            "datasets": [asdict(d) for d in self.datasets],
            "skipped": [{"path": p, "reason": r} for p, r in self.skipped],
        }
