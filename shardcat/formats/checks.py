"""The per-record check: what the catalog stores for each record (and tar member)
and what every read compares the bytes it hands back with.

The catalog's ``crc`` is the CRC32C of the payload XOR the CRC32C of the
record's key (:func:`key_check`; a member mixes its sample's key), or the
payload's alone for datasets keyed by position. A read mixes in the key it
asked for (by position: the row's), so a damaged key index that names another
record's row is a :func:`mismatch`, not that record's bytes. The payload's CRC32C (Castagnoli,
unmasked) is of what a format's ``read`` returns: for TFRecord the frame's own
data CRC, unmasked (the scan reads it off the frame, nothing is computed
twice); for RecordIO records, tar members and the records of compressed shards
the CRC32C of the (decompressed) payload, computed by the scan. :func:`crc32c`
runs in the native extension (``shardcat.formats._scan``, SSE4.2 where the CPU
has it); without a built extension the ``crc32c`` package computes the same
value (the tests hold the two equal). CRC32C and not xxh3: TFRecord's is free,
the ``crc32c`` package is a dependency already, and at record sizes the call
costs more than the hash (see ``benchmarks/hotpath.py``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import crc32c as _crc32c

from shardcat.errors import CorruptRecordError

__all__ = [
    "checked_chunks",
    "crc32c",
    "fallback_crc32c",
    "key_check",
    "keyed_checks",
    "mismatch",
    "native_crc32c",
    "unmask",
]

_MASK_DELTA = 0xA282EAD8

#: the pure fallback: the ``crc32c`` package
fallback_crc32c: Callable[..., int] = _crc32c.crc32c  # (data[, crc to continue])

native_crc32c: Callable[[Any], int] | None
_native_keyed: Callable[[Sequence[int | None], Sequence[str | None]], list[int | None]] | None
try:
    _scan = importlib.import_module("shardcat.formats._scan")
    native_crc32c, _native_keyed = _scan.crc32c, _scan.keyed_checks
except ImportError:  # no compiler at install time
    native_crc32c = _native_keyed = None

#: CRC32C of a buffer (bytes, memoryview, ...): the native one when built
crc32c: Callable[[Any], int] = native_crc32c or fallback_crc32c


def key_check(key: str | None) -> int:
    """What a record's key mixes (XOR) into its stored check: the CRC32C of its
    UTF-8 bytes (surrogateescape); 0 for no key (datasets keyed by position). The
    catalog's commit mixes the same (``catalog.commit.keyed_check``)."""
    return 0 if key is None else crc32c(key.encode("utf-8", "surrogateescape"))


def keyed_checks(checks: Sequence[int | None], keys: Sequence[str | None]) -> list[int | None]:
    """The checks the catalog stores for a shard's records: each payload's check
    mixed with its key's (:func:`key_check`); None where the record has no check
    or no key. One native call per shard where the extension is built."""
    if _native_keyed is not None:
        return _native_keyed(checks, keys)
    return [
        c if c is None or k is None else c ^ key_check(k) for c, k in zip(checks, keys, strict=True)
    ]


def unmask(masked: int) -> int:
    """The CRC32C behind TensorFlow's masked CRC (what a TFRecord frame stores)."""
    rot = (masked - _MASK_DELTA) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


def mismatch(path: str, offset: int, key: Any, want: int, got: int) -> CorruptRecordError:
    """The error for bytes that are not the record the catalog indexed (a damaged
    shard or catalog, a lying server, a swapped index): names shard, offset, key."""
    return CorruptRecordError(
        path,
        offset,
        f"record {key!r}: the bytes read are not the record the catalog indexed "
        f"(CRC32C {got:08x}, the catalog has {want:08x}); run catalog verify, "
        "and re-ingest the shard if its file is right",
    )


def checked_chunks(
    chunks: Iterable[bytes], want: int, path: str, offset: int, key: Any
) -> Iterator[bytes]:
    """``chunks`` of one payload passed on as they come, their CRC32C kept running;
    a :func:`mismatch` after the last one when the whole is not ``want`` (whoever
    wrote the chunks somewhere removes them then: ``catalog get -o`` does)."""
    got = 0
    for chunk in chunks:
        got = _crc32c.crc32c(chunk, got)
        yield chunk
    if got != want:
        raise mismatch(path, offset, key, want, got)
