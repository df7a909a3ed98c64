"""MXNet's image-record header (``mx.recordio.IRHeader``, ``struct "IfQQ"``:
flag, label, id, id2; a float32 label array after it when flag > 0): packing and
unpacking as ``mx.recordio.pack``/``unpack`` do, :class:`IRRecord` (a payload
that starts with one), and the SQL fields a header gives."""

from __future__ import annotations

import json
import math
import numbers
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from shardcat.formats.base import Scalar, float32_shortest

__all__ = [
    "HEADER_TYPES",
    "IR_SIZE",
    "IRHeader",
    "IRRecord",
    "header_fields",
    "pack",
    "parse_header",
    "unpack",
]

IR_SIZE = 24
_IR = struct.Struct("<IfQQ")
_INT64_MAX = (1 << 63) - 1
#: the SQL columns of a header dataset (see ``RecordIOFormat.field_types``)
HEADER_TYPES = {
    "flag": "integer",
    "label": "real",
    "labels": "text",
    "id": "integer",
    "id2": "integer",
}


class IRHeader(NamedTuple):
    """MXNet's image-record header (``mx.recordio.IRHeader``).

    ``label`` is a float, or a float32 array when ``flag`` > 0.
    """

    flag: int
    label: Any
    id: int
    id2: int


def pack(header: Sequence[Any], s: bytes | bytearray | memoryview) -> bytes:
    """``header`` + ``s`` as one payload, like ``mx.recordio.pack``.

    A number label is stored in the header (flag 0); a list or array label
    becomes a float32 array after the header (flag = its size, label field 0).
    """
    head = IRHeader(*header)
    extra = b""
    if isinstance(head.label, numbers.Number):
        head = head._replace(flag=0)
    else:
        label = np.asarray(head.label, dtype=np.float32)
        head = head._replace(flag=label.size, label=0)
        extra = label.tobytes()
    return _IR.pack(*head) + extra + bytes(s)


def unpack(s: bytes | bytearray | memoryview) -> tuple[IRHeader, bytes]:
    """``(IRHeader, data)`` of a payload, like ``mx.recordio.unpack``.

    With flag > 0 the header's label is the float32 array that follows it.
    Raises ``ValueError`` when the payload is too short for its header.
    """
    s = bytes(s)
    if len(s) < IR_SIZE:
        raise ValueError(f"payload of {len(s)} bytes cannot hold a {IR_SIZE}-byte IRHeader")
    flag, label, id_, id2 = _IR.unpack_from(s, 0)
    if flag == 0:
        return IRHeader(flag, label, id_, id2), s[IR_SIZE:]
    end = IR_SIZE + 4 * flag
    if len(s) < end:
        raise ValueError(f"IRHeader flag {flag} needs {end} bytes, the payload has {len(s)}")
    labels = np.frombuffer(s, np.float32, flag, IR_SIZE).copy()
    return IRHeader(flag, labels, id_, id2), s[end:]


class IRRecord(bytes):
    """A payload that starts with an :class:`IRHeader`.

    It *is* the payload (``bytes``, equal to what MXNet's ``read_idx``
    returns); ``header`` and ``data`` unpack it on access.
    """

    __slots__ = ()

    @property
    def header(self) -> IRHeader:
        return unpack(self)[0]

    @property
    def data(self) -> bytes:
        return unpack(self)[1]


def parse_header(buf: Any, offset: int, length: int) -> tuple[int, Any, int, int, int] | None:
    """(flag, label or tuple of labels, id, id2, data start) of a header, or None
    when the ``length`` bytes at ``offset`` cannot hold it."""
    if length < IR_SIZE:
        return None
    flag, label, id_, id2 = _IR.unpack_from(buf, offset)
    if flag == 0:
        return flag, label, id_, id2, IR_SIZE
    end = IR_SIZE + 4 * flag
    if end > length:
        return None
    return flag, struct.unpack_from(f"<{flag}f", buf, offset + IR_SIZE), id_, id2, end


def header_fields(buf: Any, offset: int, length: int) -> dict[str, Scalar]:
    parsed = parse_header(buf, offset, length)
    if parsed is None:
        return {}
    flag, label, id_, id2, _ = parsed
    out: dict[str, Scalar] = {"flag": flag}
    if flag == 0:
        if not math.isnan(label):  # SQLite stores NaN as NULL anyway
            out["label"] = float32_shortest(label)
    else:
        out["labels"] = json.dumps([float32_shortest(v) for v in label])
    if id_ <= _INT64_MAX:
        out["id"] = id_
    if id2 <= _INT64_MAX:
        out["id2"] = id2
    return out
