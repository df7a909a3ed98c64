"""tensorblob 0.3.0's own test suite, run against shardcat's TensorBlob and TensorDB.

"Drop-in" means passing the peer's public tests, not our idea of them. The
tests are not copied here: ``make test`` downloads tensorblob's sdist into the
git-ignored ``.peer/`` (``make peer-tensorblob``), and this module unpacks its
``tests/`` into a temporary directory and runs them with pytest in a
subprocess, with a one-line ``tensorblob`` module first on ``PYTHONPATH`` that
re-exports shardcat's classes (the real tensorblob is installed too, as the
``bench`` extra: the shim must win, and that is checked).

Every public-API test must pass. The tests that look at tensorblob's insides
(its ``.conf``/``.stat`` JSON files, private attributes, its LRU module, its
one-blob-per-field layout) are listed in ``INTERNALS`` with the reason and
deselected, never skipped; the run checks that each of them still exists.
"""

from __future__ import annotations

import os
from pathlib import Path

from peer_suite import imported, peer_env, run_suite, sdist, unpack_tests

from shardcat.testing.required import need

need("torch", why="shardcat[torch]")
need("tensordict", why="shardcat[torch]")

VERSION = "0.3.0"
SDIST_SHA256 = "b1d5ef41eff291fd7e63a65a9b37aaabb6e70f1246c22ac19a9c9408e9e84a2f"
SHIM = "from shardcat.storage import TensorBlob, TensorDB  # noqa: F401\n"
TOTAL = 227  # tests that tensorblob 0.3.0's suite collects

_MODES = "private mode flags _m_rd/_m_wr/_m_ap"
_BLOCKS = "counts tensorblob's block list in the private _status.bds (the .stat file)"
_LRU = "tensorblob's private LRU cache (tensorblob._lru, _memmap, _status.bds)"
_CONF = "looks for tensorblob's .conf/.stat JSON files (shardcat keeps them in SQLite)"
_CORRUPT = "deletes tensorblob's .conf/.stat to corrupt the directory (shardcat has neither)"
_COLUMN = (
    "opens one field's sub-directory as a standalone TensorBlob to make it run ahead "
    "of the database's .stat (tensorblob's layout: a .conf/.stat blob per field); "
    "shardcat commits every field in one SQLite transaction and has no per-field blob"
)
_COLS = "private _cols (tensorblob's TensorBlob per field)"

INTERNALS: dict[str, str] = {
    "tests/test_db.py::TestModeValidation::test_valid_modes": _MODES,
    "tests/test_db.py::TestModeValidation::test_valid_write_plus_mode": _MODES,
    "tests/test_db.py::TestSchemaValidation::test_block_size_persisted_per_column": _COLS,
    "tests/test_db.py::TestSchemaValidation::test_max_cached_blocks_passed_through": _COLS,
    "tests/test_db.py::TestUnlink::test_unlink_corrupted_db": _CORRUPT,
    "tests/test_db.py::TestConsistencyRepair::test_repair_on_writable_open": _COLUMN,
    "tests/test_db.py::TestConsistencyRepair::test_read_only_open_reports_committed_length": (
        _COLUMN
    ),
    "tests/test_extend.py::TestTruncateMultiBlock::test_truncate_partial_block": _BLOCKS,
    "tests/test_extend.py::TestTruncateMultiBlock::test_truncate_at_block_boundary": _BLOCKS,
    "tests/test_extend.py::TestTruncateMultiBlock::test_truncate_removes_blocks": _BLOCKS,
    "tests/test_io.py::TestMultiBlock::test_write_across_blocks": _BLOCKS,
    "tests/test_lru_cache.py::TestLRUCache::test_invalid_maxsize": _LRU,
    "tests/test_lru_cache.py::TestLRUCache::test_cache_limits_loaded_blocks": _LRU,
    "tests/test_lru_cache.py::TestLRUCache::test_lru_eviction_on_access": _LRU,
    "tests/test_lru_cache.py::TestLRUCache::test_lru_eviction_order": _LRU,
    "tests/test_lru_cache.py::TestLRUCache::test_cache_clears_on_truncate": _LRU,
    "tests/test_lru_cache.py::TestLRUCache::test_custom_cache_size": _LRU,
    "tests/test_lru_cache.py::TestLRUCache::test_lazy_loading": _LRU,
    "tests/test_open.py::TestModeValidation::test_valid_read_mode": _MODES,
    "tests/test_open.py::TestModeValidation::test_valid_write_mode": _MODES,
    "tests/test_open.py::TestModeValidation::test_valid_append_mode": _MODES,
    "tests/test_open.py::TestModeValidation::test_valid_read_plus_mode": _MODES,
    "tests/test_open.py::TestModeValidation::test_valid_write_plus_mode": _MODES,
    "tests/test_open.py::TestModeValidation::test_valid_append_plus_mode": _MODES,
    "tests/test_unlink.py::test_unlink_existing_blob": _CONF,
    "tests/test_unlink.py::test_unlink_empty_blob": _CONF,
    "tests/test_unlink.py::test_unlink_multi_block_blob": (
        "counts the files that are not .conf/.stat as block files (shardcat's "
        "metadata file is one more)"
    ),
    "tests/test_unlink.py::test_unlink_with_corrupted_status": _CORRUPT,
    "tests/test_unlink.py::test_unlink_with_missing_config": _CORRUPT,
}

# Excluded only when the suite runs as root, which ignores directory permissions:
# the test then fails against tensorblob itself.
AS_ROOT: dict[str, str] = {
    "tests/test_unlink.py::test_unlink_returns_false_on_permission_error": (
        "a read-only directory does not stop root from deleting it (fails for tensorblob too)"
    ),
}


def excluded() -> dict[str, str]:
    running_as_root = hasattr(os, "geteuid") and os.geteuid() == 0
    return {**INTERNALS, **(AS_ROOT if running_as_root else {})}


def test_tensorblob_suite_passes_against_shardcat(tmp_path: Path) -> None:
    archive = sdist(f"tensorblob-{VERSION}.tar.gz", SDIST_SHA256, "peer-tensorblob")
    peer = unpack_tests(archive, f"tensorblob-{VERSION}", tmp_path / "peer")
    shim_dir = tmp_path / "shim"
    shim_dir.mkdir()
    (shim_dir / "tensorblob.py").write_text(SHIM)
    env = peer_env(shim_dir)
    assert imported(
        "import tensorblob as t; print(t.TensorBlob.__module__, t.TensorDB.__module__)", peer, env
    ) == ["shardcat.storage.blob", "shardcat.storage.db"]

    skipped = excluded()
    run = run_suite(peer, env, tmp_path, ["tests"], list(skipped))
    print(f"tensorblob {VERSION}'s suite against shardcat: {run.summary}")
    assert len(run.outcomes) == TOTAL - len(skipped), run.summary
