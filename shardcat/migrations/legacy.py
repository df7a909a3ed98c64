"""Importing legacy index files into the catalog: moved to :mod:`shardcat.legacy`
(one module per step); the names below stay importable from here."""

from __future__ import annotations

from shardcat.legacy import (
    DEFAULT_SAMPLE,
    DatasetReport,
    LegacyIndex,
    LegacyShard,
    MigrationReport,
    ShardReport,
    catalog_for_legacy_index,
    discover,
    load_pickle,
    migrate,
    read_legacy_index,
)

__all__ = [
    "DEFAULT_SAMPLE",
    "DatasetReport",
    "LegacyIndex",
    "LegacyShard",
    "MigrationReport",
    "ShardReport",
    "catalog_for_legacy_index",
    "discover",
    "load_pickle",
    "migrate",
    "read_legacy_index",
]
