"""The contract every container format meets: a pytest base class to inherit,
like fsspec's abstract tests.

A format's test module subclasses :class:`FormatContract` once, naming the
format and giving a writer; every test of the contract then runs for it::

    from shardcat.testing.formats import FormatContract, Records

    class TestMyFormat(FormatContract):
        FORMAT = "myformat"
        SUFFIX = ".myf"

        def write(self, path, records):
            ...  # write records [(key, {feature: bytes})] to path
            return offsets  # each record's offset, as the format's scan reports it

Knobs (class attributes and methods a subclass may override):

- ``SUFFIX``: the file name ending of the shards the writer makes;
- ``CHECKSUM``: payloads carry a checksum (a flipped payload byte is caught
  by ``scan`` and ``verify``; corrupt framing is caught by every format);
- ``COMPRESSIONS``: the whole-file compressions (``gzip``, ``bz2``, ``xz``)
  its shards may have (the format's ``STREAMS``); the others must be refused;
- ``SCAN_OPTIONS``: the options the contract's scans get;
- :meth:`FormatContract.view`: how the format's reader shows a contract
  record's features (default: as written);
- :meth:`FormatContract.truncated_offset`: the offset a scan names for a
  shard cut inside its last record (default: that record's offset);
- :meth:`FormatContract.legacy_rows`: the rows a legacy index holds for a
  shard, made from its scanned entries (formats with the legacy-import
  capability; default: none, that test is skipped).

Beyond the core (sniff, scan, read, decode, feature_list, the scans through the
catalog, compressed shards, verify, fork safety, bad input), a format gets the
contract of each capability it has (:mod:`shardcat.testing.capabilities`):
a format that defines ``index_lines`` gets the DALI index tests, one that
defines ``check_entries`` the legacy-import tests, and so on; the others are
skipped, saying which capability the format does not have.

The tests use only the public API (:class:`shardcat.Catalog`, the format
registry, the errors) and pytest's ``tmp_path``; records are small and a
shard holds a dozen, so the contract runs in seconds. Compressed variants
need ``shardcat[compressed]`` and are skipped without it.
"""

from __future__ import annotations

import multiprocessing
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardcat import Catalog, CatalogError, CorruptRecordError, IngestError
from shardcat.formats.base import Format
from shardcat.formats.registry import detect_format, get_format, known_formats
from shardcat.sources.local import FileSource
from shardcat.testing.capabilities import CapabilityContract
from shardcat.testing.contract_base import (
    BIG_RECORDS,
    COMPRESSORS,
    RECORDS,
    Records,
    digest,
    sql_value,
)

__all__ = ["BIG_RECORDS", "COMPRESSORS", "RECORDS", "FormatContract", "Records"]

_FINGERPRINT_SPAN = 64 * 1024  # see shardcat.sources.local
_CHILDREN = 3

_contracts: dict[str, type[FormatContract]] = {}


def _child_reads(reader: Any, keys: list[str], out: Any) -> None:
    """In a forked child: every record by key (one at a time, backwards) and by
    position (one batch), as digests."""
    try:
        single = [digest(reader.get_raw(k)) for k in reversed(keys)][::-1]
        batch = [digest(r) for r in reader.get_many_at(slice(None), raw=True)]
        out.put((os.getpid(), single, batch))
    except BaseException as exc:  # the parent reports it
        out.put((os.getpid(), repr(exc), None))


class FormatContract(CapabilityContract):
    """The contract tests (see the module docstring). Not collected by itself
    (no ``Test`` prefix); subclasses set ``FORMAT`` and define :meth:`write`."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "FORMAT" in cls.__dict__:
            _contracts[cls.FORMAT] = cls

    # -- registry and sniffing ------------------------------------------------------

    def test_registered_by_name(self) -> None:
        fmt = self.fmt
        assert isinstance(fmt, Format)
        assert fmt.NAME == self.FORMAT
        assert self.FORMAT in known_formats()
        assert get_format(self.FORMAT) is fmt  # imported once

    def test_detected_from_content(self, shard: tuple[Path, list[int]], tmp_path: Path) -> None:
        path, _ = shard
        renamed = tmp_path / "no_extension"
        os.rename(path, renamed)
        assert detect_format(str(renamed)) == self.FORMAT

    def _heads(self, tmp_path: Path) -> Iterator[tuple[str, bytes]]:
        """First bytes of other files: every other contract's shard, and a few that
        are no format's."""
        for name, contract in sorted(_contracts.items()):
            if name != self.FORMAT:
                path = contract().shard_path(tmp_path / name)
                path.parent.mkdir()
                try:
                    contract().write(path, RECORDS[:3])
                except ImportError:  # its writer needs an extra not installed here
                    continue
                yield name, path.read_bytes()[:512]
        yield "empty", b""
        yield "zeros", bytes(512)
        yield "random", random.Random(11).randbytes(512)
        yield "text", b'{"key": "sample_000", "label": 0}\n' * 16

    def test_sniff_refuses_other_files(self, tmp_path: Path) -> None:
        fmt = self.fmt
        for name, head in self._heads(tmp_path):
            assert not fmt.sniff(head), f"{self.FORMAT} sniff takes a {name} file"

    def test_other_sniffs_refuse_its_files(self, shard: tuple[Path, list[int]]) -> None:
        path, _ = shard
        head = path.read_bytes()[:512]
        assert self.fmt.sniff(head)
        for name in known_formats():
            if name == self.FORMAT:
                continue
            try:
                other = get_format(name)
            except CatalogError:
                continue  # not importable here: it cannot claim the file either
            assert not other.sniff(head), f"{name} sniff takes a {self.FORMAT} file"

    # -- scan, read, decode -----------------------------------------------------------

    def test_scan_read_decode(self, shard: tuple[Path, list[int]]) -> None:
        path, offsets = shard
        fmt = self.fmt
        entries = self.scan(path)
        assert [e.key for e in entries] == [k for k, _ in RECORDS]
        assert [e.offset for e in entries] == offsets
        fd = os.open(path, os.O_RDONLY)
        try:
            source = FileSource(fd, str(path))
            for entry, (_, features) in zip(entries, RECORDS, strict=True):
                raw = self.read_raw(source, entry)
                self.assert_checks(entry, raw)
                self.assert_record(fmt.decode(raw, {}), features)
        finally:
            os.close(fd)

    # -- through the catalog ----------------------------------------------------------

    def test_ingest_and_read_back(self, shard: tuple[Path, list[int]], tmp_path: Path) -> None:
        path, _ = shard
        keys = [k for k, _ in RECORDS]
        with (
            Catalog(tmp_path / "cat.sqlite") as cat,
            cat.ingest(path, "ds", format=self.FORMAT) as reader,
        ):
            assert len(reader) == len(RECORDS)
            assert reader.get_keys() == keys
            assert list(reader.iter_keys()) == keys
            for key, features in RECORDS:
                for feature, value in self.view(features).items():
                    assert reader.get_feature(key, feature) == value
                self.assert_record(reader[key], features)
            assert reader.get_feature("missing", "image") is None
            with pytest.raises(KeyError):
                reader["missing"]
            rows = cat.query("SELECT label, count(*) FROM ds GROUP BY label ORDER BY label")
            labels: list[Any] = [sql_value(self.view(f)["label"]) for _, f in RECORDS]
            assert rows == [(label, labels.count(label)) for label in sorted(set(labels))]

    def test_get_many_keeps_the_order_asked(
        self, shard: tuple[Path, list[int]], tmp_path: Path
    ) -> None:
        path, _ = shard
        wanted = list(RECORDS)
        random.Random(3).shuffle(wanted)
        wanted = wanted[:7] + wanted[:2]  # a key asked twice comes back twice
        with (
            Catalog(tmp_path / "cat.sqlite") as cat,
            cat.ingest(path, "ds", format=self.FORMAT) as reader,
        ):
            records = reader.get_many([k for k, _ in wanted])
            assert len(records) == len(wanted)
            for record, (_, features) in zip(records, wanted, strict=True):
                self.assert_record(record, features)
            with pytest.raises(KeyError):
                reader.get_many([wanted[0][0], "missing"])

    def test_positions(self, shard: tuple[Path, list[int]], tmp_path: Path) -> None:
        path, _ = shard
        with (
            Catalog(tmp_path / "cat.sqlite") as cat,
            cat.ingest(path, "ds", format=self.FORMAT) as reader,
        ):
            for i, (key, features) in enumerate(RECORDS):
                assert reader.key_at(i) == key
                self.assert_record(reader.get_record_at(i), features)
            self.assert_record(reader.get_record_at(-1), RECORDS[-1][1])
            assert reader.key_at(-1) == RECORDS[-1][0]
            window = reader.get_many_at(slice(2, 11, 3))
            assert len(window) == 3
            for record, (_, features) in zip(window, RECORDS[2:11:3], strict=True):
                self.assert_record(record, features)
            chosen = [9, 0, 4]
            for record, i in zip(reader.get_many_at(chosen), chosen, strict=True):
                self.assert_record(record, RECORDS[i][1])

    # -- compressed shards ------------------------------------------------------------

    @pytest.mark.parametrize("compression", sorted(COMPRESSORS))
    def test_compressed_shard(
        self, compression: str, shard: tuple[Path, list[int]], tmp_path: Path
    ) -> None:
        """A supported compression reads the same bytes back as the plain shard;
        another one is refused with a clear error."""
        path, _ = shard
        if compression not in self.COMPRESSIONS:
            packed = path.with_name(path.name + COMPRESSORS[compression][0])
            packed.write_bytes(COMPRESSORS[compression][1](path.read_bytes()))
            with pytest.raises(CatalogError) as err:
                self.fmt.scan_shard(str(packed), self.SCAN_OPTIONS)
            assert str(packed) in str(err.value)
            return
        assert self.fmt.STREAMS
        packed = self.compressed_copy(path, compression)
        assert detect_format(str(packed)) == self.FORMAT
        keys = [k for k, _ in RECORDS]
        with Catalog(tmp_path / "cat.sqlite") as cat:
            with cat.ingest(path, "plain", format=self.FORMAT) as reader:
                expected = reader.get_many(keys, raw=True)
            with cat.ingest(packed, "packed", format=self.FORMAT) as reader:
                assert reader.get_keys() == keys
                assert reader.get_many(keys, raw=True) == expected
                assert [reader.get_raw(k) for k in reversed(keys)] == expected[::-1]
                for key, features in RECORDS:
                    for feature, value in self.view(features).items():
                        assert reader.get_feature(key, feature) == value
                assert reader.verify() == []

    # -- verify -----------------------------------------------------------------------

    def test_verify(self, tmp_path: Path) -> None:
        """[] on a good shard; with a payload byte flipped mid-file (size and mtime
        put back), one error per damaged record, naming the file and its offset."""
        path = self.shard_path(tmp_path)
        offsets = self.write(path, BIG_RECORDS)
        with Catalog(tmp_path / "cat.sqlite") as cat:
            cat.ingest(path, "ds", format=self.FORMAT).close()
            assert cat.verify("ds") == []
            if not self.CHECKSUM:
                return
            entries = self.scan(path)
            size = path.stat().st_size
            middle = min(entries, key=lambda e: abs(e.offset + e.length // 2 - size // 2))
            position = middle.offset + middle.length // 2
            assert _FINGERPRINT_SPAN <= position < size - _FINGERPRINT_SPAN
            self.damage(path, position, keep_mtime=True)
            problems = cat.verify("ds")
            assert problems
            assert all(isinstance(p, CorruptRecordError) for p in problems)
            assert {(p.path, p.offset) for p in problems} == {(str(path), middle.offset)}
            assert middle.offset in offsets

    # -- fork safety ------------------------------------------------------------------

    def _forked_reads(self, reader: Any) -> None:
        keys = reader.get_keys()
        expected = [digest(reader.get_raw(k)) for k in keys]  # the parent reads first
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        children = [
            ctx.Process(target=_child_reads, args=(reader, keys, out)) for _ in range(_CHILDREN)
        ]
        for child in children:
            child.start()
        try:
            results = [out.get(timeout=60) for _ in children]
        finally:
            for child in children:
                child.join(timeout=60)
        assert [child.exitcode for child in children] == [0] * _CHILDREN
        assert len({pid for pid, _, _ in results}) == _CHILDREN
        for _, single, batch in results:
            assert single == expected, single
            assert batch == expected
        assert [digest(reader.get_raw(k)) for k in keys] == expected  # the parent still reads

    def test_fork_safety(self, shard: tuple[Path, list[int]], tmp_path: Path) -> None:
        path, _ = shard
        with (
            Catalog(tmp_path / "cat.sqlite") as cat,
            cat.ingest(path, "ds", format=self.FORMAT) as reader,
        ):
            self._forked_reads(reader)

    def test_fork_safety_compressed(self, shard: tuple[Path, list[int]], tmp_path: Path) -> None:
        if not self.COMPRESSIONS:
            pytest.skip(f"{self.FORMAT} shards are never compressed as a whole")
        path, _ = shard
        packed = self.compressed_copy(path, self.COMPRESSIONS[0])
        with (
            Catalog(tmp_path / "cat.sqlite") as cat,
            cat.ingest(packed, "ds", format=self.FORMAT) as reader,
        ):
            self._forked_reads(reader)

    # -- bad input ----------------------------------------------------------------------

    def test_corruption_names_file_and_offset(self, shard: tuple[Path, list[int]]) -> None:
        path, offsets = shard
        if not self.CHECKSUM:
            pytest.skip(f"{self.FORMAT} payloads carry no checksum")
        entry = self.scan(path)[5]
        self.damage(path, entry.offset + max(1, entry.length) // 2)
        with pytest.raises(CorruptRecordError) as err:
            self.scan(path)
        assert err.value.path == str(path)
        assert err.value.offset == offsets[5]
        assert f"at byte {offsets[5]}" in str(err.value)

    def test_corrupt_framing_names_file_and_offset(self, shard: tuple[Path, list[int]]) -> None:
        path, offsets = shard
        self.damage(path, offsets[5])  # the first byte of the record's framing
        with pytest.raises(CorruptRecordError) as err:
            self.scan(path)
        assert err.value.path == str(path)
        assert err.value.offset == offsets[5]

    def test_truncation_names_last_record(self, shard: tuple[Path, list[int]]) -> None:
        path, offsets = shard
        self.cut_inside_last_record(path)
        with pytest.raises(CorruptRecordError) as err:
            self.scan(path)
        assert err.value.path == str(path)
        assert err.value.offset == self.truncated_offset(offsets, path.stat().st_size)

    @pytest.mark.parametrize("damage", ["truncated", "framing"])
    def test_ingest_of_a_bad_shard_keeps_the_good_one(
        self, damage: str, shard: tuple[Path, list[int]], tmp_path: Path
    ) -> None:
        """The bad shard fails with an error naming it; none of its records is indexed."""
        bad = self.shard_path(tmp_path, 1)
        others: Records = [(f"other_{i:03d}", f) for i, (_, f) in enumerate(RECORDS[:4])]
        offsets = self.write(bad, others)
        if damage == "truncated":
            self.cut_inside_last_record(bad)
        else:
            self.damage(bad, offsets[2])
        with Catalog(tmp_path / "cat.sqlite") as cat:
            with pytest.raises(IngestError) as err:
                cat.ingest(str(tmp_path / f"shard-*{self.SUFFIX}"), "ds", format=self.FORMAT)
            assert [f.path for f in err.value.failures] == [bad.name]
            assert str(bad) in str(err.value)
            with cat.dataset("ds") as reader:
                assert len(reader) == len(RECORDS)
                assert reader.get_keys() == [k for k, _ in RECORDS]
                assert reader.get_feature(others[0][0], "image") is None
            assert cat.info("ds").failed_shards == 1
