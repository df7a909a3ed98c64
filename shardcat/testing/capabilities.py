"""The contract of each capability a format may have beyond its core: the tests a
format gets for each capability protocol it meets (by defining its methods), in
:class:`~shardcat.testing.formats.FormatContract`; a format without the
capability skips them, saying which one it lacks.

- feature view (``features``, ``describe``) and pieces (``read_chunks``):
  :mod:`shardcat.readers.record_view`;
- dataset options (``detect_options``) and declared SQL columns (``field_types``):
  :mod:`shardcat.facade.dataset_options`;
- remote head (``head_needed``) and sidecars (``sidecar``, ``dataset_sidecars``,
  ``detect_dataset_options``): :mod:`shardcat.facade.remote_detect`;
- DALI index (``index_lines``): :mod:`shardcat.facade.export`;
- legacy import (``check_entries``): :mod:`shardcat.migrations.legacy.verify`
  (with the knob :meth:`~shardcat.testing.contract_base.ContractBase.legacy_rows`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardcat import Catalog, CorruptRecordError
from shardcat.facade.dataset_options import DeclaresFields, DetectsOptions
from shardcat.facade.export import DaliIndex, export_index
from shardcat.facade.remote_detect import SNIFF_HEAD, RemoteHead, Sidecars
from shardcat.formats.base import Entry, LegacyRows, Location, Mismatch
from shardcat.formats.registry import SNIFF_BYTES, detect_format
from shardcat.migrations.legacy.verify import LegacyImport
from shardcat.readers.record_view import ChunkedRead, FeatureView
from shardcat.sources.local import FileSource
from shardcat.testing.contract_base import RECORDS, ContractBase

__all__ = ["CapabilityContract"]

Shard = tuple[Path, list[int]]


@contextlib.contextmanager
def file_source(path: Path) -> Iterator[FileSource]:
    fd = os.open(path, os.O_RDONLY)
    try:
        yield FileSource(fd, str(path))
    finally:
        os.close(fd)


def locations(entry: Entry, parts: bool) -> list[Location]:
    """Where a scanned record's payloads are: the record's, or each member's."""
    if not parts:
        return [entry.location]
    return [Location(m[1], m[2], m[3] if len(m) > 3 else None) for m in entry.members]


class CapabilityContract(ContractBase):
    """The capability tests (see the module docstring)."""

    # -- a record's feature view, a payload in pieces -----------------------------------

    def test_feature_view(self, shard: Shard) -> None:
        """``features`` gives every value ``feature_list`` gives; ``describe`` names a
        type for each feature."""
        fmt = self.fmt
        if not isinstance(fmt, FeatureView):
            self.lacks(FeatureView)
        path, _ = shard
        with file_source(path) as source:
            for entry, (_, features) in zip(self.scan(path), RECORDS, strict=True):
                record = fmt.decode(self.read_raw(source, entry), {})
                view = fmt.features(record)
                for feature, value in self.view(features).items():
                    assert view[feature] == [value]
                for feature, values in view.items():
                    assert list(fmt.feature_list(record, feature) or []) == values
                types = fmt.describe(record)
                assert set(types) >= set(view)
                assert all(isinstance(t, str) and t for t in types.values())

    def test_read_in_chunks(self, shard: Shard) -> None:
        """The pieces of ``read_chunks`` join to what ``read`` returns."""
        fmt = self.fmt
        if not isinstance(fmt, ChunkedRead):
            self.lacks(ChunkedRead)
        path, _ = shard
        with file_source(path) as source:
            for entry in self.scan(path):
                for at in locations(entry, fmt.PARTS):
                    whole = fmt.read(source, at, True)
                    assert b"".join(fmt.read_chunks(source, at, True)) == whole

    # -- dataset options ----------------------------------------------------------------

    def test_detect_options(self, shard: Shard, tmp_path: Path) -> None:
        """Options read off a shard are a dict with a key rule; a damaged or empty
        shard gives the same option names (its scan reports the damage), never an error."""
        fmt = self.fmt
        if not isinstance(fmt, DetectsOptions):
            self.lacks(DetectsOptions)
        path, offsets = shard
        options = fmt.detect_options(str(path))
        assert isinstance(fmt.key_rule({**options, **self.SCAN_OPTIONS}), str)
        damaged = tmp_path / f"damaged{self.SUFFIX}"
        damaged.write_bytes(path.read_bytes())
        self.damage(damaged, offsets[0])
        assert set(fmt.detect_options(str(damaged))) == set(options)
        empty = tmp_path / f"empty{self.SUFFIX}"
        empty.write_bytes(b"")
        assert set(fmt.detect_options(str(empty))) == set(options)

    def test_declared_fields(self, shard: Shard, tmp_path: Path) -> None:
        """Every declared column is in the dataset's view, of an SQL type; a dataset
        ingested without fields declares none."""
        fmt = self.fmt
        if not isinstance(fmt, DeclaresFields):
            self.lacks(DeclaresFields)
        path, _ = shard
        with (
            Catalog(tmp_path / "cat.sqlite") as cat,
            cat.ingest(path, "ds", format=self.FORMAT) as reader,
        ):
            types = fmt.field_types(reader.options)
            assert set(types.values()) <= {"integer", "real", "text"}
            rows = cat.query(f"SELECT {', '.join(['key', *types])} FROM ds")
            assert len(rows) == len(RECORDS)
            assert fmt.field_types({**reader.options, "fields": False}) == {}

    # -- remote shards ------------------------------------------------------------------

    def test_head_needed(self, shard: Shard, tmp_path: Path) -> None:
        """The first ``head_needed`` bytes (told from the first bytes of the shard)
        tell the format and the same options as the whole shard."""
        fmt = self.fmt
        if not isinstance(fmt, RemoteHead):
            self.lacks(RemoteHead)
        path, _ = shard
        data = path.read_bytes()
        head = tmp_path / "head"
        head.write_bytes(data[:SNIFF_BYTES])
        need = fmt.head_needed(str(head))
        if need is None:
            return  # cannot tell: a remote ingest reads a larger head
        assert need >= 0
        copy = tmp_path / f"copy{self.SUFFIX}"
        copy.write_bytes(data[: need or SNIFF_HEAD])
        assert detect_format(str(copy)) == self.FORMAT
        if isinstance(fmt, DetectsOptions):
            assert fmt.detect_options(str(copy), False) == fmt.detect_options(str(path), False)

    def test_sidecars(self, shard: Shard) -> None:
        """A sidecar lies beside its shard; a dataset's options keep the first
        shard's, also when read from copies of the sidecars (remote shards)."""
        fmt = self.fmt
        if not isinstance(fmt, Sidecars):
            self.lacks(Sidecars)
        path, _ = shard
        near = fmt.sidecar(str(path))
        assert near is None or (Path(near).parent == path.parent and near != str(path))
        first = fmt.detect_options(str(path)) if isinstance(fmt, DetectsOptions) else {}
        options = fmt.detect_dataset_options([str(path)], {})
        assert options.items() >= first.items()
        if fmt.dataset_sidecars(first, {}):
            copies = {near: near} if near is not None and os.path.isfile(near) else {}
            again = fmt.detect_dataset_options([str(path)], {}, first=first, sidecars=copies)
            assert again == options

    # -- DALI index -----------------------------------------------------------------------

    def test_dali_index(self, shard: Shard, tmp_path: Path) -> None:
        """One line per shard's record (without newlines) naming where its payload
        starts; ``export_index`` writes the same lines from the catalog."""
        fmt = self.fmt
        if not isinstance(fmt, DaliIndex):
            self.lacks(DaliIndex)
        path, offsets = shard
        entries = self.scan(path)
        lines = list(fmt.index_lines(entries, self.SCAN_OPTIONS))
        assert lines and not any("\n" in line for line in lines)
        tokens = {token for line in lines for token in line.split()}
        starts = [m[1] for e in entries for m in e.members] if fmt.PARTS else offsets
        assert {str(start) for start in starts} <= tokens
        with Catalog(tmp_path / "cat.sqlite") as cat:
            cat.ingest(path, "ds", format=self.FORMAT).close()
            (written,) = export_index(cat, "ds", tmp_path / "dali")
            options = cat.info("ds").options
        assert written.read_text().splitlines() == list(fmt.index_lines(entries, options))

    # -- legacy import --------------------------------------------------------------------

    def _legacy(self, entries: list[Entry]) -> list[object]:
        rows = self.legacy_rows(entries)
        if rows is None:
            pytest.skip(f"{type(self).__name__} gives no legacy rows (legacy_rows)")
        return rows

    def test_legacy_import(self, shard: Shard) -> None:
        """A legacy index's rows for a shard become its scan's records, each re-read
        record with the check of what ``read`` returns."""
        fmt = self.fmt
        if not isinstance(fmt, LegacyImport):
            self.lacks(LegacyImport)
        path, offsets = shard
        rows = self._legacy(self.scan(path))
        size = path.stat().st_size
        picks = range(len(rows))
        found, reread = fmt.check_entries(
            LegacyRows(str(path), size, rows, picks, dict(self.SCAN_OPTIONS))
        )
        assert reread == len(picks)
        assert [e.key for e in found] == [k for k, _ in RECORDS]
        assert [e.offset for e in found] == offsets
        with file_source(path) as source:
            for entry in found:
                self.assert_checks(entry, self.read_raw(source, entry))

    def test_legacy_import_refuses_a_short_index(self, shard: Shard) -> None:
        """An index without the shard's last record, or without any, does not match."""
        fmt = self.fmt
        if not isinstance(fmt, LegacyImport):
            self.lacks(LegacyImport)
        path, _ = shard
        rows = self._legacy(self.scan(path))
        size, options = path.stat().st_size, dict(self.SCAN_OPTIONS)
        short = rows[:-1]
        with pytest.raises((Mismatch, CorruptRecordError)):
            fmt.check_entries(LegacyRows(str(path), size, short, range(len(short)), options))
        with pytest.raises(Mismatch):
            fmt.check_entries(LegacyRows(str(path), size, [], [], options))
