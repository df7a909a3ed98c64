"""What a feature's value is, for a page: an image (its ``Content-Type``), JSON,
text, a number, a tensor (shape, dtype and a preview) or other bytes; and the
``Content-Type`` its bytes are served with."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from shardcat.facade.records import file_extension

__all__ = ["IMAGE_TYPES", "Shown", "content_type", "image_member", "show"]

#: the image types served as images (never SVG: it may carry script)
IMAGE_TYPES = {"jpg": "image/jpeg", "png": "image/png", "webp": "image/webp", "gif": "image/gif"}
# tar members whose name says image: shown with <img> without being read first
_IMAGE_NAMES = {"jpg", "jpeg", "png", "webp", "gif"}
_OTHER_TYPES = {"json": "application/json", "txt": "text/plain; charset=utf-8"}
PREVIEW_VALUES = 16  # numbers of a tensor shown
PREVIEW_BYTES = 48  # bytes of a binary value shown in hex
TEXT_LIMIT = 64 * 1024  # characters of text or JSON shown on a page


@dataclass(frozen=True)
class Shown:
    """One value as a page shows it: ``kind`` (image, json, text, number, tensor,
    bytes), ``text`` (what is written out, escaped by the template), ``size``
    (bytes of a bytes value), ``shape``/``dtype`` (a tensor's)."""

    kind: str
    text: str = ""
    size: int | None = None
    shape: tuple[int, ...] | None = None
    dtype: str | None = None


def content_type(head: bytes) -> str:
    """The ``Content-Type`` of bytes starting with ``head``: a raster image type,
    JSON, UTF-8 text, else ``application/octet-stream`` (served with ``nosniff``)."""
    ext = file_extension(head)
    return IMAGE_TYPES.get(ext) or _OTHER_TYPES.get(ext) or "application/octet-stream"


def image_member(name: str) -> bool:
    """Whether a tar member's feature name (its extension) says it is an image."""
    return name.rsplit(".", 1)[-1].lower() in _IMAGE_NAMES


def _clip(text: str) -> str:
    return text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT] + "\n…"


def _bytes(data: bytes) -> Shown:
    ext = file_extension(data)
    if ext in IMAGE_TYPES:
        return Shown("image", size=len(data))
    if ext in ("json", "txt"):
        text = data.decode("utf-8")
        if ext == "json":
            try:
                text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
            except ValueError:
                return Shown("text", _clip(text), len(data))
            return Shown("json", _clip(text), len(data))
        return Shown("text", _clip(text), len(data))
    return Shown("bytes", data[:PREVIEW_BYTES].hex(" "), len(data))


def _tensor(value: Any) -> Shown:
    import numpy as np

    array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    flat = array.reshape(-1)[:PREVIEW_VALUES].tolist()
    more = ", …" if array.size > PREVIEW_VALUES else ""
    preview = "[" + ", ".join(_number(v) for v in flat)
    return Shown("tensor", preview + more + "]", shape=tuple(array.shape), dtype=str(array.dtype))


def _number(value: bool | int | float) -> str:
    """A number as text; a float that is exactly a float32 (TFRecord's float lists)
    with the digits of a float32 (``0.3``, not ``0.30000001192092896``)."""
    if isinstance(value, float):
        import numpy as np

        single = np.float32(value)
        return str(single) if float(single) == value else repr(value)
    return str(value)


def show(values: list[Any]) -> list[Shown]:
    """How a page shows a feature's values: bytes and strings one by one, numbers one
    by one when there is one, else as one tensor (a TFRecord float or int list)."""
    if len(values) > 1 and all(isinstance(v, (int, float)) for v in values):
        return [_tensor(values)]
    shown = []
    for value in values:
        if isinstance(value, bytes):
            shown.append(_bytes(value))
        elif isinstance(value, str):
            shown.append(Shown("text", _clip(value)))
        elif isinstance(value, (bool, int, float)):
            shown.append(Shown("number", _number(value)))
        elif hasattr(value, "shape") and hasattr(value, "dtype"):
            shown.append(_tensor(value))
        else:
            shown.append(Shown("text", _clip(repr(value))))
    return shown
