"""The one error hierarchy of shardcat.

Every error raised on purpose is a :class:`ShardcatError`. Subclasses also
inherit the matching built-in so callers can keep writing ``except KeyError``
or ``except ValueError``.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "CatalogError",
    "CorruptRecordError",
    "DuplicateKeyError",
    "IngestError",
    "KeyNotFoundError",
    "LegacyIndexError",
    "MissingShardError",
    "NetworkFilesystemWarning",
    "NoSuchFeatureError",
    "SamplerError",
    "SamplerStateError",
    "SchemaVersionError",
    "ShardIOError",
    "ShardcatError",
    "ShardcatWarning",
    "StaleShardError",
    "StaleWriterError",
    "StorageBusyError",
    "StorageShapeError",
    "StorageTypeError",
    "StorageValueError",
    "masked",
]

# A URL's password (``scheme://user:password@``), and a query string (of a URL or
# of a bare path, as HTTP clients print the URL they failed on).
_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s/@:'\"]*):[^\s/@'\"]+@")
_QUERY = re.compile(r"(?<=\S)\?[^\s'\")]+")
# A query parameter that carries a secret: presigned S3 (X-Amz-Signature,
# AWSAccessKeyId), GCS (X-Goog-Signature), Azure SAS (sig), WebHDFS (delegation),
# tokens and API keys.
_SECRET = re.compile(
    r"(?i)[?&;][^=&;]*(?:sig|token|credential|secret|password|passwd|key|auth|delegation)"
)


def _query(m: re.Match[str]) -> str:
    query = m.group(0)
    if _SECRET.search(query) is None:
        return query
    return "?..." + query[len(query.rstrip(":,.;")) :]  # the message's punctuation kept


def masked(text: str) -> str:
    """``text`` with the secrets its URLs may carry masked: a password
    (``https://user:***@host/...``) and a query string naming a signature, token,
    key or credential (a presigned URL: ``...shard.tar?...``). A shard URL is
    stored whole (reads need it); every message shows it this way, since
    messages end up in logs."""
    if "?" in text:
        text = _QUERY.sub(_query, text)
    return _PASSWORD.sub(r"\g<head>:***@", text) if "@" in text else text


class _Masked:
    """Messages (the string arguments) pass through :func:`masked`."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*(masked(a) if isinstance(a, str) else a for a in args))


class ShardcatError(_Masked, Exception):
    """Base class of all errors shardcat raises on purpose. Its message shows URLs
    without their secrets (:func:`masked`); attributes such as ``path`` keep them."""


class CatalogError(ShardcatError, ValueError):
    """The catalog cannot do what was asked (unknown dataset, bad option, bad SQL...)."""


class KeyNotFoundError(ShardcatError, KeyError):
    """A key or position that the dataset does not hold."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class NoSuchFeatureError(CatalogError):
    """The record has no feature of that name; ``available`` lists those it has.
    (With the message alone: rebuilt from it, as torch's DataLoader does.)"""

    def __init__(
        self, key: str, feature: str | None = None, available: list[str] | None = None
    ) -> None:
        self.key, self.feature, self.available = key, feature, available
        if feature is None:
            super().__init__(key)
            return
        super().__init__(
            f"record {key!r} has no feature {feature!r} (it has: {', '.join(available or [])})"
        )


class CorruptRecordError(ShardcatError, ValueError):
    """Bytes on disk that do not match the container format.

    Carries the shard ``path`` and the byte ``offset`` of the bad record. (With the
    message alone, as torch's DataLoader rebuilds a worker's error: neither.)
    ``key``: the key of the catalog's record there, where the caller looked it up
    (``verify`` does), else None.
    """

    path: str | None
    offset: int | None
    key: str | None = None

    def __init__(self, path: str, offset: int | None = None, problem: str | None = None) -> None:
        if offset is None and problem is None:
            self.path, self.offset, self.problem = None, None, path
            super().__init__(path)
            return
        self.path, self.offset, self.problem = path, offset, problem or ""
        super().__init__(f"{path}: at byte {offset}: {problem}")


class LegacyIndexError(CorruptRecordError):
    """A legacy index file (tfd-utils pickle, DALI/MXNet/vahidk text index) that
    cannot be read, or that is refused because it is not plain data."""


class DuplicateKeyError(ShardcatError, ValueError):
    """The same key appears twice in one dataset (names both places)."""


class IngestError(ShardcatError, ValueError):
    """Some shards could not be indexed; every other shard was committed.

    ``failures`` lists each failed shard (``path``, ``error``).
    """

    def __init__(self, message: str, failures: list[Any] | None = None) -> None:
        super().__init__(message)
        self.failures = [] if failures is None else failures


class StaleShardError(ShardcatError, RuntimeError):
    """A shard no longer matches what the catalog indexed (it changed on disk, or
    the dataset was re-indexed in a way an open reader cannot follow): re-ingest it,
    or reopen/refresh the reader. ``path`` names the file where there is one."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class MissingShardError(StaleShardError, FileNotFoundError):
    """A shard file the catalog lists does not exist any more."""

    def __init__(self, message: str, path: str | None = None) -> None:
        StaleShardError.__init__(self, message, path)

    def __str__(self) -> str:  # OSError would format (errno, strerror)
        return str(self.args[0]) if self.args else ""


class ShardIOError(ShardcatError, OSError):
    """A shard file could not be opened or read (permissions, I/O error)."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class StaleWriterError(ShardcatError, RuntimeError):
    """Another process committed to a TensorBlob/TensorDB since it was opened for writing."""


class StorageBusyError(ShardcatError, BlockingIOError):
    """A TensorBlob/TensorDB is already open for writing (one writer at a time)."""


class SchemaVersionError(ShardcatError, RuntimeError):
    """The catalog's schema version does not match this library."""


class StorageTypeError(ShardcatError, TypeError):
    """TensorBlob/TensorDB got a value of the wrong type: an index, a tensor of the
    wrong dtype, not a tensor (a ``TypeError``, where tensorblob raises one)."""


class StorageValueError(ShardcatError, ValueError):
    """A value TensorBlob/TensorDB cannot take (e.g. extending with another block size)."""


class StorageShapeError(StorageValueError, RuntimeError):
    """A tensor that does not hold whole rows of the storage's shape.

    A ``ValueError``, and a ``RuntimeError`` as torch's ``view`` raises in tensorblob.
    """


class SamplerError(ShardcatError, ValueError):
    """Bad arguments for a sampler (:class:`shardcat.torch.RecordSampler`)."""


class SamplerStateError(SamplerError):
    """A sampler state that does not belong to this sampler: another dataset length,
    seed or shuffle, so loading it would silently continue a different order."""


class ShardcatWarning(_Masked, UserWarning):
    """Base class of the warnings shardcat gives (the CLI prints them as one line)."""


class NetworkFilesystemWarning(ShardcatWarning):
    """A writable SQLite catalog opened on a network filesystem (NFS, CIFS, FUSE,
    Lustre, ...), where SQLite's locks and WAL shared memory are not reliable."""
