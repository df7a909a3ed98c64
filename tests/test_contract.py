"""The contract every container format meets (one parametrized suite, like fsspec's).

A format joins by adding a writer to ``WRITERS``: a function writing records
``[(key, {feature: bytes})]`` to a path and returning each record's offset.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from shardcat import Catalog, CorruptRecordError, IngestError
from shardcat.readers.formats import detect_format, get_format, known_formats
from shardcat.readers.source import FileSource
from shardcat.readers.tfrecord import TFRecordWriter, make_example

Records = list[tuple[str, dict[str, bytes]]]


def write_tfrecord(path: Path, records: Records) -> list[int]:
    with TFRecordWriter(path) as w:
        return [w.write(make_example({"key": key, **features})) for key, features in records]


WRITERS: dict[str, tuple[str, Callable[[Path, Records], list[int]]]] = {
    "tfrecord": (".tfrecord", write_tfrecord),
}

RECORDS: Records = [
    (f"sample_{i:03d}", {"image": bytes([i]) * (10 + i), "label": str(i % 3).encode()})
    for i in range(12)
]


@pytest.fixture(params=sorted(WRITERS))
def shard(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path, list[int]]:
    suffix, write = WRITERS[request.param]
    path = tmp_path / f"shard-000{suffix}"
    return request.param, path, write(path, RECORDS)


def test_every_registered_format_has_a_contract_writer():
    assert set(known_formats()) == set(WRITERS)


def test_detected_from_content(shard, tmp_path: Path):
    name, path, _ = shard
    renamed = tmp_path / "no_extension"
    os.rename(path, renamed)
    assert detect_format(str(renamed)) == name


def test_scan_read_decode(shard):
    name, path, offsets = shard
    fmt = get_format(name)
    entries = list(fmt.scan(str(path), {"key": "key"}))
    assert [e.key for e in entries] == [k for k, _ in RECORDS]
    assert [e.offset for e in entries] == offsets
    fd = os.open(path, os.O_RDONLY)
    try:
        for entry, (_, features) in zip(entries, RECORDS, strict=True):
            record = fmt.decode(
                fmt.read(FileSource(fd), str(path), entry.offset, entry.length, True), {}
            )
            for feature, value in features.items():
                assert fmt.feature_list(record, feature) == [value]
            assert fmt.feature_list(record, "absent") is None
    finally:
        os.close(fd)


def test_corruption_names_file_and_offset(shard):
    name, path, offsets = shard
    data = bytearray(path.read_bytes())
    data[offsets[5] + (offsets[6] - offsets[5]) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError) as err:
        list(get_format(name).scan(str(path), {"key": "key"}))
    assert err.value.path == str(path)
    assert err.value.offset == offsets[5]
    assert f"at byte {offsets[5]}" in str(err.value)


def test_truncation_names_last_record(shard):
    name, path, offsets = shard
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(CorruptRecordError) as err:
        list(get_format(name).scan(str(path), {"key": "key"}))
    assert err.value.offset == offsets[-1]


def test_ingest_and_read_back(shard, tmp_path: Path):
    name, path, _ = shard
    with Catalog(tmp_path / "c.sqlite") as cat, cat.ingest(path, "ds", format=name) as reader:
        assert len(reader) == len(RECORDS)
        assert reader.get_keys() == [k for k, _ in RECORDS]
        for key, features in RECORDS:
            for feature, value in features.items():
                assert reader.get_feature(key, feature) == value
        assert reader.get_feature("missing", "image") is None
        with pytest.raises(KeyError):
            reader["missing"]
        rows = cat.query("SELECT label, count(*) FROM ds GROUP BY label ORDER BY label")
        assert rows == [("0", 4), ("1", 4), ("2", 4)]


def test_ingest_of_a_bad_shard_keeps_the_good_one(shard, tmp_path: Path):
    name, _, _ = shard
    suffix, write = WRITERS[name]
    bad = tmp_path / f"shard-001{suffix}"
    write(bad, RECORDS[:2])
    bad.write_bytes(bad.read_bytes()[:-1])
    with Catalog(tmp_path / "c.sqlite") as cat:
        with pytest.raises(IngestError) as err:
            cat.ingest(str(tmp_path / f"shard-*{suffix}"), "ds", format=name)
        assert [f.path for f in err.value.failures] == [bad.name]
        assert str(bad) in str(err.value)
        with cat.dataset("ds") as reader:
            assert len(reader) == len(RECORDS)
