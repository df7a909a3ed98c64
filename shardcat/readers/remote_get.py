"""The one ranged request of a read, per protocol, for
:class:`~shardcat.readers.remote.RemoteSource`: S3 ``GetObject`` with ``IfMatch``,
HTTP(S) ``GET`` with ``If-Match`` (no ETag: ``If-Unmodified-Since`` and the
answered ``Last-Modified`` checked), WebHDFS ``OPEN``
(:mod:`shardcat.readers.remote_hdfs`), any other fsspec protocol's ``cat_file``.
A ranged answer is placed by its ``Content-Range``: a wider, aligned range is cut
to the bytes asked for, and one that does not hold them is :class:`Misplaced`."""

from __future__ import annotations

import email.utils
import re
from typing import Any

from shardcat.readers import remote_hdfs as _hdfs
from shardcat.readers.remote_cloud import Changed

__all__ = ["Misplaced", "Transient", "get"]


class Transient(Exception):
    """A 5xx answer: worth retrying."""


class Misplaced(OSError):
    """A ranged answer that does not hold the bytes asked for (not retried)."""


def _get_s3(fs: Any, url: str, start: int, end: int | None, etag: str | None) -> tuple[bytes, Any]:
    import fsspec.asyn

    bucket, key, version = fs.split_path(url)

    async def go() -> tuple[bytes, Any]:
        kw: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if end is not None:
            kw["Range"] = f"bytes={start}-{end - 1}"
        if etag:
            kw["IfMatch"] = etag
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
        return _answered(data, resp.get("ContentRange"), start, end), resp.get("ETag")

    return fsspec.asyn.sync(fs.loop, go)  # type: ignore[no-any-return]


def _get_http(
    fs: Any, url: str, start: int, end: int | None, etag: str | None, mtime_ns: int
) -> tuple[bytes, Any]:
    """One GET; with no ETag known, conditional on the indexed Last-Modified
    (``If-Unmodified-Since``, and the one answered, if any, must be it, for
    servers that ignore the condition)."""
    import fsspec.asyn

    since = None if etag or not mtime_ns else mtime_ns // 1_000_000_000

    async def go() -> tuple[bytes, Any]:
        session = await fs.set_session()
        headers = {}
        if end is not None:
            headers["Range"] = f"bytes={start}-{end - 1}"
        if etag:
            headers["If-Match"] = etag
        elif since is not None:
            headers["If-Unmodified-Since"] = email.utils.formatdate(since, usegmt=True)
        async with session.get(fs.encode_url(url), headers=headers) as r:
            if r.status == 404:
                raise FileNotFoundError(url)
            if r.status == 412:
                raise Changed("412 Precondition Failed")
            if r.status >= 500:
                raise Transient(f"HTTP {r.status}")
            if r.status >= 400:
                raise OSError(f"HTTP {r.status} {r.reason}")
            answered = _seconds(r.headers.get("Last-Modified"))  # None: not sent
            if since is not None and answered is not None and answered != since:
                raise Changed("its Last-Modified differs")
            data = await r.read()
            if r.status == 200 and end is not None:  # the server ignored Range
                data = data[start:end]
            elif r.status == 206:
                data = _answered(data, r.headers.get("Content-Range"), start, end)
            return data, r.headers.get("ETag")

    return fsspec.asyn.sync(fs.loop, go)  # type: ignore[no-any-return]


_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(?:\d+|\*)")


def _answered(data: bytes, content_range: str | None, start: int, end: int | None) -> bytes:
    """Bytes ``start:end`` out of a ranged answer, placed by its ``Content-Range``
    (a server or proxy may answer a wider, aligned range); an OSError when the
    answer does not hold them (:class:`Misplaced`: never bytes from elsewhere)."""
    if content_range is None or end is None:
        return data
    m = _CONTENT_RANGE.fullmatch(content_range.strip())
    if m is None:
        raise Misplaced(f"the store answered an unreadable Content-Range {content_range!r}")
    first = int(m.group(1))
    if first > start or int(m.group(2)) - first + 1 != len(data):
        raise Misplaced(
            f"the store answered bytes {content_range.strip()} ({len(data)} bytes) "
            f"for bytes {start}-{end - 1}"
        )
    return data[start - first : end - first]


def _seconds(http_date: str | None) -> int | None:
    try:
        return int(email.utils.parsedate_to_datetime(http_date or "").timestamp())
    except (TypeError, ValueError):
        return None


def get(
    fs: Any,
    url: str,
    protocol: str,
    start: int,
    end: int | None,
    etag: str | None,
    mtime_ns: int = 0,
) -> tuple[bytes, str | None]:
    """Bytes ``start:end`` of the object (``end`` None: to its end) in one request,
    conditional on ``etag`` (HTTP without one: on ``mtime_ns``) where the protocol
    allows; and the ETag answered."""
    if protocol in ("s3", "s3a") and hasattr(fs, "_call_s3"):
        return _get_s3(fs, url, start, end, etag)
    if protocol in ("http", "https") and hasattr(fs, "set_session"):
        return _get_http(fs, url, start, end, etag, mtime_ns)
    if protocol == "webhdfs" and hasattr(fs, "pars") and end is not None:
        return _hdfs.read_range(fs, url, start, end), None
    return fs.cat_file(url, start=start, end=end), None
