"""Test harnesses shipped with the package: the format contract every container
format inherits (:mod:`shardcat.testing.formats`, a pytest base class a
third-party format can subclass too, with the contract of each capability a format
has: :mod:`shardcat.testing.capabilities`) and the churn stress (readers during
re-ingest, :mod:`shardcat.testing.churn`), and S3/HTTP servers on loopback that
count requests (:mod:`shardcat.testing.servers`)."""
