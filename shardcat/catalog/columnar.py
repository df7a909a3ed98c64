"""``engine="duckdb"``: read-only SQL over the datasets' views at columnar speed.

DuckDB runs the statement over a **mirror**: one Parquet file per dataset holding
its view's columns (``key``, ``position``, ``shard`` and the SQL fields), kept in
``<catalog>.columns/`` beside a SQLite catalog (or, where that directory cannot
be written -- a read-only filesystem, an immutable snapshot -- in a private
directory under the system's temporary directory). The catalog stays the truth:

- a mirror file is named after the dataset's id and its *state*, a hash of the
  dataset's ``version`` (bumped by every commit that changes its shards or
  records), its options, its view's SQL (fields added or hidden) and its shards'
  indexed versions (generation, positions, record count, when indexed, the file's
  size, mtime, inode, ctime and fingerprint: a catalog made anew at the same path
  over rewritten shards is not the old one). Before each
  statement the state of every dataset the SQL names is read from the catalog;
  a dataset without the file of its current state gets it (re)built, so a
  result is never older than the catalog (dropped datasets have no view).
- a mirror is written from the view itself in one read transaction (the state
  and the rows of the same commit), to a temporary file renamed over the
  target (``os.replace``): processes building the same mirror at once each
  write a complete file; files of older states, and of dropped datasets,
  are then removed.

The packaged DuckDB (2.0) cannot read the SQLite file itself: its ``sqlite``
extension is not bundled and ``INSTALL sqlite`` downloads it (no network here;
and a query should not download code). PostgreSQL catalogs are refused.

Guards, as :mod:`shardcat.catalog.query` has for SQLite: only one ``SELECT``
statement runs (DuckDB's parser says which kind a statement is; anything else
is refused as a write); the DuckDB session has no file access but to the
mirror directory (``enable_external_access = false``, extensions never
installed), no temporary directory (nothing spills to disk), a memory limit
(``memory_limit``: past it the query fails with :class:`CatalogError`) and a
time limit (the statement runs on the session's thread; the caller's wait ends
at the limit or on Ctrl-C, then ``interrupt()`` stops it). One session per process and
mirror directory (a DuckDB connection costs ~15 ms to open; a statement on a
warm one is a few), its statements one at a time (the memory limit is the
session's).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import re
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from shardcat.catalog.engine import connect_readonly
from shardcat.catalog.processes import interruption
from shardcat.catalog.query import Rows, check_limits, over_memory, over_time
from shardcat.errors import CatalogError

__all__ = ["ENGINES", "mirror_directory", "streamed", "wants_duckdb"]

#: the query engines: the catalog's own database, or DuckDB over the mirror
ENGINES = ("sqlite", "duckdb")

# Bump when what a mirror file holds changes: older files then count as stale.
_FORMAT = 1
# Rows per Parquet row group (DuckDB scans row groups in parallel).
_BATCH = 262_144
_READ_ONLY = "the catalog is read-only here: only SELECT statements are allowed"


class _Backend(Protocol):
    @property
    def local_file(self) -> Path | None: ...
    @property
    def display(self) -> str: ...


class Source(Protocol):
    """What the mirror needs of a catalog (a store or the facade's Catalog)."""

    @property
    def backend(self) -> _Backend: ...
    @property
    def immutable(self) -> bool: ...


def wants_duckdb(engine: str) -> bool:
    """True for ``"duckdb"``, False for ``"sqlite"``; anything else is refused."""
    if engine not in ENGINES:
        raise CatalogError(
            f"unknown query engine {engine!r}: use 'sqlite' (the catalog's own "
            "database, the default) or 'duckdb' (columnar; pip install 'shardcat[duckdb]')"
        )
    return engine == "duckdb"


def _duckdb() -> Any:
    try:
        import duckdb
    except ImportError:
        raise CatalogError("engine='duckdb' needs DuckDB: pip install 'shardcat[duckdb]'") from None
    return duckdb


def mirror_directory(catalog: Path) -> Path:
    """Where the mirror of ``catalog`` lives: ``<catalog>.columns`` when it can be
    written there, else a directory of this user's under the temporary directory."""
    beside = catalog.with_name(catalog.name + ".columns")
    with contextlib.suppress(OSError):
        beside.mkdir(exist_ok=True)
        if os.access(beside, os.W_OK | os.X_OK):
            return beside
    digest = hashlib.sha256(str(catalog.resolve()).encode()).hexdigest()[:16]
    private = Path(tempfile.gettempdir()) / f"shardcat-columns-{os.getuid()}-{digest}"
    try:
        private.mkdir(mode=0o700, exist_ok=True)
        owner = private.stat().st_uid
    except OSError as exc:
        raise CatalogError(
            f"cannot keep the columnar mirror of {catalog}: neither {beside} nor "
            f"{private} can be written ({exc})"
        ) from None
    if owner != os.getuid():
        raise CatalogError(f"cannot keep the columnar mirror in {private}: another user owns it")
    return private


# --- the mirror -------------------------------------------------------------


def _state(conn: Any, dataset_id: int, name: str) -> str:
    """The hash naming the dataset's current mirror file (see the module docstring)."""
    digest = hashlib.sha256(repr(_FORMAT).encode())
    for sql, args in (
        ("SELECT version, options, key_rule FROM shardcat_datasets WHERE id = ?", dataset_id),
        ("SELECT sql FROM sqlite_master WHERE type = 'view' AND name = ?", name),
        (
            "SELECT id, path, generation, first_position, num_records, indexed_at, size, "
            "mtime_ns, ino, ctime_ns, fingerprint FROM shardcat_shards "
            "WHERE dataset_id = ? ORDER BY id",
            dataset_id,
        ),
    ):
        digest.update(repr(conn.execute(sql, (args,)).fetchall()).encode())
    return digest.hexdigest()[:24]


def _arrow_schema(conn: Any, dataset_id: int, columns: list[str]) -> Any:
    import pyarrow as pa

    kinds = {"integer": pa.int64(), "real": pa.float64(), "text": pa.string()}
    declared = {
        col.lower(): kinds.get(sql_type, pa.string())
        for col, sql_type in conn.execute(
            "SELECT column_name, sql_type FROM shardcat_fields WHERE dataset_id = ?",
            (dataset_id,),
        )
    }
    declared["position"] = pa.int64()
    return pa.schema([(c, declared.get(c.lower(), pa.string())) for c in columns])


def _write(conn: Any, dataset_id: int, name: str, target: Path) -> None:
    """The rows of view ``name`` into the Parquet file ``target`` (atomically)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cursor = conn.execute(f'SELECT * FROM "{name}"')
    schema = _arrow_schema(conn, dataset_id, [d[0] for d in cursor.description])
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        with pq.ParquetWriter(temp, schema) as writer:
            rows_type = pa.struct(list(schema))  # (rows to columns in C: 2.4x zip's speed)
            while rows := cursor.fetchmany(_BATCH):
                writer.write_batch(pa.RecordBatch.from_struct_array(pa.array(rows, rows_type)))
        os.replace(temp, target)
    except (pa.ArrowException, ValueError, TypeError) as exc:
        raise CatalogError(f"cannot mirror dataset {name!r} for engine='duckdb': {exc}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)


def _mentioned(datasets: Mapping[str, int], sql: str) -> dict[str, int]:
    """The datasets (name -> id) whose name appears in ``sql`` as a word."""
    return {
        name: dataset_id
        for name, dataset_id in datasets.items()
        if re.search(rf"(?<![\w$]){re.escape(name)}(?![\w$])", sql, re.IGNORECASE)
    }


def _forget_dropped(directory: Path, ids: set[int]) -> None:
    """Remove the mirror files of datasets that are no more."""
    for file in directory.glob("*-*.parquet"):
        head = file.name.partition("-")[0]
        if head.isdigit() and int(head) not in ids:
            with contextlib.suppress(FileNotFoundError):
                file.unlink()


def _current(conn: Any, directory: Path, name: str, dataset_id: int) -> Path:
    """The dataset's mirror file of its current state, written first if missing."""
    target = directory / f"{dataset_id}-{_state(conn, dataset_id, name)}.parquet"
    if target.is_file():
        return target
    conn.execute("BEGIN")  # the state and the rows of one commit
    try:
        target = directory / f"{dataset_id}-{_state(conn, dataset_id, name)}.parquet"
        _write(conn, dataset_id, name, target)
    finally:
        conn.execute("COMMIT")
    for old in directory.glob(f"{dataset_id}-*.parquet"):
        if old != target:
            with contextlib.suppress(FileNotFoundError):
                old.unlink()
    return target


def mirrors(catalog: Path, immutable: bool, directory: Path, sql: str) -> dict[str, Path]:
    """The current mirror file of every dataset ``sql`` names (built when missing)."""
    conn = connect_readonly(catalog, immutable=immutable)
    try:
        datasets = dict(conn.execute("SELECT name, id FROM shardcat_datasets").fetchall())
        _forget_dropped(directory, set(datasets.values()))
        return {
            name: _current(conn, directory, name, dataset_id)
            for name, dataset_id in _mentioned(datasets, sql).items()
        }
    except OSError as exc:
        raise CatalogError(f"cannot write the columnar mirror in {directory}: {exc}") from None
    finally:
        conn.close()


# --- the DuckDB session -----------------------------------------------------


@dataclass
class _Session:
    """One guarded DuckDB connection, the views it has (name -> file), its memory
    limit, the thread its statements run on and its lock (one statement at a time).

    A statement runs on the session's thread while the caller waits for it: the
    wait ends at the time limit or with Ctrl-C (a thread blocked in DuckDB would
    never see either), and the statement is then interrupted."""

    conn: Any
    directory: Path
    views: dict[str, Path] = field(default_factory=dict)
    memory: int | None = -1  # (not set yet)
    lock: threading.Lock = field(default_factory=threading.Lock)
    runner: futures.ThreadPoolExecutor = field(
        default_factory=lambda: futures.ThreadPoolExecutor(1, thread_name_prefix="shardcat-duckdb")
    )

    def run(self, cursor: Any, sql: str, params: Any, timeout: float | None) -> None:
        """``cursor.execute(sql, params)``; ``futures.TimeoutError`` past ``timeout``
        seconds, ``KeyboardInterrupt`` on Ctrl-C (the statement interrupted first)."""
        running = self.runner.submit(cursor.execute, sql, params)
        try:
            running.result(timeout)  # (the statement's own error is raised here)
        except (futures.TimeoutError, KeyboardInterrupt):
            cursor.interrupt()
            futures.wait([running])
            raise

    def show(self, files: Mapping[str, Path]) -> None:
        """Exactly the views ``files`` (dataset name -> mirror file)."""
        for name in [n for n in self.views if files.get(n) != self.views[n]]:
            self.conn.execute(f'DROP VIEW IF EXISTS "{name}"')
            del self.views[name]
        for name, file in files.items():
            if name not in self.views:
                path = str(file).replace("'", "''")
                self.conn.execute(f"CREATE VIEW \"{name}\" AS SELECT * FROM read_parquet('{path}')")
                self.views[name] = file

    def limit(self, memory: int | None) -> None:
        if memory != self.memory:
            self.conn.execute(
                "RESET memory_limit" if memory is None else f"SET memory_limit = '{memory}B'"
            )
            self.memory = memory


_sessions: dict[tuple[int, Path], _Session] = {}
_sessions_lock = threading.Lock()


def _session(duckdb: Any, directory: Path) -> _Session:
    with _sessions_lock:
        found = _sessions.get((os.getpid(), directory))
        if found is None:
            conn = duckdb.connect(
                config={
                    "temp_directory": "",
                    "autoinstall_known_extensions": False,
                    "autoload_known_extensions": False,
                }
            )
            folder = str(directory).replace("'", "''")
            conn.execute(f"SET allowed_directories = ['{folder}/']")
            conn.execute("SET enable_external_access = false")
            if not _sessions:
                atexit.register(_close_sessions)
            found = _sessions[(os.getpid(), directory)] = _Session(conn, directory)
        return found


def _close_sessions() -> None:
    """Close this process's sessions (at exit: DuckDB objects left to the
    interpreter's teardown are reported as leaks)."""
    with _sessions_lock:
        for (pid, _), session in list(_sessions.items()):
            if pid == os.getpid():
                session.runner.shutdown()
                session.conn.close()
        _sessions.clear()


def _refuse_writes(session: _Session, sql: str) -> None:
    duckdb = _duckdb()
    try:
        statements = session.conn.extract_statements(sql)
    except duckdb.Error as exc:
        raise CatalogError(f"query failed: {exc}") from None
    if len(statements) != 1:
        raise CatalogError(f"query failed: one statement at a time (found {len(statements)})")
    if statements[0].type != duckdb.StatementType.SELECT:
        raise CatalogError(f"query failed: {_READ_ONLY}")


@contextlib.contextmanager
def streamed(
    source: Source,
    sql: str,
    params: Sequence[Any] | Mapping[str, Any] | None,
    *,
    timeout: float | None,
    memory: int | None,
) -> Iterator[Rows]:
    """Run one SELECT with DuckDB over the mirror of ``source`` (see the module
    docstring); yields the column names and the rows, fetched as they are iterated.
    ``timeout`` (seconds) and ``memory`` (bytes; DuckDB's ``memory_limit``) as
    :func:`shardcat.catalog.query.streamed` takes them (None: no limit)."""
    check_limits(timeout, memory)
    file = source.backend.local_file
    if file is None:
        raise CatalogError(
            f"engine='duckdb' is for SQLite catalogs; {source.backend.display} is a server "
            "catalog (query it with the default engine)"
        )
    duckdb = _duckdb()
    session = _session(duckdb, mirror_directory(file))
    with session.lock:  # (DuckDB computes the whole result in execute: then the
        _refuse_writes(session, sql)  # rows are fetched from the cursor, lock released)
        session.show(mirrors(file, source.immutable, session.directory, sql))
        session.limit(memory)
        cursor = session.conn.cursor()
        try:
            session.run(cursor, sql, params or None, timeout)
        except futures.TimeoutError:
            cursor.close()
            raise over_time(timeout or 0) from None
        except duckdb.Error as exc:
            cursor.close()
            raise _failed(duckdb, exc, memory) from None
        except BaseException:
            cursor.close()
            raise
    try:
        columns = [d[0] for d in cursor.description or ()]
        yield columns, _fetched(duckdb, cursor, memory)
    finally:
        cursor.close()


def _fetched(duckdb: Any, cursor: Any, memory: int | None) -> Iterator[tuple[Any, ...]]:
    while True:
        try:
            rows = cursor.fetchmany(1024)
        except duckdb.Error as exc:
            raise _failed(duckdb, exc, memory) from None
        if not rows:
            return
        yield from rows


def _failed(duckdb: Any, exc: Exception, memory: int | None) -> BaseException:
    if isinstance(exc, duckdb.InterruptException):  # (not ours: another interrupt())
        return interruption()
    if isinstance(exc, duckdb.OutOfMemoryException) and memory is not None:
        return over_memory(memory)
    return CatalogError(f"query failed: {str(exc).splitlines()[0]}")
