"""The catalog's names and defaults that the command line shows in its help: the
environment variable and default file name of the catalog, the duplicate-key
and bad-record policies and the query timeout. No imports, so ``catalog --help`` stays fast."""

from __future__ import annotations

__all__ = [
    "BAD_RECORD_POLICIES",
    "DEFAULT_NAME",
    "DEFAULT_QUERY_TIMEOUT",
    "DUPLICATE_POLICIES",
    "ENV_VAR",
]

ENV_VAR = "SHARDCAT_CATALOG"
DEFAULT_NAME = "shardcat.sqlite"
DUPLICATE_POLICIES = ("error", "first", "last")
# what a scan does at a damaged record: fail its shard, or set it aside and go on
BAD_RECORD_POLICIES = ("raise", "skip")
# Seconds a query may run before it is stopped (``timeout=None``: no limit).
DEFAULT_QUERY_TIMEOUT = 60.0
