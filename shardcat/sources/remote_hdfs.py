"""HDFS for :mod:`shardcat.sources.remote`: ``webhdfs://namenode:port/path`` (the
WebHDFS REST API every NameNode serves, fsspec's pure-HTTP ``webhdfs``
implementation) and ``hdfs://`` (pyarrow's HadoopFileSystem over libhdfs).

**Addresses**: the NameNode's host, port and user come from the URL
(``webhdfs://user@namenode:9870/data``); listings answer paths without them,
which :func:`full_url` puts back.

**Identity**: a FileStatus's ``length``, ``modificationTime`` (ms) and
``fileId`` (the inode id: a file replaced under the same name is a new file with
a new id; HDFS files are otherwise append-only). The shard's fingerprint is
``version:<fileId>@<modificationTime>``.

**A read** (:func:`read_range`) is ``OPEN`` with ``offset`` and ``length``: the
NameNode answers 307 with a DataNode URL, which streams exactly those bytes (two
HTTP requests by protocol; an HttpFS gateway answers the bytes at once, one).
Never fsspec's ``cat_file``, which opens a buffered file: a GETFILESTATUS and a
5 MB readahead per read. WebHDFS has no conditional read, so
:class:`~shardcat.sources.remote.RemoteSource` asks GETFILESTATUS *after* the
bytes arrive (after each single read, once per shard after a batch): fileIds are
never reused, so a status naming the indexed fileId, size and mtime after the
read proves the read came from that file.

**Errors**: 404 (FileNotFoundException) is FileNotFoundError, 401/403
PermissionError, 5xx and failed connections retryable ``OSError``s whose text
names no query string (a delegation token travels in it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit

#: protocols read through this module's rules
PROTOCOLS = frozenset({"webhdfs", "hdfs"})
#: seconds to connect, and to wait for an answer's bytes
TIMEOUT = (10, 120)


def url_options(url: str) -> dict[str, Any]:
    """The filesystem options a URL carries: the NameNode's ``host``, ``port``, ``user``."""
    parts = urlsplit(url)
    out: dict[str, Any] = {"host": parts.hostname or "default"}
    if parts.port:
        out["port"] = parts.port
    if parts.username:
        out["user"] = parts.username
    return out


def full_url(pattern: str, path: str) -> str:
    """``path`` as a listing of ``pattern`` answers it (``/data/x.tar``), as a URL
    naming the same NameNode as ``pattern``."""
    if "://" in path:
        return path
    parts = urlsplit(pattern)
    return f"{parts.scheme}://{parts.netloc}/{path.lstrip('/')}"


def identity(info: Mapping[str, Any]) -> tuple[int, str, int] | None:
    """``(size, version, mtime_ns)`` of a WebHDFS FileStatus; None for another store's info."""
    if "fileId" not in info or "modificationTime" not in info:
        return None
    millis = int(info["modificationTime"])
    return int(info["length"]), f"{info['fileId']}@{millis}", millis * 1_000_000


def not_loadable(url: str, exc: BaseException) -> str:
    """What to tell a user whose ``hdfs://`` (pyarrow, libhdfs) filesystem cannot start."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    host = urlsplit(url).hostname or "namenode"
    return (
        f"{url}: cannot open hdfs:// ({first}): hdfs:// goes through pyarrow's "
        "HadoopFileSystem, which needs pyarrow, a JVM (JAVA_HOME), libhdfs.so "
        "(ARROW_LIBHDFS_DIR or $HADOOP_HOME/lib/native) and the Hadoop jars on "
        "CLASSPATH (`hadoop classpath --glob`); without a Hadoop client, read the "
        f"same files over HTTP through the NameNode's WebHDFS API: webhdfs://{host}:9870/..."
    )


def read_range(fs: Any, url: str, start: int, end: int) -> bytes:
    """Bytes ``start:end`` of the file through ``OPEN`` (see the module docstring);
    FileNotFoundError, PermissionError or a retryable OSError on failure."""
    import requests

    target = fs._apply_proxy(fs.url + quote(fs._strip_protocol(url), safe="/="))
    params = {**fs.pars, "op": "OPEN", "offset": str(start), "length": str(end - start)}
    try:
        answer = fs.session.get(target, params=params, allow_redirects=False, timeout=TIMEOUT)
        if answer.status_code in (301, 302, 303, 307, 308):  # to the DataNode
            _raise_for(answer, url, "NameNode")
            location = fs._apply_proxy(answer.headers["Location"])
            answer = fs.session.get(location, timeout=TIMEOUT)
            _raise_for(answer, url, "DataNode")
        else:
            _raise_for(answer, url, "NameNode")
        return bytes(answer.content)
    except (requests.ConnectionError, requests.Timeout) as exc:
        raise ConnectionError(f"{type(exc).__name__}: the connection failed or reset") from None


def _raise_for(answer: Any, url: str, node: str) -> None:
    status = answer.status_code
    if status < 400:
        return
    try:
        remote = answer.json()["RemoteException"]
        why = f"{remote.get('exception')}: {remote.get('message')}"
    except (ValueError, KeyError, TypeError):
        why = answer.reason or ""
    if status == 404 or "FileNotFoundException" in why:
        raise FileNotFoundError(url)
    if status in (401, 403):
        raise PermissionError(f"{url}: the {node} refused the read (HTTP {status}): {why}")
    raise OSError(f"the {node} answered HTTP {status}: {why}"[:300])
