"""The contract suite's records, knobs and helpers (:class:`ContractBase`), shared by
the core contract (:mod:`shardcat.testing.formats`) and the capability contracts
(:mod:`shardcat.testing.capabilities`)."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import lzma
import os
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, NoReturn

import pytest

from shardcat.formats.base import Entry, Format, Location
from shardcat.formats.checks import crc32c
from shardcat.formats.registry import get_format
from shardcat.testing.required import need

__all__ = [
    "BIG_RECORDS",
    "COMPRESSORS",
    "RECORDS",
    "ContractBase",
    "Records",
    "digest",
    "sql_value",
]

Records = list[tuple[str, dict[str, bytes]]]

#: the records of the contract's shards: 12 small ones, three labels
RECORDS: Records = [
    (f"sample_{i:03d}", {"image": bytes([i]) * (10 + i), "label": str(i % 3).encode()})
    for i in range(12)
]

#: records of a shard whose middle is outside the first and last 64 KiB (what a
#: file's fingerprint covers): damage there is for checksums to find
BIG_RECORDS: Records = [
    (f"big_{i:03d}", {"image": random.Random(i).randbytes(20_000), "label": str(i % 3).encode()})
    for i in range(12)
]

#: whole-file compressions: name -> (file ending, compress, module reading it back)
COMPRESSORS: dict[str, tuple[str, Callable[[bytes], bytes], str]] = {
    "gzip": (".gz", gzip.compress, "indexed_gzip"),
    "bz2": (".bz2", bz2.compress, "indexed_bzip2"),
    "xz": (".xz", lzma.compress, "xz"),
}


def sql_value(value: object) -> object:
    """Short UTF-8 bytes are text in SQL."""
    return value.decode() if isinstance(value, bytes) else value


def digest(raw: Any) -> str:
    """A fingerprint of a raw record: its bytes, or its members' (PARTS formats)."""
    h = hashlib.sha256()
    if isinstance(raw, Mapping):
        for name in sorted(raw):
            h.update(name.encode() + b"\0" + bytes(raw[name]) + b"\0")
    else:
        h.update(bytes(raw))
    return h.hexdigest()


class ContractBase:
    """The knobs and helpers of the contract (see :mod:`shardcat.testing.formats`)."""

    FORMAT: ClassVar[str]
    SUFFIX: ClassVar[str] = ""
    CHECKSUM: ClassVar[bool] = True
    COMPRESSIONS: ClassVar[tuple[str, ...]] = ()
    SCAN_OPTIONS: ClassVar[Mapping[str, Any]] = {"key": "key"}

    # -- what a subclass provides ---------------------------------------------------

    def write(self, path: Path, records: Records) -> list[int]:
        """Write ``records`` to ``path``; each record's offset as ``scan`` reports it."""
        raise NotImplementedError(f"{type(self).__name__} must define write(path, records)")

    def view(self, features: dict[str, bytes]) -> dict[str, object]:
        """How the format's reader shows a record written with ``features``."""
        return dict(features)

    def truncated_offset(self, offsets: Sequence[int], size: int) -> int:
        """The offset a scan names for a shard of ``size`` bytes cut inside its last
        record, whose records started at ``offsets``."""
        return offsets[-1]

    def legacy_rows(self, entries: list[Entry]) -> list[Any] | None:
        """The rows a legacy index (its kind for this format) holds for a shard whose
        scan gave ``entries``; None: the format imports no legacy index."""
        return None

    # -- helpers ------------------------------------------------------------------

    @property
    def fmt(self) -> Format:
        return get_format(self.FORMAT)

    def shard_path(self, directory: Path, index: int = 0) -> Path:
        return directory / f"shard-{index:03d}{self.SUFFIX}"

    def scan(self, path: Path) -> list[Entry]:
        return list(self.fmt.scan(str(path), self.SCAN_OPTIONS))

    def lacks(self, capability: type) -> NoReturn:
        """Skip a capability's test: the format does not have ``capability``."""
        pytest.skip(f"{self.FORMAT} has no {capability.__name__} capability")

    def read_raw(self, source: Any, entry: Entry) -> Any:
        """A scanned record's raw payload, checksums verified (a PARTS format's
        records are read one member at a time)."""
        fmt = self.fmt
        if not fmt.PARTS:
            return fmt.read(source, entry.location, True)
        return {
            m[0]: fmt.read(source, Location(m[1], m[2], m[3] if len(m) > 3 else None), True)
            for m in entry.members
        }

    def assert_checks(self, entry: Entry, raw: Any) -> None:
        """The checks a scan gives (None: it gives none) are the CRC32C of the bytes
        ``read`` returns: what every read compares (:mod:`shardcat.formats.checks`)."""
        if self.fmt.PARTS:
            for m in entry.members:
                if len(m) > 4 and m[4] is not None:
                    assert m[4] == crc32c(raw[m[0]]), m
        elif entry.check is not None:
            assert entry.check == crc32c(raw), entry

    def assert_record(self, record: Any, features: dict[str, bytes]) -> None:
        for feature, value in self.view(features).items():
            assert self.fmt.feature_list(record, feature) == [value]
        assert self.fmt.feature_list(record, "absent") is None

    def compressed_copy(self, path: Path, compression: str) -> Path:
        ending, compress, module = COMPRESSORS[compression]
        need(module, why="shardcat[compressed]")
        target = path.with_name(path.name + ending)
        target.write_bytes(compress(path.read_bytes()))
        return target

    def damage(self, path: Path, position: int, *, keep_mtime: bool = False) -> None:
        """Flip the byte at ``position`` (with ``keep_mtime``: size and mtime put back,
        so only a checksum can tell)."""
        st = path.stat()
        data = bytearray(path.read_bytes())
        data[position] ^= 0xFF
        path.write_bytes(bytes(data))
        if keep_mtime:
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))

    def cut_inside_last_record(self, path: Path) -> None:
        """Truncate the file in the middle of its last record (a file may end with
        padding or a footer after it)."""
        last = self.scan(path)[-1]
        path.write_bytes(path.read_bytes()[: last.offset + max(1, last.length // 2)])

    @pytest.fixture
    def shard(self, tmp_path: Path) -> tuple[Path, list[int]]:
        path = self.shard_path(tmp_path)
        return path, self.write(path, RECORDS)
