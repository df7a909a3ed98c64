"""The store: the catalog as SQL and nothing else (schema, engine, schema versions,
claims, ingest transactions, the readers' lookups, read-only SQL, export rows).

It imports no other shardcat package but :mod:`shardcat.errors`, never opens a
shard and knows no format; :class:`shardcat.Catalog` (:mod:`shardcat.facade`)
combines it with the formats and sources.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardcat.catalog.datasets import DatasetInfo
    from shardcat.catalog.query import QueryResult
    from shardcat.catalog.store import Store

__all__ = ["DatasetInfo", "QueryResult", "Store"]

# Imported on first use, so a light module of the package (names.py) imports alone.
_LAZY = {
    "DatasetInfo": "shardcat.catalog.datasets",
    "QueryResult": "shardcat.catalog.query",
    "Store": "shardcat.catalog.store",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:  # a module of the package used as an attribute (catalog.engine)
        if importlib.util.find_spec(f"{__name__}.{name}") is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return importlib.import_module(f"{__name__}.{name}")
    return getattr(importlib.import_module(module), name)
