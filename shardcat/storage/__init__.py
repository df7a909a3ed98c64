"""Tensor storage whose metadata lives in SQLite: :class:`TensorBlob` and :class:`TensorDB`.

Drop-ins for the ``tensorblob`` package's classes. torch and tensordict are
an optional extra (``pip install 'shardcat[torch]'``): they are imported
when a class is first looked up here, and without them the names still
import, but using them raises ``ImportError`` with that install hint.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardcat.storage.blob import TensorBlob
    from shardcat.storage.db import TensorColumn, TensorDB

__all__ = [
    "TensorBlob",
    "TensorColumn",
    "TensorDB",
    "convert_tensorblob",
    "is_tensorblob_dir",
    "sql_file",
]

INSTALL_HINT = "pip install 'shardcat[torch]'"


def _missing(name: str, error: ImportError) -> type:
    """A stand-in class that raises the install hint as soon as it is used."""

    def fail(*_args: Any, **_kwargs: Any) -> Any:
        raise ImportError(
            f"shardcat.{name} needs torch and tensordict ({error}): {INSTALL_HINT}"
        ) from error

    namespace = {
        "__doc__": f"{name} (unavailable: torch or tensordict is not installed).",
        "__init__": fail,
        "open": classmethod(fail),
        "unlink": classmethod(fail),
        "_convert": classmethod(fail),
    }
    return type(name, (), namespace)


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    found: Any
    try:
        if name == "TensorBlob":
            from shardcat.storage import blob

            found = blob.TensorBlob
        else:
            from shardcat.storage import db

            found = getattr(db, name)
    except ImportError as exc:
        if exc.name not in (None, "torch", "tensordict", "numpy") and not str(exc).endswith(
            INSTALL_HINT
        ):
            raise
        found = _missing(name, exc)
    globals()[name] = found
    return found


def sql_file(path: str | os.PathLike[str]) -> Path:
    """The SQLite file behind ``path``: a storage directory's metadata file, else ``path`` itself.

    What SQL ``ATTACH``-es for a TensorBlob/TensorDB (no torch needed).
    """
    from shardcat.storage.meta import sql_file as meta_sql_file

    return meta_sql_file(path)


def is_tensorblob_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory written by the tensorblob package, not yet converted."""
    from shardcat.storage.meta import probe

    return os.path.isdir(path) and probe(Path(path)) == "tensorblob"


def convert_tensorblob(path: str | os.PathLike[str]) -> tuple[str, int]:
    """Convert a tensorblob directory to SQLite metadata in place (no block is copied;
    the tensorblob package can no longer open it afterwards): returns (class name, rows).

    What opening it with a write mode does, without the warning.
    """
    from shardcat.storage.convert import tensorblob_kind
    from shardcat.storage.meta import KINDS

    directory = Path(path).expanduser().resolve()
    cls = __getattr__(KINDS[tensorblob_kind(json.loads((directory / ".conf").read_text()))])
    return cls.__name__, cls._convert(directory)
