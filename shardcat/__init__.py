"""shardcat: one SQLite catalog for every record of a sharded training dataset."""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from shardcat.errors import (
    CatalogError,
    CorruptRecordError,
    DuplicateKeyError,
    IngestError,
    KeyNotFoundError,
    LegacyIndexError,
    MissingShardError,
    NoSuchFeatureError,
    SamplerError,
    SamplerStateError,
    SchemaVersionError,
    ShardcatError,
    ShardIOError,
    StaleShardError,
    StaleWriterError,
    StorageBusyError,
    StorageShapeError,
    StorageTypeError,
    StorageValueError,
)
from shardcat.moved import install as _install_moved

_install_moved()  # old import paths (shardcat.readers.tfrecord, ...) still work, and warn

if TYPE_CHECKING:
    __version__: str
    from shardcat.catalog import DatasetInfo, QueryResult
    from shardcat.facade.catalog import Catalog
    from shardcat.facade.dropin import (
        RecordIOReader,
        TarRandomAccess,
        TarReader,
        TFRecordRandomAccess,
        TFRecordReader,
    )
    from shardcat.facade.options import IngestOptions
    from shardcat.formats.base import Format, Location
    from shardcat.formats.registry import register_format
    from shardcat.formats.tfrecord import TFRecordWriter, make_example
    from shardcat.readers.reader import Reader
    from shardcat.readers.sampler import RecordSampler
    from shardcat.readers.torch import RecordDataset
    from shardcat.storage import TensorBlob, TensorDB

# The public names and the module each comes from, imported on first use: `import
# shardcat` (and `catalog --help`) stays fast, and the core never imports torch
# (TensorBlob/TensorDB import without it and raise ImportError with the install
# hint when used).
_LAZY = {
    "DatasetInfo": "shardcat.catalog",
    "QueryResult": "shardcat.catalog",
    "Catalog": "shardcat.facade.catalog",
    "RecordIOReader": "shardcat.facade.dropin",
    "TarRandomAccess": "shardcat.facade.dropin",
    "TarReader": "shardcat.facade.dropin",
    "TFRecordRandomAccess": "shardcat.facade.dropin",
    "TFRecordReader": "shardcat.facade.dropin",
    "IngestOptions": "shardcat.facade.options",
    "Format": "shardcat.formats.base",
    "Location": "shardcat.formats.base",
    "register_format": "shardcat.formats.registry",
    "Reader": "shardcat.readers.reader",
    "RecordSampler": "shardcat.readers.sampler",
    "TFRecordWriter": "shardcat.formats.tfrecord",
    "make_example": "shardcat.formats.tfrecord",
    "RecordDataset": "shardcat.readers.torch",
    "TensorBlob": "shardcat.storage",
    "TensorDB": "shardcat.storage",
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shardcat")
    except PackageNotFoundError:  # running from a source tree without installing
        return "0.0.0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":  # importlib.metadata alone takes longer than the rest
        globals()[name] = _version()
        return globals()[name]
    module = _LAZY.get(name)
    if module is None:  # a subpackage used as an attribute (shardcat.catalog.engine)
        if importlib.util.find_spec(f"{__name__}.{name}") is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return importlib.import_module(f"{__name__}.{name}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | {"__version__"})


__all__ = [
    "Catalog",
    "CatalogError",
    "CorruptRecordError",
    "DatasetInfo",
    "DuplicateKeyError",
    "Format",
    "IngestError",
    "IngestOptions",
    "KeyNotFoundError",
    "LegacyIndexError",
    "Location",
    "MissingShardError",
    "NoSuchFeatureError",
    "QueryResult",
    "Reader",
    "RecordDataset",
    "RecordIOReader",
    "RecordSampler",
    "SamplerError",
    "SamplerStateError",
    "SchemaVersionError",
    "ShardIOError",
    "ShardcatError",
    "StaleShardError",
    "StaleWriterError",
    "StorageBusyError",
    "StorageShapeError",
    "StorageTypeError",
    "StorageValueError",
    "TFRecordRandomAccess",
    "TFRecordReader",
    "TFRecordWriter",
    "TarRandomAccess",
    "TarReader",
    "TensorBlob",
    "TensorDB",
    "__version__",
    "make_example",
    "register_format",
]
