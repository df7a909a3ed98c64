from __future__ import annotations

import pytest

from shardcat.catalog.store import open_catalogs


@pytest.fixture(autouse=True)
def _no_leaked_catalogs(monkeypatch: pytest.MonkeyPatch):
    """Fail a test that leaves a Catalog (or a reader that owns one) open."""
    monkeypatch.delenv("SHARDCAT_CATALOG", raising=False)
    before = set(map(id, open_catalogs()))
    yield
    leaked = [c for c in open_catalogs() if id(c) not in before]
    for catalog in leaked:
        catalog.close()
    assert not leaked, f"test left catalogs open: {leaked}"


@pytest.fixture(autouse=True, scope="session")
def _no_catalog_in_the_working_directory():
    """Fail the run if a test left a catalog in the directory pytest runs from
    (commands without --catalog use ./shardcat.sqlite: tests must pass -c or chdir)."""
    from pathlib import Path

    stray = Path("shardcat.sqlite")
    existed = stray.exists()
    yield
    assert existed or not stray.exists(), "a test wrote ./shardcat.sqlite: pass -c or chdir"


@pytest.fixture
def catalogs():
    """``catalogs(path)``: a Catalog closed when the test ends."""
    from shardcat import Catalog

    opened = []

    def make(path):
        opened.append(Catalog(path))
        return opened[-1]

    yield make
    for cat in opened:
        cat.close()
