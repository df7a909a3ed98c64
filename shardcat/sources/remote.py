"""Shards on object storage (``s3://``, ``http(s)://``, ``gs://``... through fsspec):
URLs, the identity of a remote object, and :class:`RemoteSource`, the byte
source whose ``pread`` is one ranged request.

**One request per read, no readahead.** ``pread(length, offset)`` is exactly one
ranged GET of the bytes asked for (clamped to the object's indexed size), never
through an fsspec file with a block cache. S3 (s3fs) and HTTP(S) are requested
directly with ``If-Match: <ETag>`` (an HTTP server that sends no ETag: with
``If-Unmodified-Since`` the indexed Last-Modified, and the answered one must be
it), so the object's identity is checked by the read itself, at no extra
request: a changed object answers 412 (or another ETag, or Last-Modified) and
the read is a :class:`~shardcat.errors.StaleShardError` naming the
URL, a deleted one answers 404 (:class:`~shardcat.errors.MissingShardError`).
GCS and Azure reads are conditional too (:mod:`shardcat.sources.remote_cloud`:
``ifGenerationMatch``, ``If-Match``). WebHDFS has no conditional read: a read is
``OPEN`` with offset and length (NameNode redirect + DataNode, two HTTP requests),
then GETFILESTATUS proves the file is still the indexed fileId, size and mtime
(after each single read; once per shard after a batch, in :meth:`RemoteSource.check`;
:mod:`shardcat.sources.remote_hdfs`). Other protocols read with
``fs.cat_file(path, start, end)`` and are checked the same way, by ``fs.info``
after the read (a batch: once per shard); where ``info`` tells a size only, it
is checked once when the source opens.

**Batches** (``Reader.get_many``) first hand a source all the ranges they will
read (:meth:`RemoteSource.prefetch`): ranges closer than :data:`MERGE_GAP`
(256 KiB: on object storage a request costs more than reading that much more)
are merged into one request of at most :data:`MAX_SPAN` (2 MiB) bytes, and the
requests of every shard of the batch run concurrently on a bounded pool
(:data:`CONCURRENCY` threads per process); reads are then served from those
bytes. A read that no prefetched range covers is its own request.

**Identity** of a remote object, as the catalog stores it in the shard row's
existing columns (:mod:`shardcat.sources.remote_identity`): ``size``; ``mtime_ns``
(Last-Modified, 0 when the store gives none); ``fingerprint`` ``"etag:<ETag>"`` (or
``"version:<id>"``: on GCS ``"version:<generation>"``, on HDFS
``"version:<fileId>@<modificationTime>"``; ``"etag#<hash>"`` for a long ETag).

**Transient errors** (5xx, connection reset or refused, timeouts) are retried
:data:`RETRIES` times with exponential backoff from :data:`BACKOFF` seconds; then
a :class:`~shardcat.errors.ShardIOError` naming the URL.

**Node-local cache** (optional, :mod:`shardcat.sources.cache`): whole shards on disk, capped.

**Fork safety.** Filesystem instances (their aiohttp sessions and event loop
thread) and the fetch pool are kept per process, keyed by ``os.getpid()``: a
forked DataLoader worker makes its own and never uses its parent's connections.

**Storage options** (endpoint, region, anonymous access...) come from fsspec's
own configuration and environment, from the dataset (stored at ingest, without
secrets: :func:`public_options`) and from :func:`configure` in this process
(secrets may go there; they are never written to the catalog).
"""

from __future__ import annotations

import functools
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from shardcat.errors import (
    CatalogError,
    MissingShardError,
    ShardcatError,
    ShardIOError,
    StaleShardError,
)
from shardcat.sources import cache as _cache
from shardcat.sources import remote_hdfs as _hdfs
from shardcat.sources.rawio import Source, pread_all
from shardcat.sources.remote_cloud import Changed as _Changed
from shardcat.sources.remote_cloud import cloud_get, gcs_generation, handles
from shardcat.sources.remote_get import Ask, Misplaced, Transient
from shardcat.sources.remote_get import get as _get
from shardcat.sources.remote_identity import RemoteInfo, remote_mismatch
from shardcat.sources.remote_identity import info_of as _info_of

__all__ = [
    "CONCURRENCY",
    "MAX_SPAN",
    "MERGE_GAP",
    "RemoteInfo",
    "RemoteSource",
    "configure",
    "configured",
    "filesystem",
    "glob_urls",
    "is_url",
    "keep_listings",
    "list_objects",
    "listed_info",
    "listings",
    "public_options",
    "remote_info",
    "remote_mismatch",
]

#: ranges of a batch this close (bytes between them) are fetched as one request
MERGE_GAP = 256 * 1024
#: the most bytes one merged request asks for
MAX_SPAN = 2 * 1024 * 1024
#: concurrent requests of a batch, per process
CONCURRENCY = 16
#: retries of a transient error, and the first backoff (doubled each time)
RETRIES = 4
BACKOFF = 0.05
#: the size of each read when a whole object is streamed (ingest)
STREAM_CHUNK = 8 * 1024 * 1024

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_SECRET = re.compile(
    r"key|secret|token|password|passwd|credential|session|auth|connection_str|kerb_kwargs", re.I
)
_HINT = {
    "s3": "s3fs",
    "s3a": "s3fs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "az": "adlfs",
    "abfs": "adlfs",
    "abfss": "adlfs",
    "http": "aiohttp",
    "https": "aiohttp",
    "webhdfs": "requests",
}


def is_url(path: str) -> bool:
    """Whether ``path`` is a URL (``scheme://...``) rather than a local path
    (``file://`` URLs count as local)."""
    m = _URL.match(path)
    return m is not None and m.group(1).lower() != "file"


def protocol_of(url: str) -> str:
    m = _URL.match(url)
    return "file" if m is None else m.group(1).lower()


def public_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` without anything that looks like a secret (keys naming a key,
    secret, token, password, credential, session or auth, and a connection string),
    recursively: what is stored with a dataset."""
    out: dict[str, Any] = {}
    for name, value in options.items():
        if _SECRET.search(str(name)):
            continue
        out[name] = public_options(value) if isinstance(value, Mapping) else value
    return out


_configured: dict[str, dict[str, Any]] = {}


def configure(protocol: str, **options: Any) -> None:
    """Storage options for ``protocol`` in this process (and the workers it forks),
    over those stored with datasets; may hold secrets (never stored)."""
    _configured[protocol] = dict(options)


def configured() -> dict[str, dict[str, Any]]:
    """The storage options :func:`configure` set in this process, by protocol."""
    return {protocol: dict(options) for protocol, options in _configured.items()}


_filesystems: dict[tuple[int, str, str], Any] = {}
_lock = threading.Lock()


def filesystem(url: str, options: Mapping[str, Any] | None = None) -> Any:
    """This process's fsspec filesystem for ``url``'s protocol and ``options``
    (a child after ``fork`` makes its own: see the module docstring)."""
    protocol = protocol_of(url)
    merged = {**(options or {}), **_configured.get(protocol, {})}
    if protocol in _hdfs.PROTOCOLS:  # the NameNode is named by the URL
        merged = {**_hdfs.url_options(url), **merged}
    key = (os.getpid(), protocol, repr(sorted(merged.items())))
    fs = _filesystems.get(key)
    if fs is not None:
        return fs
    with _lock:
        fs = _filesystems.get(key)
        if fs is None:
            try:
                import fsspec
            except ImportError:
                raise CatalogError(
                    f"{url}: reading object storage needs fsspec: pip install 'shardcat[remote]'"
                ) from None
            try:
                fs = fsspec.filesystem(protocol, skip_instance_cache=True, **merged)
            except Exception as exc:
                if protocol == "hdfs":  # pyarrow, a JVM, libhdfs, the Hadoop jars
                    raise CatalogError(_hdfs.not_loadable(url, exc)) from None
                if not isinstance(exc, (ImportError, ValueError)):
                    raise
                package = _HINT.get(protocol, f"the fsspec implementation of {protocol}://")
                raise CatalogError(
                    f"{url}: cannot open {protocol}:// ({exc}); install {package} "
                    "(pip install 'shardcat[remote]' has s3fs, aiohttp, gcsfs, adlfs and requests)"
                ) from None
            _filesystems[key] = fs
    return fs


# -- identity ----------------------------------------------------------------------


def _forget(fs: Any, url: str) -> None:
    """Drop what ``fs`` remembers of ``url`` and its folder (s3fs keeps listings per
    instance, for the life of this process): the store's answer now, not a listing
    made before an object was added or replaced."""
    invalidate = getattr(fs, "invalidate_cache", None)
    if invalidate is not None:
        invalidate(url)


def remote_info(url: str, options: Mapping[str, Any] | None = None) -> RemoteInfo:
    """The object's identity now; :class:`MissingShardError` if it does not exist."""
    fs = filesystem(url, options)
    _forget(fs, url)
    try:
        info = _retrying(url, lambda: fs.info(url))
    except FileNotFoundError:
        raise MissingShardError(f"{url} does not exist (deleted or moved?)", url) from None
    if info.get("type") == "directory":
        raise MissingShardError(f"{url} is a directory, not a shard", url)
    return _info_of(info)


# what the latest listing said of each object it matched (forked workers inherit it)
_listed: dict[str, RemoteInfo] = {}


def listed_info(url: str) -> RemoteInfo | None:
    """The identity of ``url`` as the latest glob listing of it in this process gave
    it (size, ETag, Last-Modified), so that judging N listed objects costs that one
    listing rather than N HEADs; None when it was not listed (or the listing gave no
    size). Reads stay conditional on the ETag, so a change since is still caught."""
    return _listed.get(url)


def listings() -> dict[str, RemoteInfo]:
    """Every identity the listings of this process kept (:func:`listed_info`), for a
    worker that does not inherit them (one a fork server started)."""
    return dict(_listed)


def keep_listings(found: Mapping[str, RemoteInfo]) -> None:
    """Keep identities another process's listings gave (see :func:`listings`)."""
    _listed.update(found)


def glob_urls(pattern: str, options: Mapping[str, Any] | None = None) -> list[str]:
    """The objects a URL stands for: itself, or its glob matches (:func:`list_objects`)."""
    if not any(c in pattern for c in "*?["):
        _listed.pop(pattern, None)
        return [pattern]
    return list(list_objects(pattern, options))


def list_objects(
    pattern: str, options: Mapping[str, Any] | None = None, *, below: int | None = -1
) -> dict[str, RemoteInfo]:
    """The objects the glob ``pattern`` matches (``below``: -1), else those under the
    prefix ``pattern``, ``below`` levels down (None: all; one listing of the prefix),
    listed afresh: URL -> identity as listed (kept: :func:`listed_info`), sorted."""
    fs, protocol = filesystem(pattern, options), protocol_of(pattern)
    _forget(fs, pattern.split("*", 1)[0].split("?", 1)[0].split("[", 1)[0])
    listing = fs.glob if below == -1 else functools.partial(fs.find, maxdepth=below)
    found = _retrying(pattern, lambda: listing(pattern, detail=True))
    if not isinstance(found, Mapping):  # an implementation without details
        found = {path: {} for path in found}
    out = {}
    for path, info in found.items():
        if is_url(path):
            url = path
        elif protocol in _hdfs.PROTOCOLS:  # the NameNode's address is the pattern's
            url = _hdfs.full_url(pattern, path)
        else:
            url = f"{protocol}://{path}"
        if info.get("type") == "directory":
            continue
        out[url] = known = _info_of(info)
        if info.get("size") is None or known.fingerprint is None:
            _listed.pop(url, None)
        else:
            _listed[url] = known
    return dict(sorted(out.items()))


# -- requests ----------------------------------------------------------------------


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, (Transient, TimeoutError, ConnectionError)):
        return True
    name = type(exc).__name__
    if name in {
        "ServerDisconnectedError",
        "ClientConnectorError",
        "ClientOSError",
        "ClientPayloadError",
        "EndpointConnectionError",
        "ConnectionClosedError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "IncompleteRead",
        "ConnectionError",  # requests' (WebHDFS), not the builtin
        "ChunkedEncodingError",
        "ReadTimeout",
    }:
        return True
    if isinstance(exc, (FileNotFoundError, PermissionError, _Changed, Misplaced)):
        return False
    return isinstance(exc, OSError) and any(
        word in str(exc) for word in ("503", "500", "502", "504", "SlowDown", "reset", "refused")
    )


def _retrying(url: str, call: Callable[[], Any]) -> Any:
    """``call()``, retried on transient errors with backoff; then a ShardIOError."""
    delay = BACKOFF
    for attempt in range(RETRIES + 1):
        try:
            return call()
        except Exception as exc:
            if not _transient(exc):
                raise
            if attempt == RETRIES:
                raise ShardIOError(
                    f"{url}: the store did not answer after {RETRIES + 1} attempts: "
                    f"{type(exc).__name__}: {exc}",
                    url,
                ) from None
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


def _etag_of(fingerprint: str | None) -> str | None:
    if fingerprint is not None and fingerprint.startswith("etag:"):
        return fingerprint[5:]
    return None


class RemoteSource(Source):
    """An object on remote storage as a :class:`Source`: each ``pread`` one ranged
    request, conditional on the indexed ETag (see the module docstring)."""

    def __init__(
        self,
        url: str,
        size: int,
        mtime_ns: int,
        fingerprint: str | None,
        options: Mapping[str, Any] | None = None,
        *,
        use_cache: bool = True,
    ) -> None:
        self.path = url
        self.size = size
        self._fingerprint = fingerprint
        self._etag = _etag_of(fingerprint)
        self._fs = filesystem(url, options)
        self._batch: list[tuple[int, int, Future[bytes]]] = []
        self._direct = protocol_of(url) in ("s3", "s3a", "http", "https")
        self._cloud = handles(protocol_of(url), self._fs)  # GCS, Azure: remote_cloud
        self._expect = self._etag
        if self._cloud and fingerprint is not None and fingerprint.startswith("version:"):
            self._expect = fingerprint[8:]  # the GCS generation
        self._local: int | None = None  # the node-local cached copy (shardcat.sources.cache)
        self._closed = False
        self._mtime_ns = mtime_ns
        self._protocol = protocol_of(url)
        http_dated = self._protocol in ("http", "https") and mtime_ns > 0
        conditional = (self._direct or self._cloud) and (self._expect is not None or http_dated)
        # No conditional read (WebHDFS, other protocols): a status check follows every
        # read, when the store tells more of an object than its size (module docstring)
        self._after = not conditional and (fingerprint is not None or mtime_ns > 0)
        if not conditional and not self._after:
            self._check_info(mtime_ns)  # its size is all there is to check: once, now
        config = _cache.cache_config() if use_cache else None
        if config is not None and size > 0:
            identity = fingerprint or f"{size}:{mtime_ns}"
            self._local = _cache.open_cached(config, url, identity, size)
            if self._local is None:
                threading.Thread(target=self._fill, args=(config, identity), daemon=True).start()

    def _fill(self, config: _cache.CacheConfig, identity: str) -> None:
        """Fetch the whole shard into the node-local cache; read it from there after."""
        try:
            fd = _cache.fill(config, self.path, identity, self.size, self._checked, STREAM_CHUNK)
        except Exception:  # the cache is an optimisation: reads go to the store
            return
        if fd is not None:
            if self._closed:
                os.close(fd)
            else:
                self._local = fd

    def _check_info(self, mtime_ns: int) -> None:
        now = self._info()
        problem = remote_mismatch(self.size, mtime_ns, self._fingerprint, now)
        if problem is not None:
            raise self._stale(problem)

    def _info(self) -> RemoteInfo:
        try:
            return _info_of(_retrying(self.path, lambda: self._fs.info(self.path)))
        except FileNotFoundError:
            raise self._missing() from None

    def _missing(self) -> MissingShardError:
        return MissingShardError(
            f"{self.path} no longer exists (deleted or moved after it was indexed); "
            "re-ingest the dataset to drop it",
            self.path,
        )

    def _stale(self, problem: str) -> StaleShardError:
        return StaleShardError(
            f"{self.path} changed after it was indexed: {problem}; re-ingest it "
            "(catalog ingest, or reader.rebuild_index())",
            self.path,
        )

    def fetch(self, start: int, end: int) -> bytes:
        """Bytes ``start:end`` (within the indexed size) in one request, checked (or
        from the node-local cached copy)."""
        local = self._local
        if local is not None:
            return pread_all(local, end - start, start)
        return self._checked(start, end)

    def _checked(self, start: int, end: int) -> bytes:
        """:meth:`_remote`, followed by the status check where reads are not conditional
        (see the module docstring: after the bytes, it proves they came from the
        indexed file)."""
        data = self._remote(start, end)
        if self._after:
            self._check_info(self._mtime_ns)
        return data

    def _remote(self, start: int, end: int) -> bytes:
        """Bytes ``start:end`` from the store, in one request, checked."""
        if start >= end:
            return b""
        try:
            if self._cloud:
                data, etag = _retrying(self.path, lambda: self._cloud_get(start, end)), None
            else:
                ask = Ask(self.path, start, end, self._etag, self._mtime_ns, self.size)
                data, etag = _retrying(self.path, lambda: _get(self._fs, self._protocol, ask))
        except FileNotFoundError:
            raise self._missing() from None
        except _Changed:
            raise self._stale(
                "its ETag differs" if self._expect else "its Last-Modified differs"
            ) from None
        except OSError as exc:  # refused, or an answer that does not hold the bytes
            if isinstance(exc, ShardcatError):
                raise
            raise ShardIOError(
                f"{self.path}: cannot read bytes {start}-{end - 1}: {exc}", self.path
            ) from None
        if self._etag is not None and etag is not None and etag != self._etag:
            raise self._stale("its ETag differs")
        if len(data) != end - start:
            raise self._stale(f"a read of {end - start} bytes at byte {start} got {len(data)}")
        return bytes(data)

    def _cloud_get(self, start: int, end: int) -> bytes:
        """GCS, Azure: one conditional request; a second asking the generation when the
        store named none in its answer (an emulator: see remote_cloud)."""
        data, proven = cloud_get(
            protocol_of(self.path), self._fs, self.path, start, end, self._expect
        )
        if not proven and self._expect != gcs_generation(self._fs, self.path):
            raise _Changed("another generation")
        return data

    def pread(self, length: int, offset: int) -> bytes:
        end = min(offset + length, self.size)
        for start, stop, future in self._batch:
            if start <= offset and end <= stop:
                data = future.result()
                return data[offset - start : end - start]
        return self.fetch(offset, end)

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Start fetching ``(offset, length)`` ranges, merged (see the module
        docstring); later reads inside them are served from these requests."""
        if self._local is not None:
            return  # read locally
        spans: list[list[int]] = []
        for offset, length in sorted(ranges):
            start, stop = max(0, offset), min(offset + length, self.size)
            if start >= stop:
                continue
            if spans and start - spans[-1][1] <= MERGE_GAP and stop - spans[-1][0] <= MAX_SPAN:
                spans[-1][1] = max(spans[-1][1], stop)
            else:
                spans.append([start, stop])
        pool, fetch = _pool(), self._remote if self._after else self.fetch
        self._batch = [(a, b, pool.submit(fetch, a, b)) for a, b in spans]

    def check(self) -> None:
        """Ends a batch (its prefetched bytes are dropped). Every read was conditional
        on the ETag, except on WebHDFS and other protocols: one status request now
        covers the batch."""
        batch, self._batch = self._batch, []
        for _, _, future in batch:
            future.cancel()
        if self._after and self._local is None:
            self._check_info(self._mtime_ns)

    def close(self) -> None:
        self._batch = []
        self._closed = True
        local, self._local = self._local, None
        if local is not None:
            os.close(local)


_pools: dict[int, ThreadPoolExecutor] = {}


def _pool() -> ThreadPoolExecutor:
    """This process's bounded pool for a batch's requests."""
    pid = os.getpid()
    pool = _pools.get(pid)
    if pool is None:
        pool = _pools.setdefault(pid, ThreadPoolExecutor(CONCURRENCY, "shardcat-remote"))
    return pool
