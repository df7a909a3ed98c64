"""The readers: the :class:`~shardcat.readers.reader.Reader` that combines the
store's lookups with a format (:mod:`shardcat.formats`) and a byte source
(:mod:`shardcat.sources`), its ``reader.index``, its verification, the
``RecordSampler`` and the torch ``RecordDataset``."""

from __future__ import annotations

from typing import Any

_MOVED_NAMES = {
    "Entry",
    "Format",
    "Location",
    "detect_format",
    "get_format",
    "known_formats",
    "register_format",
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import warnings

    from shardcat import formats

    warnings.warn(
        f"shardcat.readers.{name} moved to shardcat.formats.{name} in shardcat 0.2.0",
        DeprecationWarning,
        stacklevel=2,
    )
    globals()[name] = getattr(formats, name)
    return globals()[name]
