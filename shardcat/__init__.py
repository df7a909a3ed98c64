"""shardcat: one SQLite catalog for every record of a sharded training dataset."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

from shardcat.catalog import DatasetInfo, QueryResult
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
from shardcat.facade.catalog import Catalog
from shardcat.facade.dropin import (
    RecordIOReader,
    TarRandomAccess,
    TarReader,
    TFRecordRandomAccess,
    TFRecordReader,
)
from shardcat.facade.options import IngestOptions
from shardcat.readers.formats import Format, Location, register_format
from shardcat.readers.reader import Reader
from shardcat.readers.sampler import RecordSampler
from shardcat.readers.tfrecord import TFRecordWriter, make_example
from shardcat.readers.torch import RecordDataset

try:
    __version__ = _version("shardcat")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+unknown"

if TYPE_CHECKING:
    from shardcat.storage import TensorBlob, TensorDB


def __getattr__(name: str) -> Any:
    # TensorBlob/TensorDB need torch: imported on first use, so the core never imports it
    # (without torch they import, and raise ImportError with the install hint when used)
    if name in ("TensorBlob", "TensorDB"):
        from shardcat import storage

        return getattr(storage, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
