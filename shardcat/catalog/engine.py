"""The SQLite file plumbing under the catalog's backends: where a catalog file
lives, engines that never cross ``fork``, the writers' pragmas, read-only
connections, WAL checkpoints and what the ``-shm`` wal-index says about them
(which backend a catalog has: :mod:`~shardcat.catalog.backend`)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.pool import NullPool, QueuePool

from shardcat.catalog.names import DEFAULT_NAME, ENV_VAR
from shardcat.errors import CatalogError

BUSY_TIMEOUT_MS = 60_000
# How much of a catalog file a read-only connection maps (``PRAGMA mmap_size``) where
# it may (:func:`mappable`): a page SQLite's own cache misses is then a memory read,
# not a system call, and the pages are the page cache's, shared by every process.
READ_MMAP_BYTES = 1 << 30
# Filesystems whose files are mapped (a block device or memory under this host's
# kernel; never a network or FUSE one, where an I/O error on a mapped page is SIGBUS)
_LOCAL_FILESYSTEMS = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay", "zfs", "f2fs"}
)
# How long ``Catalog.checkpoint()`` waits for readers and writers to empty the -wal file.
CHECKPOINT_BUSY_MS = 500

# The -shm wal-index (https://www.sqlite.org/walformat.html), in native byte order:
# two copies of a 48-byte header (isInit at byte 12, mxFrame, the last valid frame
# of the WAL, at byte 16), then the checkpoint info (nBackfill, the frames already
# copied back into the main file, at byte 96).
_HEADER_SIZE = 48
_IS_INIT = 12
_MX_FRAME = 16
_N_BACKFILL = 96

# Incremented in every forked child, so objects holding connections can tell
# that they now live in a new process and must reopen (see ``after_fork``).
_fork_generation = 0


def _bump_generation() -> None:
    global _fork_generation
    _fork_generation += 1


os.register_at_fork(after_in_child=_bump_generation)


def fork_generation() -> int:
    return _fork_generation


def _writable_dir(directory: Path) -> bool:
    return directory.is_dir() and os.access(directory, os.W_OK | os.X_OK)


def user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "shardcat"


def _sqlite_path(where: str) -> str:
    """The file a ``sqlite:///`` URL names (SQLAlchemy's spelling: ``sqlite:///rel.db``,
    ``sqlite:////abs/path.db``); anything else is a path already."""
    return where[len("sqlite:///") :] if where.startswith("sqlite:///") else where


def locate(explicit: str | os.PathLike[str] | None, shard_dir: str | None = None) -> Path:
    """The catalog file to use.

    An explicit path (or ``sqlite:///`` URL) wins, then ``$SHARDCAT_CATALOG``. Without ``shard_dir``
    (``Catalog()`` and every ``catalog`` command: one rule, so ``catalog
    ingest`` and then ``catalog query`` from the same directory meet) it is
    ``./shardcat.sqlite`` in the current directory. With ``shard_dir`` (the
    readers opened on shard paths, keeping tfd-utils' habit of an index beside
    the data) it is ``shardcat.sqlite`` in that directory, or, when that
    directory is not writable and holds no catalog yet, a file named after the
    directory in the per-user cache directory.
    """
    if explicit is not None:
        return Path(_sqlite_path(os.fspath(explicit))).expanduser()
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(_sqlite_path(env)).expanduser()
    if shard_dir is None:
        return Path(DEFAULT_NAME)
    directory = Path(shard_dir).resolve()
    beside = directory / DEFAULT_NAME
    if beside.exists() or _writable_dir(directory):
        return beside
    digest = hashlib.sha1(str(directory).encode()).hexdigest()[:16]
    return user_cache_dir() / f"{directory.name}-{digest}.sqlite"


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def cannot_create_in(directory: Path) -> str | None:
    """Why this process cannot create files in ``directory`` (None: it can)."""
    if os.access(directory, os.W_OK | os.X_OK):
        return None
    if _read_only_fs(directory):
        return f"{directory} is on a read-only file system"
    return f"no permission to create files in {directory}"


def existing_ancestor(path: Path) -> Path:
    """The nearest of ``path``'s parents that exists (it may be a file)."""
    parent = path.parent
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    return parent


def write_problem(path: Path) -> str | None:
    """Why a catalog cannot be created or written at ``path``: a message naming it,
    or None when nothing on disk says so.

    Checked the way this process would be checked (root passes mode bits but
    not a read-only mount), so a command can say so before it starts, instead
    of SQLite failing halfway with "attempt to write a readonly database".
    A WAL catalog needs its ``-wal`` and ``-shm`` files beside it too.
    """
    path = path.absolute()
    if path.is_dir():
        return f"cannot open catalog {path}: it is a directory"
    if not path.exists():
        ancestor = existing_ancestor(path)
        if not ancestor.is_dir():
            return f"cannot create catalog {path}: {ancestor} is not a directory"
        why = cannot_create_in(ancestor)
        return None if why is None else f"cannot create catalog {path}: {why}"
    if not os.access(path, os.W_OK):
        why = (
            "it is on a read-only file system"
            if _read_only_fs(path)
            else "no permission to write it"
        )
        return f"cannot write catalog {path}: {why}"
    missing = [f"{path.name}-{suffix}" for suffix in ("wal", "shm")]
    missing = [name for name in missing if not (path.parent / name).exists()]
    if missing:
        why = cannot_create_in(path.parent)
        if why is not None:
            return (
                f"cannot write catalog {path}: SQLite needs to create {' and '.join(missing)} "
                f"beside it, but {why}"
            )
    for suffix in ("wal", "shm"):
        companion = Path(f"{path}-{suffix}")
        if companion.exists() and not os.access(companion, os.W_OK):
            return f"cannot write catalog {path}: no permission to write {companion}"
    return None


def configure_writer(conn: sqlite3.Connection) -> None:
    """What every writing connection (catalog or storage metadata) sets: wait for
    the write lock, WAL, and ``synchronous = NORMAL`` (in WAL mode a commit
    survives the process being killed; only a power cut may lose the last ones)."""
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    # Switching a new file to WAL needs it alone and may fail at once with "database is
    # locked" (no busy wait) while other processes open the same new catalog: retry.
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        try:
            conn.execute("PRAGMA journal_mode = WAL")
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    conn.execute("PRAGMA synchronous = NORMAL")


def _note_process(_dbapi_conn: sqlite3.Connection, record: Any) -> None:
    record.info["pid"] = os.getpid()


def _refuse_other_process(_dbapi_conn: sqlite3.Connection, record: Any, proxy: Any) -> None:
    # A kept connection inherited across fork belongs to the parent: drop it
    # unclosed (closing it here would touch the parent's locks) and let the
    # pool open this process's own.
    if record.info.get("pid") != os.getpid():
        record.dbapi_connection = proxy.dbapi_connection = None
        raise DisconnectionError("connection opened by another process")


def pooled_engine(url: Any, *, keep_connection: bool = False, **args: Any) -> Engine:
    """A SQLAlchemy engine on ``url`` (a backend adds its events: see
    :meth:`~shardcat.catalog.backend.Backend.engine`).

    By default ``NullPool``: every transaction opens its own connection, so an
    engine never carries a connection across ``fork`` and nothing stays open
    between calls. ``keep_connection`` (the ingest's claims and commits) keeps
    one connection open between transactions instead of reconnecting and
    re-running the pragmas each time; its owner disposes of it before forking
    and when done, and a connection opened by another process is never used.
    """
    if not keep_connection:
        return create_engine(url, poolclass=NullPool, **args)
    engine = create_engine(url, poolclass=QueuePool, pool_size=1, max_overflow=-1, **args)
    event.listen(engine, "connect", _note_process)
    event.listen(engine, "checkout", _refuse_other_process)
    return engine


def database_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is the database's (a ``sqlite3`` or ``psycopg`` error, or text or
    JSON the catalog holds that does not decode), not the caller's."""
    return isinstance(exc, (sqlite3.Error, UnicodeDecodeError, json.JSONDecodeError)) or type(
        exc
    ).__module__.startswith("psycopg")


F = TypeVar("F", bound=Callable[..., Any])


def reads_catalog(method: F) -> F:
    """A method of an object with ``damaged(exc)`` that reads the catalog: a database
    failure (:func:`database_failure`) is that method's :class:`CatalogError`."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except CatalogError:
            raise
        except Exception as exc:
            if not database_failure(exc):
                raise
            raise self.damaged(exc) from None

    return wrapper  # type: ignore[return-value]


def damage_reason(exc: BaseException) -> str:
    """Why reading the catalog failed (see :func:`database_failure`), for a message."""
    reason = str(getattr(exc, "orig", None) or exc).strip() or type(exc).__name__
    if isinstance(exc, (UnicodeDecodeError, json.JSONDecodeError)):
        reason = f"a stored value does not decode ({reason})"
    return reason


def quick_check(conn: Any) -> list[str]:
    """What SQLite's ``quick_check`` finds damaged in ``conn``'s database (up to 20
    lines; empty: nothing)."""
    try:
        lines = [str(r[0]) for r in conn.execute("PRAGMA quick_check(20)")]
    except sqlite3.DatabaseError as exc:  # too damaged to check
        lines = [str(exc)]
    return [] if lines == ["ok"] else lines


def open_error(path: Path, exc: BaseException) -> CatalogError:
    """The error for a catalog SQLite cannot open or read (``exc``: a sqlite3 error,
    or SQLAlchemy's wrapper of one), naming the file."""
    reason = getattr(exc, "orig", None) or exc
    return CatalogError(f"cannot open catalog {path}: {reason}")


def unsaved_wal(path: Path) -> str | None:
    """Whether ``<path>-wal`` may hold commits that the main file lacks.

    None when the main file holds every commit: there is no ``-wal`` file or it
    is empty, or the ``-shm`` wal-index says every frame up to the last commit
    (mxFrame) was copied back (nBackfill). Otherwise ``"are not yet"`` (the
    wal-index says so) or ``"may not be"`` (no readable wal-index to tell).
    """
    try:
        if os.path.getsize(f"{path}-wal") == 0:
            return None
    except FileNotFoundError:
        return None
    try:
        with open(f"{path}-shm", "rb") as shm:
            head = shm.read(_N_BACKFILL + 4)
    except OSError:
        return "may not be"
    if (
        len(head) < _N_BACKFILL + 4
        or head[:_HEADER_SIZE] != head[_HEADER_SIZE : 2 * _HEADER_SIZE]
        or not head[_IS_INIT]
    ):
        return "may not be"
    mx_frame = int.from_bytes(head[_MX_FRAME : _MX_FRAME + 4], sys.byteorder)
    backfilled = int.from_bytes(head[_N_BACKFILL : _N_BACKFILL + 4], sys.byteorder)
    return None if backfilled >= mx_frame else "are not yet"


def cannot_create_shm(path: Path, exc: sqlite3.Error) -> bool:
    """Whether a read-only open failed because SQLite cannot create ``<path>-shm``
    (a WAL catalog in a read-only directory or on a read-only mount)."""
    return (
        "unable to open database file" in str(exc)
        or getattr(exc, "sqlite_errorname", None) == "SQLITE_READONLY_DIRECTORY"
    ) and (not os.path.exists(f"{path}-shm") and not os.access(path.parent, os.W_OK))


def checkpoint(conn: sqlite3.Connection, wait_ms: int = 0) -> bool:
    """Copy the WAL of ``conn``'s database back into the main file.

    ``PASSIVE`` first (copies every frame no reader still needs, never waits),
    then, when that copied everything, ``TRUNCATE`` to empty the ``-wal`` file
    (waiting up to ``wait_ms`` for other readers and writers; giving up is fine,
    the main file is complete either way). True when the main file now holds
    every commit (also for a database that is not in WAL mode).
    """
    busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    complete = not busy and frames == copied
    if complete and frames > 0:
        conn.execute(f"PRAGMA busy_timeout = {wait_ms}")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    return bool(complete)


def close_wal(path: Path) -> None:
    """Let SQLite fold and remove ``path``'s ``-wal`` and ``-shm`` files, as it does
    when the last connection to a WAL database closes, but only a connection that
    may write can: a process whose last connection was a read-only one (a reader)
    left them behind. Opens and closes one writing connection, waiting for no lock:
    while other processes still use the catalog nothing happens."""
    if not (path.exists() and Path(f"{path}-wal").exists()):
        return
    try:
        conn = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        pass  # busy or gone: the next writer's close folds it


def connect_readonly(path: Path, *, immutable: bool = False) -> sqlite3.Connection:
    """A raw DBAPI connection that cannot write (the readers' hot path).

    ``immutable`` is for catalogs on read-only or network filesystems that no
    process is writing: SQLite then takes no locks at all.
    """
    uri = path.resolve().as_uri() + ("?mode=ro&immutable=1" if immutable else "?mode=ro")
    conn = sqlite3.connect(
        uri, uri=True, check_same_thread=False, cached_statements=64, isolation_level=None
    )
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA query_only = ON")
    if not immutable and mappable(path):
        conn.execute(f"PRAGMA mmap_size = {READ_MMAP_BYTES}")
    return conn


def mappable(path: Path) -> bool:
    """Whether read connections map the catalog ``path``: a file on a local
    filesystem (see ``_LOCAL_FILESYSTEMS``), on Linux. Only SQLite writes a catalog
    that is not immutable, and it never shrinks one under a reader's mapping
    unknown to it; an immutable catalog is not mapped (another tool may rewrite it
    in place, which its reads must refuse, not fault on)."""
    return filesystem_of(path) in _LOCAL_FILESYSTEMS


def filesystem_of(path: Path) -> str | None:
    """The type of the filesystem holding ``path`` (``/proc/self/mounts``: the
    longest mount point above it); None where that cannot be read."""
    target = os.path.realpath(path)
    found, depth = None, -1
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                inside = target == point or target.startswith(point.rstrip("/") + "/")
                if inside and len(point) > depth:
                    found, depth = fields[2], len(point)
    except OSError:
        return None
    return found


def file_identity(path: Path) -> tuple[int, ...] | None:
    """``(device, inode, size, mtime_ns, ctime_ns)`` of a file; None when it is gone.
    A file replaced (another inode) or rewritten in place (size, mtime, ctime) has
    another identity."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
