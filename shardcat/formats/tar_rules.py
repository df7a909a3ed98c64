"""How tar members make samples, for :mod:`shardcat.formats.tar`: the grouping
rules (a member name -> key and feature; the rules themselves are described in
that module) and the SQL fields members give.

**SQL fields** (``options["fields"]``, default True):

- small text members: the feature's last extension is one of
  ``TEXT_EXTENSIONS`` or ``INT_EXTENSIONS``, the member is at most
  ``MAX_TEXT_FIELD`` (256) bytes of UTF-8; the value is the text stripped of
  surrounding whitespace. For ``INT_EXTENSIONS`` (``cls``, ``cls2``,
  ``class``, ``count``, ``index``, ``inx``, ``id`` — the extensions
  WebDataset decodes as integers) a decimal integer is stored as an integer
  (beyond 64 bits: as its text, and the scan warns once per shard).
  The column is named after the feature (``cls``, ``seg.cls`` -> ``seg_cls``).
- ``.json`` members of at most ``MAX_JSON_MEMBER`` (4 MiB) holding an
  object: each top-level scalar becomes ``<feature>_<key>`` (``json_width``),
  and each scalar inside a top-level object ``<feature>_<key>_<subkey>``
  (``json_image_width`` for SA-1B's ``{"image": {"width": ...}}``); deeper
  values and lists are not fields. Booleans are stored as 0/1, integers beyond
  64 bits as their text (as above), strings only up to 256 bytes, null and
  non-finite numbers not at all; at most ``MAX_JSON_FIELDS`` (64) fields per
  member. Characters other than
  letters, digits and ``_`` in names become ``_``. Two values of one member
  that make one name (``{"image": {"width": 5}}`` and ``"image_width": 99``
  are both ``json_image_width``; ``"a-b"`` and ``"a_b"`` both ``json_a_b``):
  the first in the member is the field, and the shard's scan warns
  (:class:`~shardcat.errors.ShardcatWarning`, once per name and shard).
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from shardcat.errors import CatalogError, ShardcatWarning
from shardcat.formats.base import Scalar

__all__ = [
    "DEFAULT_GROUPING",
    "GROUPINGS",
    "INT_EXTENSIONS",
    "MAX_JSON_FIELDS",
    "MAX_JSON_MEMBER",
    "MAX_TEXT_FIELD",
    "TEXT_EXTENSIONS",
    "FieldNotes",
    "check_grouping",
    "grouping_of",
    "member_fields",
    "split_key",
    "wants_data",
]

GROUPINGS = ("webdataset", "tfd")
DEFAULT_GROUPING = "webdataset"
_WDS_SPLIT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$", re.DOTALL)
MAX_TEXT_FIELD = 256
MAX_JSON_MEMBER = 4 << 20
MAX_JSON_FIELDS = 64
INT_EXTENSIONS = frozenset({"cls", "cls2", "class", "count", "index", "inx", "id"})
TEXT_EXTENSIONS = frozenset({"txt", "text", "label", "caption", "transcript"})
_NOT_WORD = re.compile(r"[^0-9A-Za-z_]")
_INT_TEXT = re.compile(r"^[+-]?\d+$")


# -- grouping ------------------------------------------------------------------


def split_key(name: str, grouping: str) -> tuple[str, str] | None:
    """``(key, feature)`` of a member name under a grouping rule; None when the
    member belongs to no sample (no extension)."""
    if grouping == "webdataset":
        match = _WDS_SPLIT.match(name)
        return None if match is None else (match.group(1), match.group(2))
    if grouping == "tfd":
        p = PurePosixPath(name)
        ext = p.suffix.lstrip(".")
        if not ext:
            return None
        return p.with_suffix("").as_posix(), ext
    raise _unknown_grouping(grouping)


def _unknown_grouping(grouping: object) -> CatalogError:
    return CatalogError(f"unknown tar grouping {grouping!r}; use one of {', '.join(GROUPINGS)}")


def check_grouping(grouping: str) -> str:
    """``grouping`` itself when it is one of :data:`GROUPINGS`; else a :class:`CatalogError`."""
    if grouping not in GROUPINGS:
        raise _unknown_grouping(grouping)
    return grouping


def grouping_of(options: Mapping[str, Any]) -> str:
    """The grouping rule of a dataset's options (default ``webdataset``)."""
    return check_grouping(str(options.get("grouping") or DEFAULT_GROUPING))


# -- fields --------------------------------------------------------------------


def _field_name(*parts: str) -> str:
    return "_".join(_NOT_WORD.sub("_", p) for p in parts)


def wants_data(feature: str, size: int) -> bool:
    """Whether a member of ``feature`` with ``size`` bytes may give SQL fields (its
    bytes are then read during the scan)."""
    ext = feature.rsplit(".", 1)[-1].lower()
    if ext in TEXT_EXTENSIONS or ext in INT_EXTENSIONS:
        return size <= MAX_TEXT_FIELD
    return ext == "json" and size <= MAX_JSON_MEMBER


def _json_scalar(value: Any) -> Scalar | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return _integer(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value if len(value.encode("utf-8", "surrogatepass")) <= MAX_TEXT_FIELD else None
    return None


def _integer(value: int) -> int | str:
    """An integer as it is stored: itself within 64 bits, else its decimal text
    (SQLite and PostgreSQL integers hold no more)."""
    return value if -(2**63) <= value < 2**63 else str(value)


class FieldNotes:
    """What a shard's scan notes about its fields as it meets them, for one warning
    each at its end (see the module docstring): ``clashes``, the field names two
    values of one ``.json`` member made (name -> the JSON names of the value kept
    and of the first one not), and ``beyond``, the integers beyond 64 bits kept as
    text (field, text)."""

    def __init__(self) -> None:
        self.clashes: dict[str, tuple[str, str]] = {}
        self.beyond: list[tuple[str, str]] = []

    def warn(self, path: str) -> None:
        """One :class:`ShardcatWarning` per clashing name and one for the integers
        beyond 64 bits, naming the shard at ``path``."""
        for name, (kept, other) in self.clashes.items():
            warnings.warn(
                f"{path}: .json values {kept!r} and {other!r} both make the field {name}: "
                "each member keeps its first (the other is not a field)",
                ShardcatWarning,
                stacklevel=2,
            )
        if self.beyond:
            names = ", ".join(sorted({name for name, _ in self.beyond}))
            n, (name, text) = len(self.beyond), self.beyond[0]
            warnings.warn(
                f"{path}: {n} value{'s' if n > 1 else ''} beyond 64-bit integers kept as "
                f"text (fields {names}; e.g. {name} = {text}); a field that already holds "
                "integers in the catalog stores them as rounded REALs",
                ShardcatWarning,
                stacklevel=2,
            )


def member_fields(feature: str, data: bytes, notes: FieldNotes | None = None) -> dict[str, Scalar]:
    """The SQL fields one member contributes (see the module docstring); two values
    of a ``.json`` member that make one name, and integers beyond 64 bits (kept as
    text), are noted in ``notes``."""
    ext = feature.rsplit(".", 1)[-1].lower()
    out: dict[str, Scalar] = {}
    if ext == "json":
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):
            return out
        if not isinstance(doc, dict):
            return out
        given: dict[str, str] = {}  # field name -> the JSON name of its value
        for key, value in doc.items():
            items = value.items() if isinstance(value, dict) else [(None, value)]
            for sub, inner in items:
                scalar = _json_scalar(inner)
                if scalar is None:
                    continue
                name = _field_name(feature, key) if sub is None else _field_name(feature, key, sub)
                source = str(key) if sub is None else f"{key}.{sub}"
                if name in out:
                    if notes is not None:
                        notes.clashes.setdefault(name, (given[name], source))
                    continue
                if isinstance(scalar, str) and type(inner) is int and notes is not None:
                    notes.beyond.append((name, scalar))
                out[name], given[name] = scalar, source
                if len(out) >= MAX_JSON_FIELDS:
                    return out
        return out
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        return out
    name = _field_name(feature)
    if ext not in INT_EXTENSIONS or not _INT_TEXT.match(text):
        out[name] = text
        return out
    out[name] = value = _integer(int(text))
    if isinstance(value, str) and notes is not None:
        notes.beyond.append((name, value))
    return out
