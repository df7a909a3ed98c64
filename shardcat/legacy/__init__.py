"""Legacy index files (tfd-utils, MXNet/DALI, vahidk) into the catalog.

``catalog migrate`` / :meth:`Catalog.migrate <shardcat.Catalog.migrate>` /
:func:`migrate` find legacy indexes (:mod:`.index`: kinds, re-rooting of moved
datasets, walking a tree), make one dataset per legacy index (:mod:`.plans`),
check every shard against its file before committing its entries
(:mod:`.verify`), commit them through the ingest (:mod:`.importer`) and report
what happened (:mod:`.report`). Pickles are untrusted: :mod:`.pickles` loads
them with an unpickler that admits plain data only.

:func:`catalog_for_legacy_index` (:mod:`.index_file`) is what a reader does
with ``index_file=`` naming a tfd-utils pickle instead of a catalog: import it
(verified) into a catalog beside it, once.
"""

from __future__ import annotations

from shardcat.legacy.importer import migrate
from shardcat.legacy.index import LegacyIndex, LegacyShard, discover, read_legacy_index
from shardcat.legacy.index_file import catalog_for_legacy_index, catalog_path_for
from shardcat.legacy.pickles import load_pickle
from shardcat.legacy.report import DatasetReport, MigrationReport, ShardReport
from shardcat.legacy.verify import DEFAULT_SAMPLE

__all__ = [
    "DEFAULT_SAMPLE",
    "DatasetReport",
    "LegacyIndex",
    "LegacyShard",
    "MigrationReport",
    "ShardReport",
    "catalog_for_legacy_index",
    "catalog_path_for",
    "discover",
    "load_pickle",
    "migrate",
    "read_legacy_index",
]
