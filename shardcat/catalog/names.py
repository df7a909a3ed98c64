"""The catalog's names and defaults that the command line shows in its help: the
environment variable and default file name of the catalog, the duplicate-key
and bad-record policies and the query's time and memory limits. No imports, so
``catalog --help`` stays fast."""

from __future__ import annotations

__all__ = [
    "BAD_RECORD_POLICIES",
    "DEFAULT_NAME",
    "DEFAULT_QUERY_MEMORY",
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
# Bytes a query's rows may hold in this process (``memory=None``: no limit); a
# streamed result holds one row at a time, so there it bounds any one value.
DEFAULT_QUERY_MEMORY = 256 * 2**20
