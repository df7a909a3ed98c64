"""The one rule for what a test needs: skipped where it is missing, a failure in CI.

shardcat's CI runs with ``CI=true`` (exactly that value) and installs every extra,
the peers' sdists, PostgreSQL and azurite, and builds both C extensions; there
nothing may quietly skip (the contract suite of :mod:`shardcat.testing.formats`
follows the same rule: with ``CI=true`` its compressed cases need
``shardcat[compressed]``). The core-only run (the Makefile's ``.venv-core``, no extras) sets
``SHARDCAT_TEST_CORE_ONLY=1``: an extra is not required there, a built extension is.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest

CI = os.environ.get("CI") == "true"
CORE_ONLY = os.environ.get("SHARDCAT_TEST_CORE_ONLY") == "1"


def missing(why: str, *, extra: bool = True) -> NoReturn:
    """Skip (``why``), or fail in CI; ``extra=False``: fail in the core-only CI run too
    (what ``pip install`` itself provides, such as the C extensions)."""
    if CI and not (extra and CORE_ONLY):
        pytest.fail(f"required in CI (CI=true): {why}", pytrace=False)
    pytest.skip(why, allow_module_level=True)


def need(*modules: str, why: str) -> ModuleType:
    """Import ``modules`` (an extra's); the first one, or :func:`missing`."""
    found = []
    for name in modules:
        try:
            found.append(importlib.import_module(name))
        except ImportError as exc:
            missing(f"{why} ({exc})")
    return found[0]


def needs(available: bool, why: str, *, extra: bool = True) -> pytest.MarkDecorator:
    """A mark for the tests that need what ``available`` says is there: a skip
    without it, and in CI (see :func:`missing`) a failure of the module's collection."""
    if not available and CI and not (extra and CORE_ONLY):
        missing(why, extra=extra)
    return pytest.mark.skipif(not available, reason=why)
