"""Tensor storage whose metadata lives in SQLite: :class:`TensorBlob` and :class:`TensorDB`.

Drop-ins for the ``tensorblob`` package's classes. torch and tensordict are
an optional extra (``pip install 'shardcat[torch]'``): they are imported
when a class is first looked up here, and without them the names still
import, but using them raises ``ImportError`` with that install hint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardcat.storage.blob import TensorBlob
    from shardcat.storage.db import TensorColumn, TensorDB

__all__ = ["TensorBlob", "TensorColumn", "TensorDB"]

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
