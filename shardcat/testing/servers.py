"""Servers on loopback for the remote-storage tests and benchmarks: moto's S3
server (a real HTTP server speaking S3; needs ``moto[server]``, in the ``dev``
extra) and a small HTTP server with Range and ETag support, both counting the
requests and body bytes they serve; gcp-storage-emulator (GCS) and Azurite
(Azure Blob Storage, a Node program) the same way; and a WebHDFS REST server (a
NameNode that redirects reads to a "DataNode" listener) over a directory."""

from __future__ import annotations

import email.utils
import hashlib
import http.server
import json
import logging
import os
import re
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from shardcat.testing import lies


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Counter:
    """Requests by method and body bytes served, since the last :meth:`reset`."""

    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    body_bytes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, method: str, path: str, range_header: str | None, sent: int) -> None:
        with self.lock:
            self.requests.append((method, path, range_header))
            self.body_bytes += sent

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.body_bytes = 0

    def gets(self, under: str = "") -> list[tuple[str, str, str | None]]:
        return [r for r in self.requests if r[0] == "GET" and under in r[1]]


class _Counting:
    """WSGI middleware: counts requests and the body bytes of their answers."""

    def __init__(self, app: Any, counter: Counter) -> None:
        self.app, self.counter = app, counter

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        body = list(self.app(environ, start_response))
        self.counter.note(
            environ["REQUEST_METHOD"],
            environ.get("PATH_INFO", ""),
            environ.get("HTTP_RANGE"),
            sum(len(b) for b in body),
        )
        return body


class S3Server:
    """moto's S3 server on a free loopback port, with a :class:`Counter`."""

    def __init__(self) -> None:
        from moto.moto_server.threaded_moto_server import ThreadedMotoServer
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        self.counter = Counter()
        self.port = free_port()
        counter = self.counter
        port = self.port

        class Quiet(MotoRequestHandler):  # type: ignore[misc]
            def setup(self) -> None:
                threading.current_thread().name = SERVING  # a request's thread
                super().setup()

            def log_message(self, *args: Any) -> None:
                pass

        class Counting(ThreadedMotoServer):
            def _server_entry(self) -> None:
                threading.current_thread().name = SERVING
                app = _Counting(DomainDispatcherApplication(create_backend_app), counter)
                self._server = make_server("127.0.0.1", port, app, True, request_handler=Quiet)
                self._server_ready_event.set()
                self._server.serve_forever()

        self._server = Counting("127.0.0.1", port, verbose=False)
        self.endpoint = f"http://127.0.0.1:{port}"

    def start(self) -> None:
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request
        self._server.start()

    def stop(self) -> None:
        self._server.stop()


class _Handler(http.server.BaseHTTPRequestHandler):
    """What the test servers' handlers share: HTTP/1.1, no log lines, the answer
    sent at once (no Nagle wait), every connection kept in the server's
    ``connections`` (so a test can cut them)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.connections.add(self.connection)  # type: ignore[attr-defined]


#: the name of the test servers' threads: shardcat's own, which forking leaves be
#: (see :func:`shardcat.catalog.processes.fork_hazards`)
SERVING = "shardcat-test-server"


class _Server(http.server.ThreadingHTTPServer):
    def process_request_thread(self, request: Any, client_address: Any) -> None:
        threading.current_thread().name = SERVING
        super().process_request_thread(request, client_address)


def _serve(
    port: int, handler: type[_Handler], connections: set[socket.socket]
) -> tuple[http.server.ThreadingHTTPServer, threading.Thread]:
    """A threaded HTTP server on loopback ``port``, serving in a daemon thread."""
    httpd = _Server(("127.0.0.1", port), handler)
    httpd.daemon_threads = True
    httpd.connections = connections  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, name=SERVING, daemon=True)
    thread.start()
    return httpd, thread


def _stop(
    servers: list[tuple[http.server.ThreadingHTTPServer, threading.Thread]],
    connections: set[socket.socket],
) -> None:
    """Cut the connections kept alive (a killed server), then stop ``servers``."""
    for conn in list(connections):
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    connections.clear()
    for httpd, thread in servers:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
    servers.clear()


class RangeServer:
    """Serves the files of ``root`` over HTTP with ``Range`` (one range), ``ETag``
    (of the file's content; none with ``etags=False``, as some servers do),
    ``If-Match`` and ``If-Unmodified-Since`` (412; ignored with ``conditions=False``,
    as some servers do) and ``Last-Modified``; ``align`` > 0 answers each range
    widened to multiples of it and ``shift`` moved by that many bytes, each with
    its true ``Content-Range`` (as some proxies do);
    ``fail_next`` answers that many requests with 503; ``lie`` (a mode of
    :data:`~shardcat.testing.lies.LIES`) answers every ranged GET the way that
    misbehaving server would; counts what it serves."""

    def __init__(
        self,
        root: str,
        port: int | None = None,
        *,
        etags: bool = True,
        conditions: bool = True,
        align: int = 0,
        shift: int = 0,
    ) -> None:
        self.root = root
        self.etags, self.conditions = etags, conditions
        self.align, self.shift = align, shift
        self.port = port or free_port()
        self.counter = Counter()
        self.fail_next = 0
        self.lie = ""
        self.connections: set[socket.socket] = set()
        self._servers: list[tuple[http.server.ThreadingHTTPServer, threading.Thread]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        server = self

        class Handler(_Handler):
            def _answer(self, head_only: bool) -> None:
                if server.fail_next > 0:
                    server.fail_next -= 1
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    server.counter.note(self.command, self.path, None, 0)
                    self.end_headers()
                    return
                path = os.path.join(server.root, self.path.lstrip("/").split("?")[0])
                if not os.path.isfile(path):
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    server.counter.note(self.command, self.path, None, 0)
                    self.end_headers()
                    return
                with open(path, "rb") as f:
                    data = f.read()
                etag = '"' + hashlib.md5(data).hexdigest() + '"' if server.etags else None
                mtime = int(os.stat(path).st_mtime)
                want = self.headers.get("If-Match")
                since = self.headers.get("If-Unmodified-Since")
                if server.conditions and (
                    (want is not None and want != etag)
                    or (
                        since is not None
                        and mtime > email.utils.parsedate_to_datetime(since).timestamp()
                    )
                ):
                    self.send_response(412)
                    self.send_header("Content-Length", "0")
                    server.counter.note(self.command, self.path, None, 0)
                    self.end_headers()
                    return
                rng = self.headers.get("Range")
                body, status = data, 200
                m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng or "")
                if m is not None and server.lie:
                    end = int(m.group(2)) + 1 if m.group(2) else len(data)
                    told = lies.answer(server.lie, data, int(m.group(1)), end)
                    server.counter.note(self.command, self.path, rng, len(told.body))
                    lies.send(self, told, etag, self.date_time_string(mtime), head_only)
                    return
                if m is not None:
                    start = int(m.group(1))
                    end = int(m.group(2)) + 1 if m.group(2) else len(data)
                    if server.align:
                        start -= start % server.align
                        end += -end % server.align
                    start, end = start + server.shift, end + server.shift
                    end = min(end, len(data))
                    body, status = data[start:end], 206
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                if etag is not None:
                    self.send_header("ETag", etag)
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Last-Modified", self.date_time_string(mtime))
                if status == 206:
                    self.send_header(
                        "Content-Range", f"bytes {start}-{start + len(body) - 1}/{len(data)}"
                    )
                # counted before the answer leaves: a client that has it sees it counted
                server.counter.note(self.command, self.path, rng, 0 if head_only else len(body))
                self.end_headers()
                if not head_only:
                    self.wfile.write(body)

            def do_GET(self) -> None:
                self._answer(False)

            def do_HEAD(self) -> None:
                self._answer(True)

        self._servers.append(_serve(self.port, Handler, self.connections))

    def stop(self) -> None:
        """Stop serving, and drop the connections kept alive (a killed server)."""
        _stop(self._servers, self.connections)


class WebHDFSServer:
    """The WebHDFS REST API (``/webhdfs/v1``) over the files of ``root``, on loopback,
    as a NameNode serves it: GETFILESTATUS and LISTSTATUS answer FileStatus JSON
    (``length``, ``modificationTime``, ``fileId``, ``type``, ``blockSize``...); OPEN
    (``offset``, ``length``) answers 307 with the URL of a "DataNode" (a second
    listener, :attr:`data_port`) that streams those bytes; errors are
    RemoteException JSON (FileNotFoundException: 404). Tests write files into
    ``root`` themselves; a file gets a fileId when first seen and a new one once
    rewritten (another inode or ctime), as a replaced HDFS file is a new file.
    Counts requests (path with query; the DataNode's start ``/datanode``);
    ``fail_next`` answers that many with 503; :meth:`stop` drops the open
    connections (a killed server) and :meth:`start` serves again on the same ports
    with the same fileIds (a NameNode's are persistent)."""

    BLOCK = 128 * 1024 * 1024

    def __init__(self, root: str) -> None:
        self.root = root
        self.port, self.data_port = free_port(), free_port()
        self.counter = Counter()
        self.fail_next = 0
        #: called by the DataNode before it reads (a test replaces the file there)
        self.before_data: Callable[[], None] | None = None
        self.connections: set[socket.socket] = set()
        self._ids: dict[str, tuple[int, int, int]] = {}  # path -> (inode, ctime, fileId)
        self._next_id = 16386  # after the root's, as HDFS counts
        self._ids_lock = threading.Lock()
        self._servers: list[tuple[http.server.ThreadingHTTPServer, threading.Thread]] = []

    @property
    def url(self) -> str:
        """``webhdfs://127.0.0.1:<port>``: the prefix of the served files' URLs."""
        return f"webhdfs://127.0.0.1:{self.port}"

    def ops(self) -> list[str]:
        """The operations served since the counter's reset, in order (``DATANODE``
        for a DataNode's read)."""
        out = []
        for _, path, _ in list(self.counter.requests):
            m = re.search(r"[?&]op=(\w+)", path)
            op = m.group(1) if m else "?"
            out.append("DATANODE" if path.startswith("/datanode") else op)
        return out

    def file_id(self, rel: str, st: os.stat_result) -> int:
        """The fileId of ``rel`` as it is now (a new one once it was rewritten)."""
        with self._ids_lock:
            known = self._ids.get(rel)
            if known is None or known[:2] != (st.st_ino, st.st_ctime_ns):
                known = self._ids[rel] = (st.st_ino, st.st_ctime_ns, self._next_id)
                self._next_id += 1
            return known[2]

    def status(self, rel: str, suffix: str = "") -> dict[str, Any]:
        """The FileStatus JSON of ``rel`` (relative to ``root``); OSError if it is gone."""
        path = os.path.join(self.root, rel)
        st = os.stat(path)
        is_dir = os.path.isdir(path)
        return {
            "accessTime": 0 if is_dir else st.st_atime_ns // 1_000_000,
            "blockSize": 0 if is_dir else self.BLOCK,
            "childrenNum": len(os.listdir(path)) if is_dir else 0,
            "fileId": self.file_id(rel, st),
            "group": "supergroup",
            "length": 0 if is_dir else st.st_size,
            "modificationTime": st.st_mtime_ns // 1_000_000,
            "owner": "shardcat",
            "pathSuffix": suffix,
            "permission": "755" if is_dir else "644",
            "replication": 0 if is_dir else 1,
            "storagePolicy": 0,
            "type": "DIRECTORY" if is_dir else "FILE",
        }

    def start(self) -> None:
        server = self

        class Handler(_Handler):
            def _send(self, status: int, body: bytes, kind: str, **headers: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                for name, value in headers.items():
                    self.send_header(name, value)
                # counted before the answer leaves: a client that has it sees it counted
                sent = len(body) if kind == "application/octet-stream" else 0
                server.counter.note(self.command, self.path, None, sent)
                self.end_headers()
                self.wfile.write(body)

            def _json(self, status: int, value: Any) -> None:
                self._send(status, json.dumps(value).encode(), "application/json")

            def _error(self, status: int, exception: str, message: str) -> None:
                package = "java.io." if exception.endswith("IOException") else "java.lang."
                if exception == "FileNotFoundException":
                    package = "java.io."
                remote = {"exception": exception, "javaClassName": package + exception}
                self._json(status, {"RemoteException": {**remote, "message": message}})

            def do_GET(self) -> None:
                if server.fail_next > 0:
                    server.fail_next -= 1
                    self._send(503, b"", "text/plain")
                    return
                parts = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                datanode = parts.path.startswith("/datanode/")
                prefix = "/datanode/webhdfs/v1" if datanode else "/webhdfs/v1"
                if not parts.path.startswith(prefix):
                    self._error(400, "IllegalArgumentException", f"bad path {parts.path}")
                    return
                tail = parts.path[len(prefix) :]
                rel = unquote(tail).strip("/")
                try:
                    status = server.status(rel)
                except OSError:
                    self._error(404, "FileNotFoundException", f"File does not exist: /{rel}")
                    return
                op = query.get("op", "")
                if op == "GETFILESTATUS":
                    self._json(200, {"FileStatus": status})
                elif op == "LISTSTATUS":
                    found = [status] if status["type"] == "FILE" else []
                    for child in [] if found else sorted(os.listdir(server.root + "/" + rel)):
                        try:
                            found.append(server.status(f"{rel}/{child}".strip("/"), child))
                        except OSError:
                            continue  # removed while listed
                    self._json(200, {"FileStatuses": {"FileStatus": found}})
                elif op == "OPEN" and status["type"] != "FILE":
                    self._error(404, "FileNotFoundException", f"Path is not a file: /{rel}")
                elif op == "OPEN" and not datanode:  # where the blocks are
                    offset, length = int(query.get("offset", 0)), query.get("length")
                    target = f"http://127.0.0.1:{server.data_port}/datanode/webhdfs/v1{tail}"
                    target += f"?op=OPEN&namenoderpcaddress=127.0.0.1:8020&offset={offset}"
                    if length is not None:
                        target += f"&length={int(length)}"
                    self._send(307, b"", "application/octet-stream", Location=target)
                elif op == "OPEN":
                    size, offset = status["length"], int(query.get("offset", 0))
                    if offset > size:
                        self._error(403, "IOException", f"Offset={offset} out of [0, {size})")
                        return
                    if server.before_data is not None:
                        server.before_data()
                        size = os.path.getsize(os.path.join(server.root, rel))
                    end = min(size, offset + int(query.get("length", size)))
                    with open(os.path.join(server.root, rel), "rb") as f:
                        f.seek(offset)
                        data = f.read(max(0, end - offset))
                    self._send(200, data, "application/octet-stream")
                else:
                    self._error(400, "UnsupportedOperationException", f"op={op} is unsupported")

        for port in (self.port, self.data_port):
            self._servers.append(_serve(port, Handler, self.connections))

    def stop(self) -> None:
        """Stop both listeners, and drop the connections kept alive (a killed server)."""
        _stop(self._servers, self.connections)


class GCSServer:
    """gcp-storage-emulator (a GCS JSON API server; in the ``dev`` extra) on a free
    loopback port, in memory, with ``bucket`` created and a :class:`Counter` (the
    request's path keeps its query string). gcsfs reaches it with
    ``endpoint_url=server.endpoint, token="anon"``; set
    ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` before gcsfs is imported, or it
    first asks a gRPC control API the emulator has not for the bucket's type.

    The emulator names no generation in a download's answer; with
    ``name_generation`` set, this server adds the ``x-goog-generation`` header GCS
    sends (of the object it serves), as GCS itself does."""

    def __init__(self, bucket: str) -> None:
        self.name_generation = False
        from functools import partial
        from urllib.parse import unquote

        from gcp_storage_emulator.handlers import buckets
        from gcp_storage_emulator.server import RequestHandler
        from gcp_storage_emulator.storage import Storage

        self.counter = Counter()
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        counter, server = self.counter, self
        storage = Storage(use_memory_fs=True)
        buckets.create_bucket(bucket, storage)

        class Counting(RequestHandler):  # type: ignore[misc]
            sent = 0

            def send_header(self, keyword: str, value: str) -> None:
                if keyword.lower() == "content-length":
                    self.sent = int(value)
                super().send_header(keyword, value)

            def end_headers(self) -> None:
                m = re.match(r"/download/storage/v1/b/([^/]+)/o/([^?]+)", self.path)
                if server.name_generation and m is not None:
                    try:
                        obj = storage.get_file_obj(m.group(1), unquote(m.group(2)))
                    except Exception:  # not found: a 404, no header
                        obj = {}
                    if obj.get("generation"):
                        super().send_header("x-goog-generation", str(obj["generation"]))
                # counted before the answer leaves: a client that has it sees it counted
                body = 0 if self.command == "HEAD" else self.sent
                counter.note(self.command, self.path, self.headers.get("Range"), body)
                super().end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        class Quiet(http.server.HTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that hung up (a cancelled read): nothing to report

        self._httpd = Quiet(("127.0.0.1", self.port), partial(Counting, storage))
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        logging.getLogger("gcp_storage_emulator").setLevel(logging.ERROR)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=SERVING, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join()


#: Azurite's well-known development account (public, documented by Microsoft)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def azurite_binary() -> str | None:
    """``azurite-blob`` as ``make`` installs it (``.node/`` of the repository), or
    ``$SHARDCAT_AZURITE``; None when neither exists."""
    given = os.environ.get("SHARDCAT_AZURITE")
    if given:
        return given if os.path.exists(given) else None
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(root, ".node", "node_modules", ".bin", "azurite-blob")
    return path if os.path.exists(path) else None


class AzuriteServer:
    """Azurite's blob service (Node) on a free loopback port, in memory, its
    requests counted from its debug log (method, path with query, ``x-ms-range``;
    body bytes are not counted). adlfs reaches it with ``connection_string=``."""

    def __init__(self, binary: str, workdir: str) -> None:
        self.binary, self.workdir = binary, workdir
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT}"
        self.connection_string = (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint={self.endpoint};"
        )
        self._log = os.path.join(workdir, "azurite-debug.log")
        self._seen = 0
        self._process: Any = None

    def start(self) -> None:
        import subprocess
        import time

        args = [self.binary, "--blobHost", "127.0.0.1", "--blobPort", str(self.port)]
        args += ["--inMemoryPersistence", "--silent", "--skipApiVersionCheck", "--loose"]
        args += ["--debug", self._log]
        out = open(os.path.join(self.workdir, "azurite.out"), "wb")  # noqa: SIM115
        self._process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        for _ in range(300):
            if self._process.poll() is not None:
                with open(out.name, "rb") as f:
                    raise RuntimeError(f"azurite exited: {f.read().decode(errors='replace')}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("azurite did not listen within 30 s")

    def requests(self) -> list[tuple[str, str, str | None]]:
        """The requests logged since the last :meth:`reset`, once the log is settled."""
        import json
        import time

        text, last = "", -1
        while len(text) != last:  # the log is written asynchronously: let it settle
            last = len(text)
            time.sleep(0.1)
            with open(self._log, encoding="utf-8", errors="replace") as f:
                f.seek(self._seen)
                text = f.read()
        out = []
        pattern = r"RequestMethod=(\w+) RequestURL=http://[^/]+(\S*) RequestHeaders:(\{[^}]*\})"
        for m in re.finditer(pattern, text):
            try:
                rng = json.loads(m.group(3)).get("x-ms-range")
            except ValueError:
                rng = None
            out.append((m.group(1), m.group(2), rng))
        return out

    def reset(self) -> None:
        self.requests()
        self._seen = os.path.getsize(self._log)

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()  # it waits for its clients' idle connections...
            try:
                self._process.wait(timeout=5)
            except Exception:
                self._process.kill()  # ...which a test's filesystems keep open
                self._process.wait(timeout=30)
            self._process = None
