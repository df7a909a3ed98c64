"""The ways a misbehaving HTTP server (or proxy) answers a ranged GET, for
:class:`~shardcat.testing.servers.RangeServer` (its ``lie`` attribute): each
mode turns the object's bytes and the range asked into the answer sent, so a
test can prove that a reader returns the record's exact bytes or an error,
never others. ``SHIFT`` is how far the modes that move bytes move them."""

from __future__ import annotations

import http.server
import os
import socket
from dataclasses import dataclass

__all__ = ["LIES", "SHIFT", "Answer", "answer", "send"]

SHIFT = 7

#: every mode, with what it answers for bytes ``start``..``end - 1`` of the object
LIES = {
    "no-content-range": "206, the object's first bytes (as many as asked), no Content-Range",
    "content-range-later": "206, the bytes asked, a Content-Range naming bytes SHIFT further",
    "content-range-earlier": "206, the bytes asked, a Content-Range naming bytes SHIFT before",
    "content-range-unreadable": "206, the bytes asked, a Content-Range no one can parse",
    "short": "206, the Content-Range asked, SHIFT bytes fewer",
    "long": "206, the Content-Range asked, SHIFT bytes more",
    "shifted": "206, the Content-Range asked, the bytes SHIFT further (headers cannot tell)",
    "total-differs": "206, the bytes asked, a Content-Range naming another object size",
    "wider": "206, a range widened to 512-byte blocks with its true Content-Range (fine)",
    "whole": "200, the whole object (fine: cut to the range)",
    "partial-200": "200, random bytes, as many as asked",
    "garbage-200": "200, random bytes, as many as the object has (headers cannot tell)",
    "status-203": "203, the bytes SHIFT further, as many as asked",
    "416": "416 Range Not Satisfiable",
    "truncated": "206, the Content-Range asked, the connection cut halfway through the body",
}


@dataclass
class Answer:
    """What the server sends: ``status``, ``body``, the ``Content-Range`` header (None:
    not sent) and the ``Content-Length`` it announces (more than ``body`` when the
    connection is cut)."""

    status: int
    body: bytes
    content_range: str | None
    length: int


def _range(first: int, body: bytes, size: int | str) -> str:
    return f"bytes {first}-{first + len(body) - 1}/{size}"


def answer(mode: str, data: bytes, start: int, end: int) -> Answer:
    """The answer of lie ``mode`` (:data:`LIES`) to a GET of bytes ``start:end`` of ``data``."""
    size, asked = len(data), data[start:end]
    if mode == "no-content-range":
        return Answer(206, data[: end - start], None, end - start)
    if mode in ("content-range-later", "content-range-earlier"):
        first = start - SHIFT if mode.endswith("earlier") and start >= SHIFT else start + SHIFT
        return Answer(206, asked, _range(first, asked, size), len(asked))
    if mode == "content-range-unreadable":
        return Answer(206, asked, f"bytes {start}+{len(asked)}", len(asked))
    if mode in ("short", "long"):
        body = data[start : end - SHIFT] if mode == "short" else data[start : end + SHIFT]
        return Answer(206, body, _range(start, asked, size), len(body))
    if mode == "truncated":
        return Answer(206, asked[: len(asked) // 2], _range(start, asked, size), len(asked))
    if mode == "shifted":
        body = data[start + SHIFT : end + SHIFT].ljust(len(asked), b"\0")
        return Answer(206, body, _range(start, asked, size), len(body))
    if mode == "total-differs":
        return Answer(206, asked, _range(start, asked, size + 1), len(asked))
    if mode == "wider":
        first, last = start - start % 512, min(size, end + -end % 512)
        return Answer(206, data[first:last], _range(first, data[first:last], size), last - first)
    if mode == "whole":
        return Answer(200, data, None, size)
    if mode in ("partial-200", "garbage-200"):
        body = os.urandom(len(asked) if mode == "partial-200" else size)
        return Answer(200, body, None, len(body))
    if mode == "status-203":
        body = data[start + SHIFT : end + SHIFT].ljust(len(asked), b"\0")
        return Answer(203, body, None, len(body))
    if mode == "416":
        return Answer(416, b"", f"bytes */{size}", 0)
    raise ValueError(f"no such lie {mode!r}: one of {', '.join(LIES)}")


def send(
    handler: http.server.BaseHTTPRequestHandler,
    told: Answer,
    etag: str | None,
    last_modified: str,
    head_only: bool,
) -> None:
    """Send ``told`` through ``handler`` (with the object's ETag and Last-Modified, as
    the server sends them); a body shorter than its announced length is followed by
    the connection cut."""
    handler.send_response(told.status)
    handler.send_header("Content-Length", str(told.length))
    if etag is not None:
        handler.send_header("ETag", etag)
    handler.send_header("Last-Modified", last_modified)
    if told.content_range is not None:
        handler.send_header("Content-Range", told.content_range)
    handler.end_headers()
    if not head_only:
        handler.wfile.write(told.body)
    if len(told.body) < told.length:
        handler.wfile.flush()
        handler.close_connection = True
        handler.connection.shutdown(socket.SHUT_RDWR)
