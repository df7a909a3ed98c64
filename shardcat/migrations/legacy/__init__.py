"""Legacy index files (tfd-utils, MXNet/DALI, vahidk) into the catalog.

``catalog migrate`` / :meth:`Catalog.migrate <shardcat.Catalog.migrate>` /
:func:`migrate` find legacy indexes (:mod:`.index`: kinds, re-rooting of moved
datasets, walking a tree), make one dataset per legacy index (:mod:`.plans`),
check every shard against its file before committing its entries
(:mod:`.verify`) and report what happened (:mod:`.report`). Pickles are
untrusted: :mod:`.pickles` loads them with an unpickler that admits plain data
only. The driver that commits verified entries through the ingest lives with
the facade (:mod:`shardcat.facade.migrate`), as does what a reader does with
``index_file=`` naming a tfd-utils pickle (:mod:`shardcat.facade.legacy_index`).
"""

from __future__ import annotations

from shardcat.migrations.legacy.index import LegacyIndex, LegacyShard, discover, read_legacy_index
from shardcat.migrations.legacy.pickles import load_pickle
from shardcat.migrations.legacy.report import DatasetReport, MigrationReport, ShardReport
from shardcat.migrations.legacy.verify import DEFAULT_SAMPLE

__all__ = [
    "DEFAULT_SAMPLE",
    "DatasetReport",
    "LegacyIndex",
    "LegacyShard",
    "MigrationReport",
    "ShardReport",
    "discover",
    "load_pickle",
    "read_legacy_index",
]
