"""The one way a catalog is opened, by the library (``Catalog(path)``) and by every
``catalog`` command alike: where it is (its backend, chosen once by
:func:`~shardcat.catalog.backend.backend_for`), in which :class:`Mode`
(write, read-only, immutable), the checks before anything is opened (the file
there unless it may be created, its directory there unless it may be made,
writable when opened for writing), and the schema upgrade of an older catalog
before the store opens it for writing (the steps of :mod:`shardcat.migrations.schema`
under the store's create/upgrade lock; a read-only open never upgrades).
:func:`open_with` does all of it. Each refusal is a :class:`CatalogError`
saying why, with a :class:`~shardcat.errors.Hint` where there is something to do.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from shardcat.catalog.backend import Backend, backend_for
from shardcat.catalog.engine import cannot_create_in, existing_ancestor, write_problem
from shardcat.catalog.names import ENV_VAR
from shardcat.catalog.versions import say_upgraded
from shardcat.errors import CatalogError, Hint, SchemaVersionError
from shardcat.migrations import schema

__all__ = ["Mode", "open_with", "upgrade"]

T = TypeVar("T")


class Mode(enum.Enum):
    """How a catalog is opened: for writing (created or upgraded when needed),
    read-only (never created, upgraded or changed), or immutable (read-only, and no
    process writes it: no locks taken)."""

    WRITE = "write"
    READ_ONLY = "readonly"
    IMMUTABLE = "immutable"

    @classmethod
    def of(cls, *, readonly: bool = False, immutable: bool = False) -> Mode:
        """The mode of ``Catalog(path, readonly=..., immutable=...)``."""
        return cls.IMMUTABLE if immutable else cls.READ_ONLY if readonly else cls.WRITE

    @property
    def readonly(self) -> bool:
        return self is not Mode.WRITE

    @property
    def immutable(self) -> bool:
        return self is Mode.IMMUTABLE


def open_with(
    store: Callable[[Path | str, Mode], T],
    path: str | os.PathLike[str] | None,
    mode: Mode,
    *,
    create: bool = True,
    make_dirs: bool = True,
) -> T:
    """Open the catalog ``path`` names (None: ``$SHARDCAT_CATALOG``, else
    ``./shardcat.sqlite``) in ``mode``: checked (:func:`_check`), then
    ``store(where, mode)`` (the store's open; ``where``: the file, absolute, or the
    server's URL), after upgrading the schema of an older catalog opened for
    writing (:func:`_open_upgrading`). ``create``/``make_dirs`` False: a missing
    file or directory is refused instead of created (the commands but ``catalog
    ingest``)."""
    backend = backend_for(path)
    _check(backend, mode, create=create, make_dirs=make_dirs)
    return _open_upgrading(store, backend, mode)


def _check(backend: Backend, mode: Mode, *, create: bool, make_dirs: bool) -> None:
    """Refuse, before anything is opened, a catalog file that is not there (unless
    ``create``), whose directory is not there (unless ``make_dirs``), or that cannot
    be written (``mode`` WRITE). A server catalog is not checked (the server says
    what it refuses)."""
    where = backend.local_file
    if where is None:
        return
    ancestor = existing_ancestor(where)
    if not (create and mode is Mode.WRITE) and not where.is_file():
        if where.is_dir():
            raise CatalogError(f"no catalog at {where}: it is a directory")
        if not ancestor.is_dir():
            raise CatalogError(f"no catalog at {where}: {ancestor} is not a directory")
        raise CatalogError(
            f"no catalog at {where}:",
            hint=Hint(
                f"pass the catalog's path, set ${ENV_VAR}, or create one with Catalog.ingest()",
                f"pass --catalog FILE, set ${ENV_VAR}, or create one with `catalog ingest`",
            ),
        )
    if create and not make_dirs and ancestor != where.parent and ancestor.is_dir():
        raise CatalogError(
            f"cannot create catalog {where}: no directory {where.parent}",
            hint=Hint.naming("make_dirs=True", "--mkdir", before="(create it, or pass ", after=")"),
        )
    if mode is Mode.WRITE:
        problem = write_problem(where)
        if problem is not None:
            read_only = problem.startswith("cannot write")
            raise CatalogError(
                problem + (" (commands that only read it work)" if read_only else "")
            )


def _open_upgrading(open_: Callable[[Path | str, Mode], T], backend: Backend, mode: Mode) -> T:
    """``open_(where, mode)`` (the store's open); a catalog of an older schema opened
    for writing is upgraded first (:func:`upgrade`, said once with a
    :class:`~shardcat.ShardcatWarning`) and then opened. A read-only open of a file
    SQLite cannot create the ``-shm`` file beside says so and names ``--immutable``."""
    where, file = backend.where, backend.local_file
    try:
        return open_(where, mode)
    except SchemaVersionError as exc:
        if mode is not Mode.WRITE or exc.found is None:
            raise
    except CatalogError as exc:
        # SQLite refuses a read-only open it cannot create the -shm file for when the
        # directory is read-only by permissions (SQLITE_READONLY_DIRECTORY).
        if mode is not Mode.READ_ONLY or file is None:
            raise
        blocked = cannot_create_in(file.parent)
        if blocked is None or not str(exc).endswith("attempt to write a readonly database"):
            raise
        raise CatalogError(
            f"cannot open catalog {file} read-only: SQLite needs to create {file.name}-shm "
            f"beside it, but {blocked};",
            hint=Hint.naming("immutable=True", "--immutable", after=" reads it without one"),
        ) from None
    found, _ = upgrade(where)
    say_upgraded(backend.display, found)
    return open_(where, mode)


def upgrade(where: str | os.PathLike[str]) -> tuple[int, int]:
    """Upgrade the schema of the catalog at ``where`` in place (see
    :func:`shardcat.migrations.schema.upgrade`); returns ``(version found, version now)``."""
    return schema.upgrade(where)
