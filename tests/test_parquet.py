"""Parquet beyond the contract: registered through the entry point only, usable
without pyarrow up to the point it is needed, row locations that read one row
group and the footer, keys and SQL fields from columns, damaged bytes."""

from __future__ import annotations

import gzip
import os
import random
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import shardcat
from shardcat import Catalog, CatalogError, CorruptRecordError
from shardcat.formats.base import Location
from shardcat.formats.registry import get_format, known_formats, register_format
from shardcat.sources.local import FileSource
from shardcat.testing.required import needs

if "parquet" not in known_formats():  # installed before its entry point was declared
    register_format(
        "parquet",
        "shardcat.formats.parquet:ParquetFormat",
        install_hint="pip install 'shardcat[parquet]'",
    )

ROOT = Path(shardcat.__file__).resolve().parents[1]
HINT = "pip install 'shardcat[parquet]'"


def run_python(code: str, *paths: Path) -> str:
    """Run ``code`` in a fresh interpreter with ``paths`` and this tree first on sys.path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_registered_by_the_entry_point_only(tmp_path: Path):
    """Not in the built-in table: a package's ``shardcat.formats`` entry point (here a
    bare dist-info on sys.path) is what makes ``get_format("parquet")`` work."""
    probe = tmp_path / "site"
    info = probe / "parquet_probe-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: parquet-probe\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[shardcat.formats]\nparquet = shardcat.formats.parquet:ParquetFormat\n"
    )
    out = run_python(
        """
        from importlib import metadata
        from shardcat.formats import registry as formats
        assert "parquet" not in formats._registry, "parquet is not a built-in format"
        names = sorted(
            ep.dist.name for ep in metadata.entry_points(group=formats.ENTRY_POINT_GROUP)
            if ep.name == "parquet"
        )
        fmt = formats.get_format("parquet")
        print(" ".join(names), type(fmt).__name__, fmt.NAME, "parquet" in formats.known_formats())
        """,
        probe,
    )
    names, cls, name, known = out.rsplit(maxsplit=3)
    assert "parquet-probe" in names.split()
    assert (cls, name, known) == ("ParquetFormat", "parquet", "True")


def test_the_package_declares_its_entry_point_and_extra():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["shardcat.formats"] == {
        "parquet": "shardcat.formats.parquet:ParquetFormat"
    }
    assert project["optional-dependencies"]["parquet"] == ["pyarrow>=15"]


def test_without_pyarrow(tmp_path: Path):
    """The module imports and sniffs; scanning and reading say what to install."""
    path = tmp_path / "x.parquet"
    path.write_bytes(b"PAR1" + bytes(64) + b"PAR1")
    out = run_python(
        f"""
        import os, sys
        sys.modules["pyarrow"] = None
        sys.modules["pyarrow.parquet"] = None
        from shardcat import CatalogError
        from shardcat.formats.base import Location
        from shardcat.formats.registry import get_format, known_formats, register_format
        from shardcat.sources.local import FileSource
        if "parquet" not in known_formats():
            register_format("parquet", "shardcat.formats.parquet:ParquetFormat")
        fmt = get_format("parquet")
        print(fmt.sniff(b"PAR1" + bytes(8)), fmt.sniff(b"PAR2"))
        path = {str(path)!r}
        try:
            list(fmt.scan(path, {{}}))
        except CatalogError as exc:
            print(exc)
        fd = os.open(path, os.O_RDONLY)
        try:
            fmt.read(FileSource(fd, path), Location(4, 8, ((4, 8), (60, 12)), 0))
        except CatalogError as exc:
            print(exc)
        """
    )
    sniffs, scan_error, read_error = out.splitlines()
    assert sniffs == "True False"
    assert scan_error == read_error == f"the parquet format needs pyarrow: {HINT}"


# -- with pyarrow -----------------------------------------------------------------------

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError:  # the tests above still run
    pa = pq = None

needs_pyarrow = needs(pa is not None, "shardcat[parquet]")


def image(i: int, size: int | None) -> bytes:
    """Row ``i``'s image: ``size`` incompressible bytes, or a short run."""
    return bytes([i]) * (100 + i) if size is None else random.Random(i).randbytes(size)


def write(
    path: Path, n: int = 10, rows_per_group: int = 4, image_size: int | None = None, **columns: Any
) -> Path:
    table = pa.table(
        {
            "key": pa.array([f"r{i:02d}" for i in range(n)], pa.string()),
            "image": pa.array([image(i, image_size) for i in range(n)], pa.binary()),
            **columns,
        }
    )
    pq.write_table(table, path, row_group_size=rows_per_group, write_page_checksum=True)
    return path


class Recording:
    """A source that remembers every ``pread``."""

    def __init__(self, source: FileSource) -> None:
        self.source = source
        self.path = source.path
        self.calls: list[tuple[int, int]] = []

    def pread(self, length: int, offset: int) -> bytes:
        self.calls.append((offset, length))
        return self.source.pread(length, offset)

    def close(self) -> None:
        self.source.close()


def open_source(path: Path) -> FileSource:
    return FileSource(os.open(path, os.O_RDONLY), str(path))


@needs_pyarrow
def test_locations_are_row_groups_rows_and_the_footer(tmp_path: Path):
    path = write(tmp_path / "a.parquet")
    size = path.stat().st_size
    (footer_length,) = struct.unpack("<I", path.read_bytes()[-8:-4])
    entries = list(get_format("parquet").scan(str(path), {}))
    assert [e.key for e in entries] == [f"r{i:02d}" for i in range(10)]
    assert [e.item for e in entries] == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    groups = [entries[0], entries[4], entries[8]]
    assert len({e.offset for e in groups}) == 3
    assert groups[0].offset == 4  # right after the PAR1 magic
    for e in groups:  # contiguous row groups, then the footer
        assert e.extents == ((e.offset, e.length), (size - 8 - footer_length, footer_length + 8))
    assert groups[1].offset == groups[0].offset + groups[0].length
    assert groups[2].offset + groups[2].length == size - 8 - footer_length
    for i, e in enumerate(entries):
        g = groups[i // 4]
        assert e.location == Location(g.offset, g.length, g.extents, i % 4)


@needs_pyarrow
def test_a_row_is_read_from_its_row_group_and_the_footer_only(tmp_path: Path):
    path = write(tmp_path / "a.parquet", n=40, rows_per_group=8, image_size=1000)
    fmt = get_format("parquet")
    entries = list(fmt.scan(str(path), {}))
    entry = entries[21]
    source = Recording(open_source(path))
    try:
        record = fmt.decode(fmt.read(source, entry.location), {})
    finally:
        source.close()
    assert record == {"key": "r21", "image": image(21, 1000)}
    assert source.calls == list(entry.extents or ())
    assert sum(n for _, n in source.calls) < path.stat().st_size // 2
    assert fmt.feature_list(record, "image") == [image(21, 1000)]
    assert fmt.feature_list(record, "absent") is None


@needs_pyarrow
def test_keys_and_fields_from_columns(tmp_path: Path):
    n = 6
    path = write(
        tmp_path / "a.parquet",
        n=n,
        count=pa.array(range(n), pa.int32()),
        score=pa.array([i / 4 for i in range(n)], pa.float64()),
        small=pa.array([0.1] * n, pa.float32()),
        flag=pa.array([i % 2 == 0 for i in range(n)]),
        note=pa.array(["x" * 300 if i == 0 else f"n{i}" for i in range(n)]),
        maybe=pa.array([None if i == 1 else i for i in range(n)], pa.int64()),
        tags=pa.array([[i, i] for i in range(n)], pa.list_(pa.int64())),
    )
    fmt = get_format("parquet")
    first, second = list(fmt.scan(str(path), {}))[:2]
    assert first.fields == {"count": 0, "score": 0.0, "small": 0.1, "flag": 1, "maybe": 0}
    assert second.fields == {
        "count": 1,
        "score": 0.25,
        "small": 0.1,
        "flag": 0,
        "note": "n1",
    }  # long text, nulls, binary and lists are no SQL fields
    assert [e.fields for e in fmt.scan(str(path), {"fields": False})] == [{}] * n
    by_position = list(fmt.scan(str(path), {"key": None}))
    assert [e.key for e in by_position] == [None] * n
    by_count = list(fmt.scan(str(path), {"key": "count"}))
    assert [e.key for e in by_count] == [str(i) for i in range(n)]
    assert "count" not in by_count[0].fields
    assert fmt.key_rule({}) == "column:key"
    assert fmt.key_rule({"key": None}) == "position"
    with pytest.raises(CatalogError, match="no key column 'nope'"):
        list(fmt.scan(str(path), {"key": "nope"}))
    with pytest.raises(CatalogError, match="key column 'score' is double"):
        list(fmt.scan(str(path), {"key": "score"}))
    source = open_source(path)
    try:
        record = fmt.decode(fmt.read(source, second.location), {})
    finally:
        source.close()
    assert fmt.feature_list(record, "tags") == [1, 1]
    assert fmt.feature_list(record, "maybe") is None
    assert fmt.features(record)["count"] == [1]


@needs_pyarrow
def test_compressed_parquet_is_refused(tmp_path: Path):
    plain = write(tmp_path / "a.parquet")
    packed = tmp_path / "a.parquet.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    fmt = get_format("parquet")
    assert not fmt.STREAMS
    with pytest.raises(CatalogError, match="gzip-compressed Parquet file cannot be indexed"):
        list(fmt.scan(str(packed), {}))
    with pytest.raises(CatalogError, match="cannot be gzip-compressed"):
        fmt.scan_shard(str(packed), {})


@needs_pyarrow
def test_damaged_bytes_on_read_name_file_and_row_group(tmp_path: Path):
    path = write(tmp_path / "a.parquet")
    fmt = get_format("parquet")
    entries = list(fmt.scan(str(path), {}))
    victim = entries[5]  # row 1 of row group 1
    chunk = pq.ParquetFile(path).metadata.row_group(1).column(1)  # its images
    end = (chunk.dictionary_page_offset or chunk.data_page_offset) + chunk.total_compressed_size
    data = bytearray(path.read_bytes())
    data[end - 3] ^= 0xFF  # page data, which the page CRC covers
    path.write_bytes(bytes(data))
    source = open_source(path)
    try:
        with pytest.raises(CorruptRecordError) as err:
            fmt.read(source, victim.location, True)
        assert (err.value.path, err.value.offset) == (str(path), victim.offset)
        assert fmt.decode(fmt.read(source, entries[0].location, True), {})["key"] == "r00"
        short = Location(victim.offset, victim.length, ((victim.offset, 10**6),), victim.item)
        with pytest.raises(CorruptRecordError) as err:
            fmt.read(source, short)
        assert (err.value.path, err.value.offset) == (str(path), victim.offset)
    finally:
        source.close()
    with pytest.raises(CorruptRecordError) as err:
        list(fmt.scan(str(path), {}))
    assert (err.value.path, err.value.offset) == (str(path), victim.offset)


@needs_pyarrow
def test_not_parquet_at_all(tmp_path: Path):
    fmt = get_format("parquet")
    for name, content, offset in [
        ("short", b"PAR1PAR1", 0),
        ("head", b"PAR0" + bytes(20) + b"PAR1", 0),
        ("tail", b"PAR1" + bytes(20) + b"PAR0", 20),
        ("length", b"PAR1" + bytes(16) + b"\xff\xff\x00\x00PAR1", 20),
    ]:
        path = tmp_path / f"{name}.parquet"
        path.write_bytes(content)
        with pytest.raises(CorruptRecordError) as err:
            list(fmt.scan(str(path), {}))
        assert (err.value.path, err.value.offset) == (str(path), offset), name


@needs_pyarrow
def test_catalog_sql_fields_and_positions(tmp_path: Path):
    """Through the catalog: columns become SQL fields; key=None keys by position."""
    path = write(
        tmp_path / "a.parquet",
        score=pa.array([i / 10 for i in range(10)], pa.float64()),
        label=pa.array([f"c{i % 3}" for i in range(10)]),
    )
    with Catalog(tmp_path / "cat.sqlite") as cat:
        with cat.ingest(path, "ds", format="parquet") as reader:
            assert reader.where("score > 0.65") == ["r07", "r08", "r09"]
            assert reader.get_feature("r04", "image") == bytes([4]) * 104
        assert cat.query("SELECT count(*) FROM ds WHERE label = 'c1'") == [(3,)]
        assert cat.info("ds").key_rule == "column:key"
        with cat.ingest(path, "pos", format="parquet", key=None) as reader:
            assert reader.get_keys() == [str(i) for i in range(10)]
            assert reader.get_record_at(6)["key"] == "r06"
            assert reader.get_feature("9", "key") == "r09"
