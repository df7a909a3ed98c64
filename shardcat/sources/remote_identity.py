"""The identity of an object on remote storage, as the catalog stores it in a
shard row's existing columns (see :mod:`shardcat.sources.remote`):
:class:`RemoteInfo` (size, ETag, version, mtime) from what a store's ``info`` or
listing answers (:func:`info_of`), and :func:`remote_mismatch`, what makes an
object another version than the one indexed."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

from shardcat.sources import remote_hdfs as _hdfs

__all__ = ["RemoteInfo", "info_of", "remote_mismatch"]


class RemoteInfo:
    """What the store says of an object: size, ETag, version, mtime (ns, 0: none)."""

    __slots__ = ("etag", "mtime_ns", "size", "version")

    def __init__(self, size: int, etag: str | None, version: str | None, mtime_ns: int) -> None:
        self.size, self.etag, self.version, self.mtime_ns = size, etag, version, mtime_ns

    def as_stat(self) -> os.stat_result:
        """The identity as a stat result, for the ingest's bookkeeping: size, mtime;
        inode and ctime None (stored NULL)."""
        seconds = self.mtime_ns / 1e9
        fields: list[Any] = [0o100444, None, 0, 1, 0, 0, self.size]
        fields += [seconds] * 6 + [self.mtime_ns, self.mtime_ns, None]
        return os.stat_result(fields)

    @property
    def fingerprint(self) -> str | None:
        """How the catalog stores the ETag (or version) in the shard's fingerprint column."""
        if self.etag:
            text = f"etag:{self.etag}"
            if len(text) <= 64:
                return text
            return "etag#" + hashlib.sha256(self.etag.encode()).hexdigest()[:40]
        if self.version:
            return f"version:{self.version}"[:64]
        return None


def _mtime_ns(info: Mapping[str, Any]) -> int:
    for name in ("LastModified", "last_modified", "mtime", "updated", "Last-Modified"):
        value = info.get(name)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return int(value.timestamp() * 1e9)
        if isinstance(value, (int, float)):
            return int(value * 1e9)
        if isinstance(value, str):
            from email.utils import parsedate_to_datetime

            try:
                return int(parsedate_to_datetime(value).timestamp() * 1e9)
            except (TypeError, ValueError):
                try:
                    from datetime import datetime

                    return int(
                        datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1e9
                    )
                except ValueError:
                    continue
    return 0


def info_of(info: Mapping[str, Any]) -> RemoteInfo:
    hdfs = _hdfs.identity(info)  # WebHDFS: fileId and modificationTime
    if hdfs is not None:
        return RemoteInfo(hdfs[0], None, hdfs[1], hdfs[2])
    etag = info.get("ETag") or info.get("etag") or info.get("generation")
    version = info.get("VersionId") or info.get("version_id")
    if info.get("kind") == "storage#object" and info.get("generation"):  # GCS
        etag, version = None, info["generation"]
    return RemoteInfo(
        int(info.get("size") or 0),
        None if etag is None else str(etag),
        None if version is None else str(version),
        _mtime_ns(info),
    )


def remote_mismatch(
    size: int, mtime_ns: int, fingerprint: str | None, now: RemoteInfo
) -> str | None:
    """What makes the object ``now`` another version than the one indexed with
    ``size``/``mtime_ns``/``fingerprint``; None when it is that version. The ETag (or
    version) decides when recorded; else size and mtime."""
    if now.size != size:
        return f"its size is {now.size} bytes, the catalog indexed {size}"
    if fingerprint is not None and now.fingerprint is not None:
        if now.fingerprint == fingerprint:
            return None
        if fingerprint.startswith("version:"):  # GCS generation, HDFS fileId@mtime
            return f"its version is {now.fingerprint[8:]}, the catalog indexed {fingerprint[8:]}"
        return "its ETag differs"
    if mtime_ns and now.mtime_ns and now.mtime_ns != mtime_ns:
        return "it was modified (Last-Modified differs)"
    return None
