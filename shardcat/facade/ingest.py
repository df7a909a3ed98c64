"""Ingest, the facade's side: scan shards in worker processes with their format,
hand the entries to the store's commit.

The store (:mod:`shardcat.catalog`) syncs shard rows, hands out claims and
commits; this module does what needs the files: it stats them, judges whether
a file is still the version its row indexed (size and mtime, then inode/ctime
and the fingerprint: :func:`~shardcat.readers.source.mismatch`, the readers'
rule too), and scans each claimed shard with its format
(:meth:`~shardcat.readers.formats.Format.scan_shard`: plain or compressed, with
seek points) in this process or a pool of forked workers. Other processes
doing the same at the same time share the work; every shard is indexed once.

A shard stored as a URL (see :mod:`shardcat.readers.remote`) is judged by its
object identity (size, ETag/version, Last-Modified), and indexed by streaming it
once into a temporary local file (large sequential reads, each conditional on
the ETag of the first) that the format scans as usual, then deleted.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from shardcat.catalog import postgres
from shardcat.catalog.claims import (
    CLAIM_LOST,
    claim_next,
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
from shardcat.catalog.engine import fork_generation, make_engine
from shardcat.catalog.sync import absolute_path, stored_path
from shardcat.errors import IngestError, MissingShardError, ShardcatError
from shardcat.readers import remote
from shardcat.readers.formats import Format, ShardScan, get_format
from shardcat.readers.source import Identity, fingerprint_file, mismatch
from shardcat.readers.view import STORAGE_OPTIONS

__all__ = [
    "ProvideEntries",
    "ShardOutcome",
    "judge_files",
    "local_copy",
    "raise_for_failures",
    "run_ingest",
]

POLL_SECONDS = 0.2

# Entries of a shard from elsewhere than scanning it (``catalog migrate``: a verified
# legacy index). Called with the shard's path and stat once the shard is claimed;
# None means "scan it after all". The result is committed like a scan's.
ProvideEntries = Callable[[str, os.stat_result], ShardScan | None]


@dataclass(frozen=True)
class ShardOutcome:
    """One shard indexed: its records, the records the commit dropped as duplicate
    keys (of this shard or of others it won against), or why it failed."""

    path: str
    records: int
    error: str | None = None
    duplicates: int = 0


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


def index_claimed(
    engine: Engine,
    job: IngestJob,
    shard_id: int,
    stored: str,
    owner: str,
    provide: ProvideEntries | None = None,
) -> ShardOutcome:
    """Scan a claimed shard and commit it (or record why it failed).

    ``provide`` may hand in the shard's entries instead of a scan (see
    :data:`ProvideEntries`); they go through the same checks and commit.
    """
    path = absolute_path(stored, job.catalog_dir)
    fmt = get_format(job.format)
    if remote.is_url(path):
        return _index_remote(engine, job, shard_id, stored, owner, path, provide)
    try:
        st = os.stat(path)
        fp = fingerprint_file(path, st.st_size)
        scanned = None if provide is None else provide(path, st)
        if scanned is None:
            scanned = fmt.scan_shard(path, job.options)  # plain or compressed (+ seek points)
        after = os.stat(path)
        if (after.st_size, after.st_mtime_ns, after.st_ino) != (
            st.st_size,
            st.st_mtime_ns,
            st.st_ino,
        ) or fingerprint_file(path, after.st_size) != fp:
            raise ShardcatError(f"{path}: the file changed while it was being indexed")
        columns = dedupe_within(scanned.columns, stored, job.on_duplicate)
        within = len(scanned.columns) - len(columns)
        seek = (
            None
            if scanned.seek_kind is None or scanned.seek_index is None
            else (scanned.seek_kind, scanned.seek_index)
        )
        with engine.begin() as conn:
            if not still_mine(conn, shard_id, owner):
                return ShardOutcome(stored, 0, CLAIM_LOST)
            n, dropped = commit_shard(
                conn, job, shard_id, stored, columns, st, fp, scanned.compression, seek, within
            )
        return ShardOutcome(stored, n, duplicates=dropped)
    except SQLAlchemyError as exc:  # the catalog itself failed (disk full, I/O error)
        try:
            release(engine, job.dataset_id, shard_id, owner, failed=None)
        except SQLAlchemyError:
            pass  # the claim dies with this process; the next ingest takes it over
        raise catalog_error(postgres.display(job.catalog), exc) from None
    except (ShardcatError, OSError) as exc:
        message = str(exc)
        if isinstance(exc, OSError) and not isinstance(exc, ShardcatError):
            message = f"{path}: {exc.strerror or exc}"
        release(engine, job.dataset_id, shard_id, owner, failed=message)
        return ShardOutcome(stored, 0, message)
    except BaseException:
        release(
            engine, job.dataset_id, shard_id, owner, failed=None
        )  # give it back; caller sees why
        raise


#: the bytes of a remote shard its format and options are detected from
SNIFF_REMOTE = 4 << 20


@contextlib.contextmanager
def local_copy(
    url: str,
    options: Mapping[str, Any] | None,
    limit: int | None = None,
    fmt: Format | None = None,
) -> Iterator[tuple[str, remote.RemoteInfo]]:
    """The object at ``url`` (its first ``limit`` bytes) streamed into a temporary
    file, deleted on exit; with the identity of the version read. With ``fmt``, the
    shard's sidecar (see :func:`sidecar_copy`) is fetched beside it too."""
    suffix = "-" + url.rsplit("/", 1)[-1][-60:]
    fd, tmp = tempfile.mkstemp(prefix="shardcat-", suffix=suffix)
    os.close(fd)
    try:
        info = remote.download(url, tmp, options, limit)
        if fmt is None:
            yield tmp, info
        else:
            with sidecar_copy(url, tmp, fmt, options):
                yield tmp, info
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


@contextlib.contextmanager
def sidecar_copy(
    url: str, copy: str, fmt: Format, options: Mapping[str, Any] | None
) -> Iterator[str | None]:
    """The sidecar of the remote shard ``url`` (``fmt.sidecar``: RecordIO's ``.idx``),
    when the store has one, fetched beside ``copy`` (the shard's local copy) under
    the name the format looks for there; deleted on exit. None: no sidecar."""
    far, near = fmt.sidecar(url), fmt.sidecar(copy)
    if far is None or near is None:
        yield None
        return
    try:
        remote.download(far, near, options)
    except MissingShardError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(near)
        yield None
        return
    try:
        yield near
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(near)


def _index_remote(
    engine: Engine,
    job: IngestJob,
    shard_id: int,
    stored: str,
    owner: str,
    url: str,
    provide: ProvideEntries | None = None,
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
            with local_copy(url, job.options.get(STORAGE_OPTIONS), fmt=fmt) as (tmp, info):
                scanned = fmt.scan_shard(tmp, job.options)
        columns = dedupe_within(scanned.columns, stored, job.on_duplicate)
        within = len(scanned.columns) - len(columns)
        seek = (
            None
            if scanned.seek_kind is None or scanned.seek_index is None
            else (scanned.seek_kind, scanned.seek_index)
        )
        with engine.begin() as conn:
            if not still_mine(conn, shard_id, owner):
                return ShardOutcome(stored, 0, CLAIM_LOST)
            n, dropped = commit_shard(
                conn,
                job,
                shard_id,
                stored,
                columns,
                info.as_stat(),
                info.fingerprint or "",
                scanned.compression,
                seek,
                within,
            )
        return ShardOutcome(stored, n, duplicates=dropped)
    except SQLAlchemyError as exc:
        with contextlib.suppress(SQLAlchemyError):
            release(engine, job.dataset_id, shard_id, owner, failed=None)
        raise catalog_error(job.catalog, exc) from None
    except (ShardcatError, OSError) as exc:
        message = str(exc)
        if tmp:  # name the object (and its sidecar), not their local copies
            near, far = fmt.sidecar(tmp), fmt.sidecar(url)
            if near is not None and far is not None:
                message = message.replace(near, far)
                message = message.replace(os.path.basename(near), far.rsplit("/", 1)[-1])
            message = message.replace(tmp, url)
        if isinstance(exc, OSError) and not isinstance(exc, ShardcatError):
            message = f"{url}: {exc.strerror or exc}"
        release(engine, job.dataset_id, shard_id, owner, failed=message)
        return ShardOutcome(stored, 0, message)
    except BaseException:
        release(engine, job.dataset_id, shard_id, owner, failed=None)
        raise


def _work_one(job: IngestJob) -> ShardOutcome | None:
    """Claim and index one shard in this process; None when nothing was claimable."""
    engine = _engine(job.catalog)
    owner = owner_id()
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
) -> list[ShardOutcome]:
    """Index every pending shard of the dataset, sharing the work with any other
    process doing the same; returns once no shard is pending or being indexed.

    ``provided`` maps stored shard paths to where their entries come from
    instead of a scan: those shards are claimed and committed first, in this
    process; the rest are scanned by ``workers`` processes as usual.
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
        _share_work(engine, job, workers, note, outcomes)
    except BaseException:
        _close_engines()
        try:
            finish_key_index(engine, job)  # whatever is in, the next ingest goes on from
        except Exception:
            pass  # the error being raised says more; the next ingest builds the index
        raise
    _close_engines()
    failed, lost = finish_key_index(engine, job)  # the key index, if this was a first ingest
    return [
        ShardOutcome(o.path, 0, failed[o.path])
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
            ctx = multiprocessing.get_context("fork")
            with ctx.Pool(min(workers, open_count)) as pool:
                for outcome in pool.imap_unordered(_work_one, [job] * open_count):
                    note(outcome)
        else:
            note(_work_one(job))
        idle = len(outcomes) == done
        if idle:
            time.sleep(POLL_SECONDS)  # other processes hold the remaining claims


def raise_for_failures(outcomes: Iterable[ShardOutcome]) -> None:
    """Raise :class:`IngestError` naming every shard that failed (others stay committed)."""
    failed = [o for o in outcomes if o.error is not None and o.error != CLAIM_LOST]
    if failed:
        more = f" (and {len(failed) - 1} more failed shards)" if len(failed) > 1 else ""
        raise IngestError(f"{failed[0].error}{more}", failed)
