"""Taking records out of a dataset: one feature's value (:func:`feature_value`,
reading one tar member only; :func:`feature_chunks` streams such a member), a
whole record's features saved as files (:func:`extract`), and the file naming
they use (:func:`file_extension`, :func:`safe_name`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardcat.errors import CatalogError, Hint, KeyNotFoundError, NoSuchFeatureError
from shardcat.formats.registry import get_format
from shardcat.readers.reader import Reader

__all__ = [
    "Extracted",
    "extract",
    "feature_chunks",
    "feature_value",
    "features_of",
    "file_extension",
    "safe_name",
]

_MAGIC = [
    (b"\xff\xd8\xff", "jpg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
    (b"II*\x00", "tif"),
    (b"MM\x00*", "tif"),
]


def file_extension(data: bytes) -> str:
    """A file extension for ``data``, from magic numbers (images), else text/JSON/bin."""
    for magic, ext in _MAGIC:
        if data.startswith(magic):
            return ext
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "bin"
    return "json" if text.lstrip()[:1] in ("{", "[") else "txt"


_MAX_NAME_PART = 100  # characters of a key or feature name kept in a file name


def safe_name(text: str) -> str:
    """``text`` as one file name part: letters, digits, ``-``, ``_`` and ``.`` kept,
    every other character (``/``, NUL, controls, spaces...) becomes ``_``, cut
    to ``_MAX_NAME_PART`` characters. It never contains a path separator, so
    ``<key>_<feature>_<i>.<ext>`` stays inside the output directory."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text[:_MAX_NAME_PART])


def features_of(reader: Reader, key: str) -> dict[str, list[Any]]:
    """The record ``key`` as ``{feature: [values]}``; :class:`KeyNotFoundError` when
    the dataset does not hold it."""
    record = reader.get_record(key)
    if record is None:
        raise KeyNotFoundError(f"key {key!r} not in dataset {reader.dataset!r}")
    return reader.features(record)


def _values(reader: Reader, key: str, feature: str) -> list[Any]:
    """The values of one feature; for records made of parts (tar samples keyed by
    name) only that member is read, the whole record only to say what it has."""
    if get_format(reader.format).PARTS and reader.key_rule != "position":
        value = reader.get_feature(key, feature)
        if value is not None:
            return [value]
    features = features_of(reader, key)
    if feature not in features:
        raise NoSuchFeatureError(key, feature, sorted(features))
    return list(features[feature])


def feature_value(reader: Reader, key: str, feature: str, index: int = 0) -> Any:
    """Value ``index`` of ``feature`` of the record ``key`` (bytes, or a number).

    Raises :class:`KeyNotFoundError` for a missing key, :class:`NoSuchFeatureError`
    for a missing feature and :class:`CatalogError` for a feature without values
    or an ``index`` out of range.
    """
    values = _values(reader, key, feature)
    if not values:
        raise CatalogError(f"feature {feature!r} of {key!r} holds no values")
    if not -len(values) <= index < len(values):
        raise CatalogError(
            f"out of range: {feature!r} has {len(values)} values",
            hint=Hint.naming("index", "--index", after=f" {index}", lead=True),
        )
    return values[index]


def feature_chunks(
    reader: Reader, key: str, feature: str, index: int = 0
) -> Iterator[bytes] | None:
    """Value ``index`` of ``feature`` in pieces as they are read, when it is one
    member of a record made of parts (tar samples keyed by name): a member of any
    size is then never held whole. None otherwise, or when the key or member is
    missing: :func:`feature_value` then reads the value (and says what is missing)."""
    if index not in (0, -1):
        return None
    return reader.member_chunks(key, feature)


@dataclass(frozen=True)
class Extracted:
    """One item of an extracted record: bytes value ``index`` of ``feature``
    written to ``path`` (``value`` the bytes), or, without an index or path, a
    feature of non-bytes values (``value`` the list)."""

    feature: str
    index: int | None
    value: Any
    path: Path | None = None


# Text values up to this many bytes are shown too (as the CLI's extract does).
SHOWN_TEXT = 200


def extract(reader: Reader, key: str, output_dir: str | Path) -> list[Extracted]:
    """Save every bytes value of the record ``key`` as a file in ``output_dir``
    (created when missing), named ``<key>_<feature>_<i>.<ext>`` with
    :func:`safe_name` parts and :func:`file_extension` (a tar member such as
    ``cls`` or ``txt`` too); non-bytes features are returned inline. Items in
    feature order."""
    features = features_of(reader, key)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    safe_key = safe_name(key)
    written: set[str] = set()
    items: list[Extracted] = []
    for name, values in sorted(features.items()):
        if not (values and isinstance(values[0], bytes)):
            items.append(Extracted(name, None, values))
            continue
        for i, data in enumerate(values):
            ext = file_extension(data)
            stem = f"{safe_key}_{safe_name(name)}_{i}"
            filename, n = f"{stem}.{ext}", 1
            while filename in written:  # two names that differ only in replaced characters
                n += 1
                filename = f"{stem}~{n}.{ext}"
            written.add(filename)
            path = output_dir / filename
            path.write_bytes(data)
            items.append(Extracted(name, i, data, path))
    return items
