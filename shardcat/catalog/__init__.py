"""The catalog: schema, engine, ingest, lookup, read-only SQL."""

from __future__ import annotations

from shardcat.catalog.catalog import Catalog, DatasetInfo, resolve_paths
from shardcat.catalog.query import QueryResult

__all__ = ["Catalog", "DatasetInfo", "QueryResult", "resolve_paths"]
