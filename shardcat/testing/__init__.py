"""Test harnesses shipped with the package: the churn stress (readers during re-ingest)."""
