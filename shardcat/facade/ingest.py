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
import pickle
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from shardcat.catalog.backend import backend_for
from shardcat.catalog.claims import CLAIM_LOST
from shardcat.catalog.commit import IngestJob, catalog_error, dedupe_within
from shardcat.catalog.processes import (
    STOP_SIGNALS,
    TurnLock,
    end_with_parent,
    stops_held,
    worker_start_method,
)
from shardcat.catalog.session import ClaimedShard, IngestSession, ShardVersion
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
from shardcat.formats.registry import get_format, other_format, register_format
from shardcat.paths import require_regular
from shardcat.readers.view import STORAGE_OPTIONS
from shardcat.sources import remote
from shardcat.sources.local import Identity, fingerprint_file, mismatch

__all__ = [
    "ProvideEntries",
    "ShardOutcome",
    "ShareWork",
    "Work",
    "index_claimed",
    "judge_files",
    "local_copy",
    "raise_for_failures",
    "run_ingest",
]

POLL_SECONDS = 0.2
_UNSET: Any = object()
#: what a shard's error adds when a bad record failed it
SKIP_HINT = Hint.naming(
    "on_bad_record='skip'",
    "catalog ingest --on-bad-record skip",
    before="(",
    after=" indexes the other records)",
)
STOP_SECONDS = 5.0  # how long stopped workers get to give their claims back
#: why a worker started by a fork server may die at once
_NOT_FORKED = (
    "this process was not safe to fork: a script must guard its main code with "
    "'if __name__ == \"__main__\":'"
)

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
    session: IngestSession,
    shard: ClaimedShard,
    provide: ProvideEntries | None = None,
    then: Callable[[], None] | None = None,
) -> ShardOutcome:
    """Scan a claimed shard and commit it (or record why it failed).

    ``provide`` may hand in the shard's entries instead of a scan (see
    :data:`ProvideEntries`); they go through the same checks and commit.
    ``then`` runs after a successful commit in the same turn at the write lock
    (a worker claims its next shard there); a catalog error in it is ignored.
    """
    job = session.job
    path = absolute_path(shard.stored, job.catalog_dir)
    fmt = get_format(job.format)
    if remote.is_url(path):
        return _index_remote(session, shard, path, provide, then)
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
        return _commit(session, shard, _version(job, shard, scanned, st, fp), then)
    except BaseException as exc:
        other = other_format(path, fmt) if isinstance(exc, CorruptRecordError) else None
        if other is not None:  # a dataset holds one format: say what this file is
            exc = CorruptRecordError(f"{other} (a dataset holds files of one format)")
        return _failed(session, shard, exc, path)


def _version(
    job: IngestJob, shard: ClaimedShard, scanned: ShardScan, st: os.stat_result, fp: str
) -> ShardVersion:
    """What the commit of ``scanned`` writes (duplicate keys within the shard settled
    by the job's policy first), read from the file whose stat and fingerprint these are."""
    columns = dedupe_within(scanned.columns, shard.stored, job.on_duplicate)
    seek = (
        None
        if scanned.seek_kind is None or scanned.seek_index is None
        else (scanned.seek_kind, scanned.seek_index)
    )
    dropped = len(scanned.columns) - len(columns)
    return ShardVersion(columns, st, fp, scanned.compression, seek, dropped)


def _commit(
    session: IngestSession,
    shard: ClaimedShard,
    version: ShardVersion,
    then: Callable[[], None] | None,
) -> ShardOutcome:
    """Commit a shard's scan, if this process still holds its claim (``then``: see
    :func:`index_claimed`)."""
    counts = session.commit(shard, version, then)
    if counts is None:
        return ShardOutcome(shard.stored, 0, CLAIM_LOST)
    return ShardOutcome(shard.stored, counts[0], duplicates=counts[1])


def _failed(
    session: IngestSession,
    shard: ClaimedShard,
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
            and session.job.on_bad_record == "raise"
        ):
            message, hint = SKIP_HINT.join(message), SKIP_HINT
        session.fail(shard, message)
        return ShardOutcome(shard.stored, 0, message, hint=hint)
    try:
        session.release(shard)  # give it back
    except SQLAlchemyError:
        if not isinstance(exc, SQLAlchemyError):
            raise
        # the claim dies with this process; the next ingest takes it over
    if isinstance(exc, SQLAlchemyError):  # the catalog itself failed (disk full, I/O error)
        raise catalog_error(backend_for(session.job.catalog).display, exc) from None
    raise exc


def _index_remote(
    session: IngestSession,
    shard: ClaimedShard,
    url: str,
    provide: ProvideEntries | None,
    then: Callable[[], None] | None,
) -> ShardOutcome:
    """:func:`index_claimed` of a remote shard: streamed once to a local copy, scanned
    (or its entries from ``provide``, judged against the object's identity now)."""
    job = session.job
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
        version = _version(job, shard, scanned, info.as_stat(), info.fingerprint or "")
        return _commit(session, shard, version, then)
    except BaseException as exc:
        renames = []
        if tmp:  # name the object (and its sidecar), not their local copies
            near, far = sidecar_of(fmt, tmp), sidecar_of(fmt, url)
            if near is not None and far is not None:
                renames += [(near, far), (os.path.basename(near), far.rsplit("/", 1)[-1])]
            renames.append((tmp, url))
        return _failed(session, shard, exc, url, renames)


@dataclass(frozen=True)
class _Carried:
    """What a worker started by a fork server needs of this process, which a forked
    one inherits: the dataset's format (maybe registered here at run time), the
    storage options configured here (their secrets are never stored), what the
    listings here said of each object (so no worker asks again) and the
    environment as it is now (credentials set after the fork server started)."""

    fmt: Format
    storage: Mapping[str, Mapping[str, Any]]
    listings: Mapping[str, Any]
    environment: Mapping[str, str]

    def apply(self) -> None:
        register_format(self.fmt.NAME, self.fmt, replace=True)
        for protocol, options in self.storage.items():
            remote.configure(protocol, **options)
        remote.keep_listings(self.listings)
        os.environ.clear()
        os.environ.update(self.environment)


def _work_all(job: IngestJob, turns: Any, out: Any, parent: int, carried: Any) -> None:
    """A worker: claim and index shards until none is claimable, sending
    ``("claimed", None, shard)`` once it holds its first shard, ``("done", outcome,
    shard)`` for each shard indexed (``shard``: the one it holds now, or None), then
    ``("end", None, None)`` (or ``("error", exception, None)``). The next claim
    follows each commit in the same turn at the write lock (``turns``: see
    :meth:`IngestSession.turn`), so this worker scans its next shard while the other
    commits (claiming after the other's commit left it idle for that commit). A
    signal, or the end of ``parent``, ends it quietly, its claim given back
    (:func:`~shardcat.catalog.processes.end_with_parent`). ``carried``: a
    :class:`_Carried` (not forked), else None."""
    session = IngestSession(job, turns=turns)
    try:
        end_with_parent(parent)
        if carried is not None:
            carried.apply()
        following: list[Any] = [_UNSET]

        def claim() -> None:
            following[0] = session.claim()

        with session.turn():
            claim()
        out.send(("claimed", None, following[0]))
        while (claimed := following[0]) is not None:
            following[0] = _UNSET
            outcome = index_claimed(session, claimed, then=claim)
            if following[0] is _UNSET:
                with session.turn():
                    claim()
            out.send(("done", outcome, following[0]))
        out.send(("end", None, None))
    except SystemExit:  # stopped (by the parent, or its end): the parent gives the claims back
        raise
    except BaseException as exc:
        try:
            out.send(("error", exc, None))
        except Exception:  # an exception that does not pickle
            out.send(("error", IngestError(f"ingest worker failed: {exc!r}", []), None))
    finally:
        session.close()
        out.close()


def _starting(job: IngestJob) -> tuple[Any, _Carried | None] | None:
    """How this process starts ingest workers: forked when that is safe, else by a
    fork server (see :func:`~shardcat.catalog.processes.worker_start_method`), with
    what they must be handed; None when they cannot be (a format that does not
    pickle, such as a class defined in a function): then this process scans."""
    ctx = multiprocessing.get_context(worker_start_method())
    if ctx.get_start_method() == "fork":
        return ctx, None
    carried = _Carried(
        get_format(job.format), remote.configured(), remote.listings(), dict(os.environ)
    )
    try:
        pickle.dumps(carried)
    except (pickle.PicklingError, AttributeError, TypeError):
        return None
    # its workers fork from a server that imported this (not the caller's __main__)
    ctx.set_forkserver_preload([__name__])
    return ctx, carried


def _death(proc: Any) -> str | None:
    """How a worker that closed its pipe without a last word ended: ``"signal
    SIGSEGV"``, ``"exit code 3"``; None when it ended cleanly or was stopped."""
    proc.join(STOP_SECONDS)
    code = proc.exitcode
    if code is None or code == 0 or code - 128 in (signal.SIGINT, *STOP_SIGNALS):
        return None
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


def _run_workers(
    session: IngestSession, count: int, note: Callable[[ShardOutcome | None], None]
) -> int | None:
    """Start ``count`` workers (:func:`_work_all`) and note their outcomes as they
    come; how many died (see below), None when none can be started here (see
    :func:`_starting`). Re-raises the
    first worker's error (the others are stopped and give their claims back; one
    that does not within :data:`STOP_SECONDS` is killed, its claim taken over at
    once by the next ingest). A worker that dies (a crash: a signal, an exit code)
    fails the shard it was indexing, naming how it died (not tried again in this
    ingest); one that died holding no shard is an :class:`IngestError` when no
    worker indexed anything (never a round of crashes after another)."""
    job = session.job
    starting = _starting(job)
    if starting is None:
        return False
    ctx, carried = starting
    # turns only where the catalog has one writer at a time (a server takes several)
    # (a TurnLock: a worker that dies in its turn hands it on, where a Lock would not)
    turns = TurnLock() if backend_for(job.catalog).one_writer else None
    procs: dict[Any, Any] = {}  # pipe -> worker process
    holding: dict[Any, ClaimedShard | None] = {}  # pipe -> the shard its worker indexes
    live: list[Any] = []
    deaths: list[str] = []
    noted = 0
    try:
        for _ in range(count):
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_work_all, args=(job, turns, writer, os.getpid(), carried), daemon=True
            )
            with stops_held():  # a stop comes once the worker is noted, to be stopped
                proc.start()
                procs[reader] = proc
                live.append(reader)
            writer.close()
        while live:
            waited: list[Any] = multiprocessing.connection.wait(live)
            for ready in waited:
                try:
                    kind, value, holding[ready] = ready.recv()
                except EOFError:  # died without a word
                    kind, value = "died", _death(procs[ready])
                if kind == "done":
                    noted += 1
                    note(value)
                if kind in ("claimed", "done"):
                    continue
                live.remove(ready)
                ready.close()
                if kind == "error":
                    raise value
                shard = holding.get(ready)
                if kind == "died" and value is not None:
                    deaths.append(value)
                if kind == "died" and value is not None and shard is not None:
                    message = f"{shard.stored}: its ingest worker died ({value}) indexing it"
                    if session.fail(shard, message):
                        noted += 1
                        note(ShardOutcome(shard.stored, 0, message))
        if deaths and not noted:  # (a shard whose worker died counts as noted)
            how = "" if carried is None else f"; started by a fork server ({_NOT_FORKED})"
            raise IngestError(f"every ingest worker died ({', '.join(deaths)}){how}", [])
    finally:
        for reader in live:
            reader.close()
        for proc in procs.values():
            if proc.is_alive() and live:
                proc.terminate()
        for proc in procs.values():
            proc.join(STOP_SECONDS)
            if proc.is_alive():
                proc.kill()
                proc.join()
        if turns is not None:
            turns.close()
    return len(deaths)


def _work_one(session: IngestSession) -> ShardOutcome | None:
    """Claim and index one shard in this process; None when nothing was claimable."""
    with session.turn():
        claimed = session.claim()
    return None if claimed is None else index_claimed(session, claimed)


# How the pending shards get indexed: called with the session, the work, the
# note(outcome) to call for each shard and the outcomes noted so far; returns once
# no shard is open. Local workers by default; the Ray engine's (see
# :mod:`shardcat.facade.ray_ingest`) fans them out as tasks.
ShareWork = Callable[
    [IngestSession, "Work", Callable[[ShardOutcome | None], None], list[ShardOutcome]], None
]


@dataclass(frozen=True)
class Work:
    """How :func:`run_ingest` shares the work: ``workers`` processes scan (forked when
    more than one), or ``share`` does it; ``provided`` maps stored shard paths to
    where their entries come from instead of a scan; ``progress`` is called with
    each shard's outcome; a wait for shards that live processes hold ends after
    ``wait_timeout`` seconds."""

    workers: int = 1
    progress: Callable[[ShardOutcome], None] | None = None
    provided: Mapping[str, ProvideEntries] | None = None
    wait_timeout: float | None = None
    share: ShareWork | None = None


def run_ingest(session: IngestSession, work: Work) -> list[ShardOutcome]:
    """Index every pending shard of the session's dataset, sharing the work with any
    other process doing the same; returns once no shard is pending or being indexed.

    The ``provided`` shards (see :class:`Work`) are claimed and committed first, in
    this process; the rest are scanned by ``work.workers`` processes as usual.
    A wait for shards that live processes hold is named (see
    :class:`~shardcat.catalog.claims.Waiting`) and given up after ``wait_timeout``.
    The session's kept connection is closed when this returns.
    """
    outcomes: list[ShardOutcome] = []

    def note(outcome: ShardOutcome | None) -> None:
        if outcome is not None:
            outcomes.append(outcome)
            if work.progress is not None:
                work.progress(outcome)

    try:
        session.defer_key_index()  # a first ingest builds it after the rows
        if work.provided:
            only = work.provided
            while (claimed := session.claim(only=only)) is not None:
                note(index_claimed(session, claimed, only[claimed.stored]))
        (work.share or _share_work)(session, work, note, outcomes)
    except BaseException:
        session.close()  # (stopped mid-transaction, maybe: a fresh connection from here)
        with contextlib.suppress(SQLAlchemyError):  # stopped, or failed: this process's
            session.give_back()  # claims and its workers' back
        session.close()
        try:
            session.finish_key_index()  # whatever is in, the next ingest goes on from
        except Exception:
            pass  # the error being raised says more; the next ingest builds the index
        session.close()
        raise
    failed, lost = session.finish_key_index()  # the key index, if this was a first ingest
    session.close()
    return [
        ShardOutcome(o.path, 0, failed[o.path], hint=KEEP_ONE)
        if o.path in failed
        else ShardOutcome(o.path, o.records - lost[o.path], o.error, o.duplicates + lost[o.path])
        if o.path in lost
        else o
        for o in outcomes
    ]


def _share_work(
    session: IngestSession,
    work: Work,
    note: Callable[[ShardOutcome | None], None],
    outcomes: list[ShardOutcome],
) -> None:
    """Claim and index shards, here or in workers, until none is open. Once a worker
    died, even a last shard is scanned by a worker, never here: a crash would end
    the caller's own process."""
    idle = crashed = False
    waiting = session.waiting(work.wait_timeout)
    while True:
        open_count = session.open_shards()
        if open_count == 0:
            return
        done = len(outcomes)
        died = None
        if work.workers > 1 and (open_count > 1 or crashed) and not idle:
            session.close()  # no kept connection crosses the fork
            died = _run_workers(session, min(work.workers, open_count), note)
            crashed = crashed or bool(died)
        if died is None:
            note(_work_one(session))
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
