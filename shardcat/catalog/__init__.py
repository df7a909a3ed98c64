"""The store: the catalog as SQL and nothing else (schema, engine, schema versions,
claims, ingest transactions, the readers' lookups, read-only SQL, export rows).

It imports no other shardcat package but :mod:`shardcat.errors`, never opens a
shard and knows no format; :class:`shardcat.Catalog` (:mod:`shardcat.facade`)
combines it with the formats and sources.
"""

from __future__ import annotations

from shardcat.catalog.datasets import DatasetInfo
from shardcat.catalog.query import QueryResult
from shardcat.catalog.store import Store

__all__ = ["DatasetInfo", "QueryResult", "Store"]
