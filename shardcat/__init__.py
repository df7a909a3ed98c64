"""shardcat: one SQLite catalog for every record of a sharded training dataset."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

from shardcat.catalog import Catalog, DatasetInfo, QueryResult
from shardcat.errors import (
    CatalogError,
    CorruptRecordError,
    DuplicateKeyError,
    IngestError,
    KeyNotFoundError,
    SchemaVersionError,
    ShardcatError,
    StaleShardError,
)
from shardcat.readers.reader import Reader, TFRecordRandomAccess, TFRecordReader
from shardcat.readers.tfrecord import TFRecordWriter, make_example
from shardcat.readers.torch import RecordDataset

try:
    __version__ = _version("shardcat")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+unknown"

__all__ = [
    "Catalog",
    "CatalogError",
    "CorruptRecordError",
    "DatasetInfo",
    "DuplicateKeyError",
    "IngestError",
    "KeyNotFoundError",
    "QueryResult",
    "Reader",
    "RecordDataset",
    "SchemaVersionError",
    "ShardcatError",
    "StaleShardError",
    "TFRecordRandomAccess",
    "TFRecordReader",
    "TFRecordWriter",
    "__version__",
    "make_example",
]
