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

import hashlib
import os
import re
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path, PurePosixPath

import pytest

pytest.importorskip("torch")
pytest.importorskip("tensordict")

ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.3.0"
SDIST = ROOT / ".peer" / f"tensorblob-{VERSION}.tar.gz"
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


@pytest.fixture(scope="module")
def sdist() -> Path:
    if not SDIST.is_file():
        message = (
            f"tensorblob's sdist is not in .peer/: run `make peer-tensorblob` "
            f"(pip download --no-deps --no-binary :all: tensorblob=={VERSION} -d .peer)"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    digest = hashlib.sha256(SDIST.read_bytes()).hexdigest()
    assert digest == SDIST_SHA256, f"{SDIST.name}: unexpected sha256 {digest}"
    return SDIST


def unpack_tests(sdist: Path, dest: Path) -> Path:
    """Write the sdist's ``tests/`` files under ``dest``; returns the unpacked root."""
    prefix = PurePosixPath(f"tensorblob-{VERSION}", "tests")
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            name = PurePosixPath(member.name)
            if not member.isfile() or prefix not in name.parents:
                continue
            parts = name.relative_to(prefix.parent).parts
            assert ".." not in parts and not name.is_absolute(), member.name
            target = dest.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None
            target.write_bytes(source.read())
    assert (dest / "tests" / "conftest.py").is_file()
    return dest


def peer_env(shim_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(shim_dir), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def test_tensorblob_suite_passes_against_shardcat(sdist: Path, tmp_path: Path) -> None:
    peer = unpack_tests(sdist, tmp_path / "peer")
    shim_dir = tmp_path / "shim"
    shim_dir.mkdir()
    (shim_dir / "tensorblob.py").write_text(SHIM)
    env = peer_env(shim_dir)

    which = subprocess.run(
        [
            sys.executable,
            "-c",
            "import tensorblob as t; print(t.TensorBlob.__module__, t.TensorDB.__module__)",
        ],
        cwd=peer,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert which.stdout.split() == ["shardcat.storage.blob", "shardcat.storage.db"]

    skipped = excluded()
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    report = tmp_path / "report.xml"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-c",
            str(tmp_path / "pytest.ini"),
            "--rootdir",
            str(peer),
            "--basetemp",
            str(tmp_path / "basetemp"),
            "--junitxml",
            str(report),
            *[f"--deselect={node}" for node in skipped],
            "tests",
        ],
        cwd=peer,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    print(f"tensorblob {VERSION}'s suite against shardcat: {summary}")
    cases = ET.parse(report).getroot().iter("testcase")
    outcomes: dict[str, str] = {}
    for case in cases:
        node = f"{case.get('classname')}::{case.get('name')}"
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcomes[node] = kinds[0] if kinds else "passed"
    bad = {node: kind for node, kind in outcomes.items() if kind != "passed"}
    assert not bad, f"{summary}\n{bad}\n{result.stdout[-20_000:]}"
    assert result.returncode == 0, f"{summary}\n{result.stdout[-5_000:]}{result.stderr[-5_000:]}"
    deselected = re.search(r"(\d+) deselected", summary)
    # a --deselect that matches no test is ignored by pytest: the count proves each one exists
    assert deselected is not None and int(deselected.group(1)) == len(skipped), summary
    assert len(outcomes) == TOTAL - len(skipped), summary
    assert len(outcomes) + len(skipped) == TOTAL
