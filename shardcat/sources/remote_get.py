"""The one ranged request of a read, per protocol, for
:class:`~shardcat.sources.remote.RemoteSource`: S3 ``GetObject`` with ``IfMatch``,
HTTP(S) ``GET`` with ``If-Match`` (no ETag: ``If-Unmodified-Since`` and the
answered ``Last-Modified`` checked), WebHDFS ``OPEN``
(:mod:`shardcat.sources.remote_hdfs`), any other fsspec protocol's ``cat_file``.

**An answer is proven before its bytes are used** (:func:`placed`): a ranged
answer (206, or S3's ``ContentRange``) must name in its ``Content-Range`` a range
that holds the bytes asked, exactly as long as its body, of an object of the
indexed size (a wider, aligned range is cut to the bytes asked); an answer
without ``Content-Range`` (200: the server ignored ``Range``) must be the whole
object, of the indexed size, and is cut to the range; any other status is
refused. A refused answer is :class:`Misplaced` (never retried: the reader's
:class:`~shardcat.errors.ShardIOError`), never bytes from elsewhere. A body
moved under a true ``Content-Range`` cannot be told from headers: the record's
own check catches it (a batch checks the TFRecord frame / tar header its
prefetched range holds)."""

from __future__ import annotations

import email.utils
import re
from dataclasses import dataclass
from typing import Any

from shardcat.sources import remote_hdfs as _hdfs
from shardcat.sources.remote_cloud import Changed

__all__ = ["Ask", "Misplaced", "Transient", "get", "placed"]


class Transient(Exception):
    """A 5xx answer: worth retrying."""


class Misplaced(OSError):
    """An answer that does not hold the bytes asked for (not retried)."""


@dataclass(frozen=True)
class Ask:
    """One read: bytes ``start:end`` (``end`` None: to the end) of ``url``, conditional
    on ``etag`` (HTTP without one: on ``mtime_ns``), of an object of ``size`` bytes as
    indexed (None: not known, as when a shard is first streamed)."""

    url: str
    start: int
    end: int | None
    etag: str | None = None
    mtime_ns: int = 0
    size: int | None = None


def _get_s3(fs: Any, ask: Ask) -> tuple[bytes, Any]:
    import fsspec.asyn

    bucket, key, version = fs.split_path(ask.url)

    async def go() -> tuple[bytes, Any]:
        kw: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if ask.end is not None:
            kw["Range"] = f"bytes={ask.start}-{ask.end - 1}"
        if ask.etag:
            kw["IfMatch"] = ask.etag
        if version:
            kw["VersionId"] = version
        try:
            resp = await fs._call_s3("get_object", **kw)
        except OSError as exc:
            text = str(exc)
            if "PreconditionFailed" in text or "412" in text or "pre-condition" in text:
                raise Changed(str(exc)) from None
            raise
        body = resp["Body"]
        try:
            data = await body.read()
        finally:
            body.close()
        return placed(data, resp.get("ContentRange"), ask), resp.get("ETag")

    return fsspec.asyn.sync(fs.loop, go)  # type: ignore[no-any-return]


def _get_http(fs: Any, ask: Ask) -> tuple[bytes, Any]:
    """One GET; with no ETag known, conditional on the indexed Last-Modified
    (``If-Unmodified-Since``, and the one answered, if any, must be it, for
    servers that ignore the condition)."""
    import fsspec.asyn

    since = None if ask.etag or not ask.mtime_ns else ask.mtime_ns // 1_000_000_000

    async def go() -> tuple[bytes, Any]:
        session = await fs.set_session()
        headers = {}
        if ask.end is not None:
            headers["Range"] = f"bytes={ask.start}-{ask.end - 1}"
        if ask.etag:
            headers["If-Match"] = ask.etag
        elif since is not None:
            headers["If-Unmodified-Since"] = email.utils.formatdate(since, usegmt=True)
        async with session.get(fs.encode_url(ask.url), headers=headers) as r:
            if r.status == 404:
                raise FileNotFoundError(ask.url)
            if r.status == 412:
                raise Changed("412 Precondition Failed")
            if r.status >= 500:
                raise Transient(f"HTTP {r.status}")
            if r.status >= 400:
                raise OSError(f"HTTP {r.status} {r.reason}")
            if r.status not in (200, 206):
                raise Misplaced(f"the store answered HTTP {r.status} {r.reason}, not 200 or 206")
            answered = _seconds(r.headers.get("Last-Modified"))  # None: not sent
            if since is not None and answered is not None and answered != since:
                raise Changed("its Last-Modified differs")
            data = await r.read()
            content_range = r.headers.get("Content-Range")
            if r.status == 206 and content_range is None:
                raise Misplaced("the store answered 206 Partial Content without a Content-Range")
            return placed(data, content_range if r.status == 206 else None, ask), r.headers.get(
                "ETag"
            )

    return fsspec.asyn.sync(fs.loop, go)  # type: ignore[no-any-return]


_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


def placed(data: bytes, content_range: str | None, ask: Ask) -> bytes:
    """The bytes ``ask`` names out of an answer (see the module docstring): placed by
    its ``Content-Range`` (None: the answer is the whole object); :class:`Misplaced`
    when the answer does not prove it holds them."""
    start, end = ask.start, ask.end
    if end is None:
        return data
    if content_range is None:
        if ask.size is not None and len(data) != ask.size:
            raise Misplaced(
                f"the store answered {len(data)} bytes without a Content-Range for bytes "
                f"{start}-{end - 1}, not the whole object of {ask.size} bytes"
            )
        return data[start:end]
    m = _CONTENT_RANGE.fullmatch(content_range.strip())
    if m is None:
        raise Misplaced(f"the store answered an unreadable Content-Range {content_range!r}")
    first, last, total = int(m.group(1)), int(m.group(2)), m.group(3)
    if (
        first > start
        or last < end - 1
        or last - first + 1 != len(data)
        or (total != "*" and ask.size is not None and int(total) != ask.size)
    ):
        raise Misplaced(
            f"the store answered Content-Range {content_range.strip()!r} with {len(data)} "
            f"bytes for bytes {start}-{end - 1} of an object of {ask.size} bytes"
        )
    return data[start - first : end - first]


def _seconds(http_date: str | None) -> int | None:
    try:
        return int(email.utils.parsedate_to_datetime(http_date or "").timestamp())
    except (TypeError, ValueError):
        return None


def get(fs: Any, protocol: str, ask: Ask) -> tuple[bytes, str | None]:
    """The bytes ``ask`` names in one request, conditional on its ``etag`` (HTTP
    without one: on its ``mtime_ns``) where the protocol allows; and the ETag answered."""
    if protocol in ("s3", "s3a") and hasattr(fs, "_call_s3"):
        return _get_s3(fs, ask)
    if protocol in ("http", "https") and hasattr(fs, "set_session"):
        return _get_http(fs, ask)
    if protocol == "webhdfs" and hasattr(fs, "pars") and ask.end is not None:
        return _hdfs.read_range(fs, ask.url, ask.start, ask.end), None
    return fs.cat_file(ask.url, start=ask.start, end=ask.end), None
