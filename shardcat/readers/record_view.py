"""What a reader asks of a format beyond its core (:class:`~shardcat.formats.base.Format`):
two capabilities a format has by defining their methods (no import of this module
needed), looked up here when a reader needs them.

- :class:`FeatureView`: a decoded record's whole feature view, ``features``
  (name -> all its values) and ``describe`` (name -> type name), behind
  ``Reader.features``, ``to_dict`` and ``describe`` (``catalog info``); a
  format without it shows no features there (``get_feature`` still works: it
  asks the core's ``feature_list``).
- :class:`ChunkedRead`: a payload read in pieces as they are read
  (``read_chunks``, for tar members too large to hold twice: ``catalog get``);
  without it, one ``read``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, TypeGuard, runtime_checkable

from shardcat.formats.base import Format, Location
from shardcat.sources.rawio import Source

__all__ = ["ChunkedRead", "FeatureView", "describe", "features", "read_chunks"]


@runtime_checkable
class FeatureView(Protocol):
    """A decoded record's features, all at once."""

    def features(self, record: Any) -> dict[str, list[Any]]:
        """Feature name -> all its values."""

    def describe(self, record: Any) -> dict[str, str]:
        """Feature name -> type name (``int64``, ``bytes``, ``float32[3]``...)."""


@runtime_checkable
class ChunkedRead(Protocol):
    """A payload read in pieces."""

    def read_chunks(
        self, source: Source, location: Location, verify: bool = False
    ) -> Iterator[bytes]:
        """``read(source, location, verify)`` in pieces as they are read (the checks
        of ``verify`` first), joining to what ``read`` returns."""


# format class -> whether it has a FeatureView: asked once per class, not per record
# (a protocol's isinstance costs more than a feature view of a small record)
_VIEWS: dict[type, bool] = {}


def _has_view(fmt: Format) -> TypeGuard[FeatureView]:
    found = _VIEWS.get(type(fmt))
    if found is None:
        found = _VIEWS[type(fmt)] = isinstance(fmt, FeatureView)
    return found


def features(fmt: Format, record: Any) -> dict[str, list[Any]]:
    """``{feature: [values]}`` of a record of ``fmt`` ({} without a :class:`FeatureView`)."""
    return fmt.features(record) if _has_view(fmt) else {}


def describe(fmt: Format, record: Any) -> dict[str, str]:
    """Feature name -> type of a record of ``fmt`` ({} without a :class:`FeatureView`)."""
    return fmt.describe(record) if _has_view(fmt) else {}


def read_chunks(fmt: Format, source: Source, location: Location, verify: bool) -> Iterator[bytes]:
    """The payload at ``location`` in pieces (:class:`ChunkedRead`), else in one."""
    if isinstance(fmt, ChunkedRead):
        return fmt.read_chunks(source, location, verify)
    return iter((fmt.read(source, location, verify),))
