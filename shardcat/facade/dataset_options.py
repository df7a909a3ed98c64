"""A dataset's options as its format reads them off a shard: two capabilities a
format has by defining their methods (no import of this module needed), looked
up here by the ingest (:mod:`shardcat.facade.catalog`), ``catalog migrate``
(:mod:`shardcat.facade.migrate`) and the remote rule
(:mod:`shardcat.facade.remote_detect`).

- :class:`DetectsOptions`: options read off the first shard (TFRecord's
  message type, RecordIO's IRHeader and ``.idx``, tar's grouping); without it, none.
- :class:`DeclaresFields`: the SQL columns every dataset with given options has,
  NULL where a record has no value (RecordIO's IRHeader fields); without it,
  only the fields the records hold.

Options only all shards tell (RecordIO's colliding ``.idx`` keys) are read through
the sidecar capability (:class:`~shardcat.facade.remote_detect.Sidecars`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from shardcat.formats.base import Format

__all__ = ["DeclaresFields", "DetectsOptions", "detect_options", "field_types"]


@runtime_checkable
class DetectsOptions(Protocol):
    """Dataset options read off a dataset's first shard."""

    def detect_options(self, path: str, sidecar: bool | None = None) -> dict[str, Any]:
        """The options read off the shard at ``path``. ``sidecar``: whether the
        shard has its sidecar (:class:`~shardcat.facade.remote_detect.Sidecars`),
        when that is known already (a remote shard's, asked of its store); None:
        looked for beside ``path``. Options tell whether there is one, never read
        what it holds. A damaged shard gives the defaults (its scan reports it)."""


@runtime_checkable
class DeclaresFields(Protocol):
    """SQL columns that a dataset's options declare."""

    def field_types(self, options: Mapping[str, Any]) -> dict[str, str]:
        """SQL columns (name -> ``integer``/``real``/``text``) every dataset with
        ``options`` has, NULL where a record has no value."""


def detect_options(fmt: Format, path: str, sidecar: bool | None = None) -> dict[str, Any]:
    """The options ``fmt`` reads off the shard at ``path`` ({} without
    :class:`DetectsOptions`)."""
    return fmt.detect_options(path, sidecar) if isinstance(fmt, DetectsOptions) else {}


def field_types(fmt: Format, options: Mapping[str, Any]) -> dict[str, str]:
    """The SQL columns ``options`` declare for ``fmt`` ({} without :class:`DeclaresFields`)."""
    return fmt.field_types(options) if isinstance(fmt, DeclaresFields) else {}
