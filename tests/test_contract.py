"""The contract every container format meets (one parametrized suite, like fsspec's).

A format joins by adding a writer to ``WRITERS``: a function writing records
``[(key, {feature: bytes})]`` to a path and returning each record's offset.
A format whose records cannot hold those features as they are adds to
``VIEWS`` how its reader shows them (RecordIO: a float label in the IRHeader,
the image as ``data``). Formats without a payload checksum are listed in
``NO_PAYLOAD_CHECKSUM``: a flipped payload byte is undetectable there, but
corrupt framing is caught by every format.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from shardcat import Catalog, CorruptRecordError, IngestError
from shardcat.readers.formats import detect_format, get_format, known_formats
from shardcat.readers.recordio import IRHeader, RecordIOWriter, pack
from shardcat.readers.source import FileSource
from shardcat.readers.tfrecord import TFRecordWriter, make_example

Records = list[tuple[str, dict[str, bytes]]]


def write_tfrecord(path: Path, records: Records) -> list[int]:
    with TFRecordWriter(path) as w:
        return [w.write(make_example({"key": key, **features})) for key, features in records]


def write_recordio(path: Path, records: Records) -> list[int]:
    """Keys in the .idx beside the .rec; label in the IRHeader, image as the data."""
    with RecordIOWriter(path) as w:
        return [
            w.write(pack(IRHeader(0, float(f["label"]), i, 0), f["image"]), key)
            for i, (key, f) in enumerate(records)
        ]


def write_tar(path: Path, records: Records) -> list[int]:
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


WRITERS: dict[str, tuple[str, Callable[[Path, Records], list[int]]]] = {
    "tfrecord": (".tfrecord", write_tfrecord),
    "recordio": (".rec", write_recordio),
    "tar": (".tar", write_tar),
}

# How a format's reader shows a contract record's features (default: as written).
VIEWS: dict[str, Callable[[dict[str, bytes]], dict[str, object]]] = {
    "recordio": lambda f: {"label": float(f["label"]), "data": f["image"]},
}
NO_PAYLOAD_CHECKSUM = {"recordio", "tar"}


def view(name: str, features: dict[str, bytes]) -> dict[str, object]:
    return VIEWS[name](features) if name in VIEWS else dict(features)


def cut_inside_last_record(name: str, path: Path) -> None:
    """Truncate the file in the middle of its last record (a file may end with
    padding after it, as tar archives do)."""
    last = list(get_format(name).scan(str(path), {"key": "key"}))[-1]
    path.write_bytes(path.read_bytes()[: last.offset + max(1, last.length // 2)])


def sql_value(value: object) -> object:
    """Short UTF-8 bytes are text in SQL."""
    return value.decode() if isinstance(value, bytes) else value


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
            raw = (  # records made of parts are read one member at a time
                {f: fmt.read(FileSource(fd), str(path), o, n, True) for f, o, n in entry.members}
                if fmt.PARTS
                else fmt.read(FileSource(fd), str(path), entry.offset, entry.length, True)
            )
            record = fmt.decode(raw, {})
            for feature, value in view(name, features).items():
                assert fmt.feature_list(record, feature) == [value]
            assert fmt.feature_list(record, "absent") is None
    finally:
        os.close(fd)


def test_corruption_names_file_and_offset(shard):
    name, path, offsets = shard
    if name in NO_PAYLOAD_CHECKSUM:
        pytest.skip(f"{name} payloads carry no checksum")
    data = bytearray(path.read_bytes())
    data[offsets[5] + (offsets[6] - offsets[5]) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError) as err:
        list(get_format(name).scan(str(path), {"key": "key"}))
    assert err.value.path == str(path)
    assert err.value.offset == offsets[5]
    assert f"at byte {offsets[5]}" in str(err.value)


def test_corrupt_framing_names_file_and_offset(shard):
    name, path, offsets = shard
    data = bytearray(path.read_bytes())
    data[offsets[5]] ^= 0xFF  # the first byte of the record's framing
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError) as err:
        list(get_format(name).scan(str(path), {"key": "key"}))
    assert err.value.path == str(path)
    assert err.value.offset == offsets[5]


def test_truncation_names_last_record(shard):
    name, path, offsets = shard
    cut_inside_last_record(name, path)
    with pytest.raises(CorruptRecordError) as err:
        list(get_format(name).scan(str(path), {"key": "key"}))
    assert err.value.offset == offsets[-1]


def test_ingest_and_read_back(shard, tmp_path: Path):
    name, path, _ = shard
    with Catalog(tmp_path / "c.sqlite") as cat, cat.ingest(path, "ds", format=name) as reader:
        assert len(reader) == len(RECORDS)
        assert reader.get_keys() == [k for k, _ in RECORDS]
        for key, features in RECORDS:
            for feature, value in view(name, features).items():
                assert reader.get_feature(key, feature) == value
        assert reader.get_feature("missing", "image") is None
        with pytest.raises(KeyError):
            reader["missing"]
        rows = cat.query("SELECT label, count(*) FROM ds GROUP BY label ORDER BY label")
        labels = [sql_value(view(name, f)["label"]) for _, f in RECORDS]
        assert rows == [(label, labels.count(label)) for label in sorted(set(labels))]


def test_ingest_of_a_bad_shard_keeps_the_good_one(shard, tmp_path: Path):
    name, _, _ = shard
    suffix, write = WRITERS[name]
    bad = tmp_path / f"shard-001{suffix}"
    write(bad, RECORDS[:2])
    cut_inside_last_record(name, bad)
    with Catalog(tmp_path / "c.sqlite") as cat:
        with pytest.raises(IngestError) as err:
            cat.ingest(str(tmp_path / f"shard-*{suffix}"), "ds", format=name)
        assert [f.path for f in err.value.failures] == [bad.name]
        assert str(bad) in str(err.value)
        with cat.dataset("ds") as reader:
            assert len(reader) == len(RECORDS)
