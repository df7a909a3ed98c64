"""Import paths of modules that moved in 0.2.0, kept working with a ``DeprecationWarning``.

Formats left ``shardcat.readers`` for :mod:`shardcat.formats`, byte sources for
:mod:`shardcat.sources`, and the legacy index importers ``shardcat.legacy`` for
:mod:`shardcat.migrations.legacy`. ``import shardcat`` puts :data:`FINDER` first on
``sys.meta_path`` (one dict lookup per import): an old name (``from shardcat.readers.recordio import
RecordIOWriter``) then warns once and gives the module at its new place — the
same module object, so patching either name patches both.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from types import ModuleType
from typing import Any

__all__ = ["FINDER", "MOVED"]

_FORMATS = (
    "tfrecord tar tar_headers tar_rules tar_legacy tar_salvage recordio recordio_frames "
    "irheader mxnet_idx parquet native checks"
)
_SOURCES = (
    "rawio compressed remote remote_cloud remote_file remote_get remote_hdfs remote_identity "
    "cache pool"
)

MOVED: dict[str, str] = {
    **{f"shardcat.readers.{m}": f"shardcat.formats.{m}" for m in _FORMATS.split()},
    "shardcat.readers.formats": "shardcat.formats",
    **{f"shardcat.readers.{m}": f"shardcat.sources.{m}" for m in _SOURCES.split()},
    "shardcat.readers.source": "shardcat.sources.local",
    "shardcat.legacy": "shardcat.migrations.legacy",
    **{
        f"shardcat.legacy.{m}": f"shardcat.migrations.legacy.{m}"
        for m in ("index", "pickles", "plans", "remote", "report", "verify")
    },
}


class _MovedFinder:
    """A meta path finder and loader for the names in :data:`MOVED` only."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in MOVED:
            return None
        from importlib.machinery import ModuleSpec

        return ModuleSpec(name, self)  # type: ignore[arg-type]  # a Loader by its methods

    def create_module(self, spec: Any) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new} in shardcat 0.2.0; import it from there",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(new)
        spec.loader_state = module.__spec__  # the import system sets __spec__ to ours next
        return module

    def exec_module(self, module: ModuleType) -> None:
        ours: Any = module.__spec__
        module.__spec__ = ours.loader_state  # the module's own spec back


FINDER = _MovedFinder()


def install() -> None:
    if FINDER not in sys.meta_path:
        sys.meta_path.insert(0, FINDER)  # before the path finder: shardcat.legacy's
        # __path__ is the new folder, where it would load a second copy of a module
