"""Ingest, the facade's side: scan shards in worker processes with their format,
hand the entries to the store's commit.

The store (:mod:`shardcat.catalog`) syncs shard rows, hands out claims and
commits; this module does what needs the files: it stats them, judges whether
a file is still the version its row indexed (size and mtime, then inode/ctime
and the fingerprint: :func:`~shardcat.sources.local.mismatch`, the readers'
rule too), and scans each claimed shard with its format
(:meth:`~shardcat.formats.base.Format.scan_shard`: plain or compressed, with
seek points) in this process or in forked workers, each claiming shards until none
is left. Other processes doing the same at the same time share the work; every
shard is indexed once.

A shard stored as a URL (see :mod:`shardcat.sources.remote`) is judged by its
object identity (size, ETag/version, Last-Modified), and indexed by streaming it
once into a temporary local file (large sequential reads, each conditional on
the ETag of the first) that the format scans as usual, then deleted.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from shardcat.catalog.backend import backend_for, make_engine
from shardcat.catalog.claims import (
    CLAIM_LOST,
    Waiting,
    claim_next,
    give_back,
    open_shards,
    owner_id,
    release,
    still_mine,
)
from shardcat.catalog.commit import (
    IngestJob,
    catalog_error,
    commit_shard,
    dedupe_within,
    defer_key_index,
    finish_key_index,
)
from shardcat.catalog.engine import fork_generation
from shardcat.catalog.processes import end_with_parent, stops_held
from shardcat.catalog.sync import absolute_path, stored_path
from shardcat.errors import (
    KEEP_ONE,
    CorruptRecordError,
    Hint,
    IngestError,
    LegacyIndexError,
    ShardcatError,
)
from shardcat.facade.remote_detect import local_copy, sidecar_of, warnings_naming
from shardcat.formats.base import BAD_RECORDS, BadRecord, Format, ShardScan
from shardcat.formats.registry import get_format, other_format
from shardcat.paths import require_regular
from shardcat.readers.view import STORAGE_OPTIONS
from shardcat.sources import remote
from shardcat.sources.local import Identity, fingerprint_file, mismatch

__all__ = [
    "ProvideEntries",
    "ShardOutcome",
    "judge_files",
    "local_copy",
    "raise_for_failures",
    "run_ingest",
]

POLL_SECONDS = 0.2
#: what a shard's error adds when a bad record failed it
SKIP_HINT = Hint.naming(
    "on_bad_record='skip'",
    "catalog ingest --on-bad-record skip",
    before="(",
    after=" indexes the other records)",
)
STOP_SECONDS = 5.0  # how long stopped workers get to give their claims back

# Entries of a shard from elsewhere than scanning it (``catalog migrate``: a verified
# legacy index). Called with the shard's path and stat once the shard is claimed;
# None means "scan it after all". The result is committed like a scan's.
ProvideEntries = Callable[[str, os.stat_result], ShardScan | None]


@dataclass(frozen=True)
class ShardOutcome:
    """One shard indexed: its records, the records the commit dropped as duplicate
    keys (of this shard or of others it won against), or why it failed (``hint``:
    what to do about it, see :class:`~shardcat.errors.Hint`)."""

    path: str
    records: int
    error: str | None = None
    duplicates: int = 0
    hint: Hint | None = None


def same_file(row: Any, st: os.stat_result, path: str) -> bool | None:
    """Whether the file at ``path`` is still the version ``row`` indexed: False when
    size or mtime differ, or inode/ctime differ and so does the fingerprint; None when
    it is the same content under another inode/ctime (copied, chmod, ``touch -r``
    of unchanged bytes): the stored identity needs updating, not the records."""
    if remote.is_url(path):
        info = getattr(st, "remote_info", None) or remote.RemoteInfo(st.st_size, None, None, 0)
        return remote.remote_mismatch(row.size, row.mtime_ns, row.fingerprint, info) is None
    indexed = Identity(row.size, row.mtime_ns, row.ino, row.ctime_ns, row.fingerprint)
    if mismatch(indexed, st, lambda: fingerprint_file(path, st.st_size)) is not None:
        return False
    return True if (row.ino, row.ctime_ns) == (st.st_ino, st.st_ctime_ns) else None


def judge_files(
    files: Iterable[str], catalog_dir: str, storage_options: Mapping[str, Any] | None = None
) -> tuple[dict[str, os.stat_result], Callable[[Any, str], bool | None]]:
    """The stat of each file (by stored path; files gone since they were listed are
    left out, as not in the set) and the judge :func:`~shardcat.catalog.sync.sync_shards`
    asks whether a file is still the version its row indexed."""
    found: dict[str, tuple[str, os.stat_result]] = {}
    infos: dict[str, remote.RemoteInfo] = {}
    for path in files:
        try:
            if remote.is_url(path):  # as listed by the glob, else one HEAD
                info = remote.listed_info(path) or remote.remote_info(path, storage_options)
                infos[path] = info
                found[path] = (path, info.as_stat())
            else:
                found[stored_path(path, catalog_dir)] = (path, os.stat(path))
        except FileNotFoundError:
            continue

    def judge(row: Any, stored: str) -> bool | None:
        path, st = found[stored]
        if path in infos:
            now = infos[path]
            return remote.remote_mismatch(row.size, row.mtime_ns, row.fingerprint, now) is None
        return same_file(row, st, path)

    return {k: st for k, (_, st) in found.items()}, judge


_engines: dict[tuple[str, int], Engine] = {}


def _engine(catalog: str) -> Engine:
    """One engine per catalog per process (a forked worker makes its own), keeping
    one connection open across this process's claims, commits and releases."""
    key = (catalog, fork_generation())
    engine = _engines.get(key)
    if engine is None:
        engine = _engines.setdefault(key, make_engine(catalog, keep_connection=True))
    return engine


def _close_engines() -> None:
    """Close the connections this process keeps (before forking workers, so that
    none crosses the fork, and when an ingest ends). Engines inherited from a
    parent process are left alone: their connections were closed before the fork."""
    generation = fork_generation()
    for key in [key for key in _engines if key[1] == generation]:
        engine = _engines.pop(key, None)
        if engine is not None:
            engine.dispose()


# The workers of one ingest take turns at the catalog's write lock through this lock
# (set in each forked worker): a waiting worker wakes as soon as the other is done,
# where SQLite's busy handler sleeps in steps of up to 100 ms and lets a worker that
# commits and claims again at once starve the other one. Other processes (another
# ingest) still meet at the catalog's own locks. A server catalog has no such lock:
# its workers write at once.
_turns: Any = None
_UNSET: Any = object()


@contextlib.contextmanager
def _writer_turn() -> Iterator[None]:
    """This worker's turn to write (a no-op outside a pool of workers)."""
    if _turns is None:
        yield
        return
    with _turns:
        yield


def scan_shard(fmt: Format, path: str, job: IngestJob) -> ShardScan:
    """The scan of the shard at ``path``; with ``on_bad_record="skip"`` its bad
    records are set aside (``columns.bad``) where the format can go on after them."""
    if job.on_bad_record != "skip":
        return fmt.scan_shard(path, job.options)
    bad: list[BadRecord] = []
    scanned = fmt.scan_shard(path, {**job.options, BAD_RECORDS: bad})
    scanned.columns.bad = bad
    return scanned


def index_claimed(
    engine: Engine,
    job: IngestJob,
    shard_id: int,
    stored: str,
    owner: str,
    provide: ProvideEntries | None = None,
    then: Callable[[], None] | None = None,
) -> ShardOutcome:
    """Scan a claimed shard and commit it (or record why it failed).

    ``provide`` may hand in the shard's entries instead of a scan (see
    :data:`ProvideEntries`); they go through the same checks and commit.
    ``then`` runs after a successful commit in the same turn at the write lock
    (a worker claims its next shard there); a catalog error in it is ignored.
    """
    path = absolute_path(stored, job.catalog_dir)
    fmt = get_format(job.format)
    if remote.is_url(path):
        return _index_remote(engine, job, shard_id, stored, owner, path, provide, then)
    try:
        st = os.stat(path)
        require_regular(path, st)  # a FIFO put in a shard's place would block the open
        fp = fingerprint_file(path, st.st_size)
        scanned = None if provide is None else provide(path, st)
        if scanned is None:
            scanned = scan_shard(fmt, path, job)  # plain or compressed (+ seek points)
        after = os.stat(path)
        if (after.st_size, after.st_mtime_ns, after.st_ino) != (
            st.st_size,
            st.st_mtime_ns,
            st.st_ino,
        ) or fingerprint_file(path, after.st_size) != fp:
            raise ShardcatError(f"{path}: the file changed while it was being indexed")
        return _commit_scan(engine, job, shard_id, stored, owner, scanned, st, fp, then)
    except BaseException as exc:
        other = other_format(path, fmt) if isinstance(exc, CorruptRecordError) else None
        if other is not None:  # a dataset holds one format: say what this file is
            exc = CorruptRecordError(f"{other} (a dataset holds files of one format)")
        return _failed(engine, job, shard_id, stored, owner, exc, path)


def _commit_scan(
    engine: Engine,
    job: IngestJob,
    shard_id: int,
    stored: str,
    owner: str,
    scanned: ShardScan,
    st: os.stat_result,
    fp: str,
    then: Callable[[], None] | None,
) -> ShardOutcome:
    """Commit a shard's scan, if this process still holds its claim (``then``: see
    :func:`index_claimed`)."""
    columns = dedupe_within(scanned.columns, stored, job.on_duplicate)
    within = len(scanned.columns) - len(columns)
    seek = (
        None
        if scanned.seek_kind is None or scanned.seek_index is None
        else (scanned.seek_kind, scanned.seek_index)
    )
    with _writer_turn():
        with engine.begin() as conn:
            if not still_mine(conn, shard_id, owner):
                return ShardOutcome(stored, 0, CLAIM_LOST)
            n, dropped = commit_shard(
                conn, job, shard_id, stored, columns, st, fp, scanned.compression, seek, within
            )
        if then is not None:
            try:
                then()
            except SQLAlchemyError:
                pass  # the shard is committed; the caller meets the error again
    return ShardOutcome(stored, n, duplicates=dropped)


def _failed(
    engine: Engine,
    job: IngestJob,
    shard_id: int,
    stored: str,
    owner: str,
    exc: BaseException,
    name: str,
    renames: Sequence[tuple[str, str]] = (),
) -> ShardOutcome:
    """How the indexing of a claimed shard that raised ``exc`` ends: the shard failed
    (a :class:`ShardcatError` or ``OSError``, its message naming ``name``, the path or
    URL, with ``renames`` (local copy -> what it is a copy of) applied in order; a bad
    record's says that ``on_bad_record="skip"`` indexes the others), or
    given back (anything else: the catalog's own failure is a :class:`CatalogError`,
    the rest is re-raised). A stop (a signal, Ctrl-C) is re-raised at once, without
    touching the catalog again: :func:`run_ingest` gives the claims back."""
    if isinstance(exc, (SystemExit, KeyboardInterrupt)):
        raise exc  # stopped: no more catalog work here (see run_ingest)
    if isinstance(exc, (ShardcatError, OSError)):
        message, hint = str(exc), getattr(exc, "hint", None)
        for local, shown in renames:
            message = message.replace(local, shown)
        if isinstance(exc, OSError) and not isinstance(exc, ShardcatError):
            message = f"{name}: {exc.strerror or exc}"
        elif (
            isinstance(exc, CorruptRecordError)
            and exc.offset is not None  # a bad record (not a file of another format)
            and not isinstance(exc, LegacyIndexError)
            and job.on_bad_record == "raise"
        ):
            message, hint = SKIP_HINT.join(message), SKIP_HINT
        release(engine, job.dataset_id, shard_id, owner, failed=message)
        return ShardOutcome(stored, 0, message, hint=hint)
    try:
        release(engine, job.dataset_id, shard_id, owner, failed=None)  # give it back
    except SQLAlchemyError:
        if not isinstance(exc, SQLAlchemyError):
            raise
        # the claim dies with this process; the next ingest takes it over
    if isinstance(exc, SQLAlchemyError):  # the catalog itself failed (disk full, I/O error)
        raise catalog_error(backend_for(job.catalog).display, exc) from None
    raise exc


def _index_remote(
    engine: Engine,
    job: IngestJob,
    shard_id: int,
    stored: str,
    owner: str,
    url: str,
    provide: ProvideEntries | None,
    then: Callable[[], None] | None,
) -> ShardOutcome:
    """:func:`index_claimed` of a remote shard: streamed once to a local copy, scanned
    (or its entries from ``provide``, judged against the object's identity now)."""
    fmt = get_format(job.format)
    tmp = ""
    try:
        scanned = None
        if provide is not None:
            info = remote.remote_info(url, job.options.get(STORAGE_OPTIONS))
            scanned = provide(url, info.as_stat())
        if scanned is None:
            storage = job.options.get(STORAGE_OPTIONS)
            copy = local_copy(url, storage, fmt=fmt, format_options=job.options)
            with copy as (tmp, info), warnings_naming(tmp, url):
                scanned = scan_shard(fmt, tmp, job)
        return _commit_scan(
            engine,
            job,
            shard_id,
            stored,
            owner,
            scanned,
            info.as_stat(),
            info.fingerprint or "",
            then,
        )
    except BaseException as exc:
        renames = []
        if tmp:  # name the object (and its sidecar), not their local copies
            near, far = sidecar_of(fmt, tmp), sidecar_of(fmt, url)
            if near is not None and far is not None:
                renames += [(near, far), (os.path.basename(near), far.rsplit("/", 1)[-1])]
            renames.append((tmp, url))
        return _failed(engine, job, shard_id, stored, owner, exc, url, renames)


def _work_all(job: IngestJob, turns: Any, out: Any, parent: int) -> None:
    """A forked worker: claim and index shards until none is claimable, sending
    ``("done", outcome)`` to the parent for each, then ``("end", None)`` (or
    ``("error", exception)``). The next claim follows each commit in the same turn
    at the write lock, so this worker scans its next shard while the other commits
    (claiming after the other's commit left it idle for that commit). A signal, or
    the end of ``parent``, ends it quietly, its claim given back
    (:func:`~shardcat.catalog.processes.end_with_parent`)."""
    global _turns
    _turns = turns
    try:
        end_with_parent(parent)
        engine = _engine(job.catalog)
        owner = owner_id()
        following: list[Any] = [_UNSET]

        def claim() -> None:
            following[0] = claim_next(engine, job.dataset_id, job.lease, owner)

        with _writer_turn():
            claim()
        while (claimed := following[0]) is not None:
            following[0] = _UNSET
            out.send(
                ("done", index_claimed(engine, job, claimed[0], claimed[1], owner, then=claim))
            )
            if following[0] is _UNSET:
                with _writer_turn():
                    claim()
        out.send(("end", None))
    except SystemExit:  # stopped (by the parent, or its end): the parent gives the claims back
        raise
    except BaseException as exc:
        try:
            out.send(("error", exc))
        except Exception:  # an exception that does not pickle
            out.send(("error", IngestError(f"ingest worker failed: {exc!r}", [])))
    finally:
        _close_engines()
        out.close()


def _run_workers(job: IngestJob, count: int, note: Callable[[ShardOutcome | None], None]) -> None:
    """Fork ``count`` workers (:func:`_work_all`) and note their outcomes as they come;
    re-raises the first worker's error (the others are stopped and give their
    claims back; one that does not within :data:`STOP_SECONDS` is killed, its claim
    taken over at once by the next ingest). A worker that dies leaves its claim to
    the caller's next round."""
    ctx = multiprocessing.get_context("fork")
    # turns only where the catalog has one writer at a time (a server takes several)
    turns = ctx.Lock() if backend_for(job.catalog).one_writer else None
    procs: list[Any] = []
    live: list[Any] = []
    try:
        for _ in range(count):
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_work_all, args=(job, turns, writer, os.getpid()), daemon=True
            )
            with stops_held():  # a stop comes once the worker is noted, to be stopped
                proc.start()
                procs.append(proc)
                live.append(reader)
            writer.close()
        while live:
            waited: list[Any] = multiprocessing.connection.wait(live)
            for ready in waited:
                try:
                    kind, value = ready.recv()
                except EOFError:  # died without a word
                    kind, value = "end", None
                if kind == "done":
                    note(value)
                    continue
                live.remove(ready)
                ready.close()
                if kind == "error":
                    raise value
    finally:
        for reader in live:
            reader.close()
        for proc in procs:
            if proc.is_alive() and live:
                proc.terminate()
        for proc in procs:
            proc.join(STOP_SECONDS)
            if proc.is_alive():
                proc.kill()
                proc.join()


def _work_one(job: IngestJob) -> ShardOutcome | None:
    """Claim and index one shard in this process; None when nothing was claimable."""
    engine = _engine(job.catalog)
    owner = owner_id()
    with _writer_turn():
        claimed = claim_next(engine, job.dataset_id, job.lease, owner)
    if claimed is None:
        return None
    return index_claimed(engine, job, claimed[0], claimed[1], owner)


def run_ingest(
    engine: Engine,
    job: IngestJob,
    workers: int,
    progress: Callable[[ShardOutcome], None] | None = None,
    provided: Mapping[str, ProvideEntries] | None = None,
    wait_timeout: float | None = None,
) -> list[ShardOutcome]:
    """Index every pending shard of the dataset, sharing the work with any other
    process doing the same; returns once no shard is pending or being indexed.

    ``provided`` maps stored shard paths to where their entries come from
    instead of a scan: those shards are claimed and committed first, in this
    process; the rest are scanned by ``workers`` processes as usual.
    A wait for shards that live processes hold is named (see
    :class:`~shardcat.catalog.claims.Waiting`)
    and given up after ``wait_timeout`` seconds (None: no limit).
    """
    outcomes: list[ShardOutcome] = []
    defer_key_index(engine, job.dataset_id)  # a first ingest builds it after the rows

    def note(outcome: ShardOutcome | None) -> None:
        if outcome is not None:
            outcomes.append(outcome)
            if progress is not None:
                progress(outcome)

    if provided:
        owner = owner_id()
        while (
            claimed := claim_next(engine, job.dataset_id, job.lease, owner, only=provided)
        ) is not None:
            shard_id, stored = claimed
            note(index_claimed(engine, job, shard_id, stored, owner, provided[stored]))
    try:
        waiting = Waiting(engine, job.dataset_id, job.lease, wait_timeout)
        _share_work(engine, job, workers, note, outcomes, waiting)
    except BaseException:
        with contextlib.suppress(SQLAlchemyError):  # stopped, or failed: this process's
            give_back(engine, job.dataset_id, owner_id())  # claims and its workers' back
        _close_engines()
        try:
            finish_key_index(engine, job)  # whatever is in, the next ingest goes on from
        except Exception:
            pass  # the error being raised says more; the next ingest builds the index
        raise
    _close_engines()
    failed, lost = finish_key_index(engine, job)  # the key index, if this was a first ingest
    return [
        ShardOutcome(o.path, 0, failed[o.path], hint=KEEP_ONE)
        if o.path in failed
        else ShardOutcome(o.path, o.records - lost[o.path], o.error, o.duplicates + lost[o.path])
        if o.path in lost
        else o
        for o in outcomes
    ]


def _share_work(
    engine: Engine,
    job: IngestJob,
    workers: int,
    note: Callable[[ShardOutcome | None], None],
    outcomes: list[ShardOutcome],
    waiting: Waiting,
) -> None:
    """Claim and index shards, here or in forked workers, until none is open."""
    idle = False
    while True:
        open_count = open_shards(engine, job.dataset_id)
        if open_count == 0:
            return
        done = len(outcomes)
        if workers > 1 and open_count > 1 and not idle:
            _close_engines()  # no kept connection crosses the fork
            _run_workers(job, min(workers, open_count), note)
        else:
            note(_work_one(job))
        idle = len(outcomes) == done
        if idle:  # other processes hold the remaining claims
            waiting.still()
            time.sleep(POLL_SECONDS)
        else:
            waiting.started = None


def raise_for_failures(outcomes: Iterable[ShardOutcome]) -> None:
    """Raise :class:`IngestError` naming every shard that failed (others stay committed)."""
    failed = [o for o in outcomes if o.error is not None and o.error != CLAIM_LOST]
    if failed:
        more = f" (and {len(failed) - 1} more failed shards)" if len(failed) > 1 else ""
        raise IngestError(f"{failed[0].error}{more}", failed)
