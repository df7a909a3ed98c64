"""The format contract (:mod:`shardcat.testing.formats`) for every registered format:
TFRecord, RecordIO, tar (built in) and Parquet (through its entry point).

Each format joins with one subclass giving a writer: records
``[(key, {feature: bytes})]`` written to a path, each record's offset returned.
A format whose records cannot hold those features as they are says how its
reader shows them (``view``: RecordIO has a float label in the IRHeader and the
image as ``data``; Parquet stores the label as an integer column).
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from shardcat.formats.base import Entry
from shardcat.formats.recordio import IRHeader, RecordIOWriter, pack
from shardcat.formats.registry import known_formats
from shardcat.formats.tfrecord import TFRecordWriter, make_example
from shardcat.testing.formats import FormatContract, Records
from shardcat.testing.required import need


class TestTFRecord(FormatContract):
    FORMAT = "tfrecord"
    SUFFIX = ".tfrecord"
    COMPRESSIONS = ("gzip", "bz2", "xz")

    def write(self, path: Path, records: Records) -> list[int]:
        with TFRecordWriter(path) as w:
            return [w.write(make_example({"key": key, **features})) for key, features in records]

    def legacy_rows(self, entries: list[Entry]) -> list[Any]:
        """tfd-utils' index: ``{key: {offset, length}}`` (payload length)."""
        return [Entry(e.key, e.offset, e.length) for e in entries]


class TestRecordIO(FormatContract):
    FORMAT = "recordio"
    SUFFIX = ".rec"
    CHECKSUM = False

    def write(self, path: Path, records: Records) -> list[int]:
        """Keys in the .idx beside the .rec; label in the IRHeader, image as the data."""
        with RecordIOWriter(path) as w:
            return [
                w.write(pack(IRHeader(0, float(f["label"]), i, 0), f["image"]), key)
                for i, (key, f) in enumerate(records)
            ]

    def view(self, features: dict[str, bytes]) -> dict[str, object]:
        return {"label": float(features["label"]), "data": features["image"]}

    def legacy_rows(self, entries: list[Entry]) -> list[Any]:
        """An MXNet ``.idx``: ``key<TAB>offset`` lines."""
        return [(e.key, e.offset) for e in entries]


class TestTar(FormatContract):
    FORMAT = "tar"
    SUFFIX = ".tar"
    CHECKSUM = False
    COMPRESSIONS = ("gzip", "bz2", "xz")

    def write(self, path: Path, records: Records) -> list[int]:
        """One member ``<key>.<feature>`` per feature; a record's offset is its first header."""
        offsets = []
        with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
            for key, features in records:
                offsets.append(tf.offset)
                for feature, value in features.items():
                    info = tarfile.TarInfo(f"{key}.{feature}")
                    info.size = len(value)
                    tf.addfile(info, io.BytesIO(value))
        return offsets

    def legacy_rows(self, entries: list[Entry]) -> list[Any]:
        """tfd-utils' tar index: ``(key, ext, member name, data offset, size)`` per member."""
        return [(e.key, m[0], f"{e.key}.{m[0]}", m[1], m[2]) for e in entries for m in e.members]


class TestParquet(FormatContract):
    FORMAT = "parquet"
    SUFFIX = ".parquet"
    ROWS_PER_GROUP = 3

    @pytest.fixture(autouse=True)
    def _pyarrow(self) -> None:
        need("pyarrow", why="shardcat[parquet]")

    def write(self, path: Path, records: Records) -> list[int]:
        """Key, image (binary) and label (int64) columns, three rows per row group
        with page checksums; a row's offset is its row group's first byte."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table(
            {
                "key": pa.array([k for k, _ in records], pa.string()),
                "image": pa.array([f["image"] for _, f in records], pa.binary()),
                "label": pa.array([int(f["label"]) for _, f in records], pa.int64()),
            }
        )
        pq.write_table(table, path, row_group_size=self.ROWS_PER_GROUP, write_page_checksum=True)
        meta = pq.ParquetFile(path).metadata
        starts = []
        for i in range(meta.num_row_groups):
            group = meta.row_group(i)
            chunks = [group.column(j) for j in range(group.num_columns)]
            start = min(
                min(c.data_page_offset, c.dictionary_page_offset or c.data_page_offset)
                for c in chunks
            )
            starts += [start] * group.num_rows
        return starts

    def view(self, features: dict[str, bytes]) -> dict[str, object]:
        return {"image": features["image"], "label": int(features["label"])}

    def truncated_offset(self, offsets: Sequence[int], size: int) -> int:
        return size - 8  # where the footer's length and magic should be


CONTRACTS = [TestTFRecord, TestRecordIO, TestTar, TestParquet]


def test_every_registered_format_has_a_contract_writer():
    assert set(known_formats()) == {c.FORMAT for c in CONTRACTS}
