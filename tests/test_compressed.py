"""Compressed shards: .tar.gz/.tar.bz2/.tar.xz and GZIP TFRecords, detected by
content, read through seek points stored in the catalog."""

from __future__ import annotations

import bz2
import gzip
import io
import os
import random
import shutil
import subprocess
import tarfile
import zlib
from pathlib import Path

import pytest

from shardcat import (
    Catalog,
    CatalogError,
    CorruptRecordError,
    IngestError,
    TarReader,
    TFRecordReader,
)
from shardcat.formats.registry import detect_format
from shardcat.formats.tar import TarFormat
from shardcat.formats.tfrecord import TFRecordWriter, make_example
from shardcat.sources import compressed
from shardcat.testing.required import need

TAR = TarFormat()

need("indexed_gzip", why="shardcat[compressed]")
need("indexed_bzip2", why="shardcat[compressed]")


def make_tar(path: Path, n: int = 40, size: int = 5000, seed: int = 0) -> dict[str, bytes]:
    """An uncompressed WebDataset archive of mildly compressible members."""
    rng = random.Random(seed)
    contents = {}
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for i in range(n):
            for ext, data in (
                ("bin", bytes(rng.choice(b"abcdefgh") for _ in range(size + i))),
                ("cls", str(i % 4).encode()),
            ):
                name = f"s{i:04d}.{ext}"
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
                contents[name] = data
    return contents


def compress(src: Path, dst: Path, how: str) -> Path:
    data = src.read_bytes()
    if how == "gzip":
        dst.write_bytes(gzip.compress(data))
    elif how == "bz2":
        dst.write_bytes(bz2.compress(data))
    elif how in ("tar -czf", "tar -cjf"):
        raise AssertionError("use the tar command helper")
    return dst


@pytest.fixture
def plain(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    path = tmp_path / "plain" / "data.tar"
    path.parent.mkdir()
    return path, make_tar(path)


def read_all(reader: TarReader | object, contents: dict[str, bytes]) -> None:
    for name, data in contents.items():
        key, feature = name.split(".", 1)
        assert reader.get_feature(key, feature) == data  # type: ignore[attr-defined]


@pytest.mark.parametrize(("how", "kind"), [("gzip", "zran"), ("bz2", "bz2-blocks"), ("xz", None)])
def test_compressed_tar_reads_like_the_plain_one(
    tmp_path: Path, plain: tuple[Path, dict[str, bytes]], how: str, kind: str | None
):
    if how == "xz":
        need("xz", why="shardcat[compressed]")
    src, contents = plain
    path = tmp_path / "z" / "shard.bin"  # no telling extension: detected by content
    path.parent.mkdir()
    mode = {"gzip": "w:gz", "bz2": "w:bz2", "xz": "w:xz"}[how]
    with tarfile.open(src) as tf_in, tarfile.open(path, mode, format=tf_in.format) as out:
        for member in tf_in:
            out.addfile(member, tf_in.extractfile(member))
    assert compressed.detect_compression(str(path)) == how
    assert detect_format(str(path)) == "tar"
    plain_entries = list(TAR.scan(str(src), {}))
    assert list(TAR.scan(str(path), {})) == plain_entries  # decompressed offsets
    with Catalog(tmp_path / "c.sqlite") as cat, cat.ingest(path, "z", format="tar") as reader:
        read_all(reader, contents)
        assert reader.get_record_at(-1) == {
            "bin": contents["s0039.bin"],
            "cls": contents["s0039.cls"],
        }
        assert reader.verify() == []
        assert cat.query("SELECT count(*) FROM z WHERE cls = 2") == [(10,)]
        conn = cat.store.reader_connection()
        assert conn.execute("SELECT compression FROM shardcat_shards").fetchall() == [(how,)]
        rows = conn.execute("SELECT kind FROM shardcat_seek_indexes").fetchall()
        assert rows == ([] if kind is None else [(kind,)])
        members = conn.execute(
            'SELECT name, "offset", length FROM shardcat_members ORDER BY 2'
        ).fetchall()
        assert members == [m[:3] for e in plain_entries for m in e.members]


@pytest.mark.parametrize("flag", ["-czf", "-cjf"])
def test_tar_command_compressed_archives(tmp_path: Path, flag: str):
    if shutil.which("tar") is None:
        pytest.skip("no tar command")
    src = tmp_path / "src"
    src.mkdir()
    contents = {f"a{i}.txt": f"text {i}".encode() * 100 for i in range(5)}
    for name, data in contents.items():
        (src / name).write_bytes(data)
    path = tmp_path / "cmd.tgz"
    subprocess.run(["tar", flag, str(path), "-C", str(src), *contents], check=True)
    with TarReader(str(path), index_file=tmp_path / "c.sqlite") as reader:
        assert sorted(reader.get_keys()) == [f"a{i}" for i in range(5)]
        read_all(reader, contents)


def test_gzip_seek_points_are_stored_and_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    indexed_gzip = need("indexed_gzip", why="shardcat[compressed]")
    monkeypatch.setattr(compressed, "SEEK_SPACING", 256 << 10)
    src = tmp_path / "big.tar"
    contents = make_tar(src, n=60, size=40_000, seed=1)  # ~2.4 MB decompressed
    path = tmp_path / "big.tar.gz"
    compress(src, path, "gzip")
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(path, "big").close()
        (blob,) = (
            cat.store.reader_connection()
            .execute("SELECT data FROM shardcat_seek_indexes")
            .fetchone()
        )
        assert blob.startswith(b"SCSK1zran\0")
        index = indexed_gzip._IndexedGzipFile(filename=str(path), auto_build=False)
        try:
            index.import_index(fileobj=io.BytesIO(zlib.decompress(blob[len(b"SCSK1zran\0") :])))
            assert index.npoints >= 8  # one per 256 KiB of 2.4 MB
        finally:
            index.close()
        with cat.dataset("big") as reader:
            keys = reader.get_keys()
            rng = random.Random(3)
            for key in rng.sample(keys, 20) + keys[::-1][:5]:
                assert reader.get_feature(key, "bin") == contents[f"{key}.bin"]


def test_corrupt_and_truncated_gzip(tmp_path: Path, plain: tuple[Path, dict[str, bytes]]):
    src, _ = plain
    good = gzip.compress(src.read_bytes())
    truncated = tmp_path / "t.tar.gz"
    truncated.write_bytes(good[: len(good) * 2 // 3])
    with (
        pytest.raises(CorruptRecordError) as err,
        compressed.IndexingStream(str(truncated), "gzip") as stream,
    ):
        list(TAR.scan_stream(stream, str(truncated), {}))
        stream.seek_index()
    assert err.value.path == str(truncated)
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0xFF
    corrupt = tmp_path / "c.tar.gz"
    corrupt.write_bytes(bytes(flipped))
    with Catalog(tmp_path / "c.sqlite") as cat:
        for bad in (truncated, corrupt):
            with pytest.raises(IngestError) as failure:
                cat.ingest(bad, bad.name.split(".")[0], format="tar")
            assert str(bad) in str(failure.value)
            assert "gzip stream is corrupt or truncated" in str(failure.value) or (
                "truncated" in str(failure.value)
            )


def test_truncated_bz2_is_an_error(tmp_path: Path, plain: tuple[Path, dict[str, bytes]]):
    src, _ = plain
    data = bz2.compress(src.read_bytes())
    path = tmp_path / "t.tar.bz2"
    path.write_bytes(data[: len(data) - 20])
    with Catalog(tmp_path / "c.sqlite") as cat, pytest.raises(IngestError, match="bz2 stream"):
        cat.ingest(path, "t", format="tar")


def test_changed_compressed_shard_gets_new_seek_points(tmp_path: Path):
    src = tmp_path / "s.tar"
    path = tmp_path / "s.tar.gz"
    first = make_tar(src, n=5, seed=1)
    compress(src, path, "gzip")
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(path, "s").close()
        old = (
            cat.store.reader_connection()
            .execute("SELECT data FROM shardcat_seek_indexes")
            .fetchall()
        )
        second = make_tar(src, n=7, seed=2)
        compress(src, path, "gzip")
        with cat.ingest(path, "s") as reader:
            assert len(reader) == 7
            read_all(reader, second)
        new = (
            cat.store.reader_connection()
            .execute("SELECT data FROM shardcat_seek_indexes")
            .fetchall()
        )
        assert len(new) == 1 and new != old
        assert first != second
        cat.drop("s")
        assert cat.store.reader_connection().execute(
            "SELECT count(*) FROM shardcat_seek_indexes"
        ).fetchone() == (0,)


# -- GZIP TFRecord ---------------------------------------------------------------


def write_tfrecords(path: Path, n: int) -> list[tuple[str, bytes, int]]:
    rows = [(f"rec_{i:04d}", os.urandom(200 + i), i % 5) for i in range(n)]
    with TFRecordWriter(path) as w:
        for key, image, label in rows:
            w.write(make_example({"key": key, "image": image, "label": label}))
    return rows


def test_gzip_tfrecord_ingests_and_reads(tmp_path: Path):
    plain_path = tmp_path / "plain.tfrecord"
    rows = write_tfrecords(plain_path, 300)
    path = tmp_path / "data" / "train-0.tfrecord"  # TensorFlow GZIP files keep the extension
    path.parent.mkdir()
    path.write_bytes(gzip.compress(plain_path.read_bytes()))
    assert detect_format(str(path)) == "tfrecord"
    with TFRecordReader(str(path), index_file=tmp_path / "c.sqlite") as reader:
        assert len(reader) == 300
        for key, image, label in rows[::7]:
            assert reader.get_feature(key, "image") == image
            assert reader.get_feature(key, "label") == label
        assert [
            r.features.feature["key"].bytes_list.value[0]
            for r in reader.get_many(["rec_0299", "rec_0000"])
        ] == [b"rec_0299", b"rec_0000"]
        assert reader.where("label = 3")[:2] == ["rec_0003", "rec_0008"]
        assert reader.verify() == []
        with Catalog(tmp_path / "plain.sqlite") as other, other.ingest(plain_path, "p") as p:
            conn_a = reader.catalog.reader_connection()
            conn_b = other.store.reader_connection()
            query = 'SELECT key, "offset", length FROM shardcat_records_1 ORDER BY key'
            assert conn_a.execute(query).fetchall() == conn_b.execute(query).fetchall()
            assert len(p) == 300


def test_multi_member_gzip_tfrecord(tmp_path: Path):
    """Two gzip members back to back (``cat a.gz b.gz``): checked member by member."""
    a, b = tmp_path / "a.tfrecord", tmp_path / "b.tfrecord"
    rows = write_tfrecords(a, 10)
    with TFRecordWriter(b) as w:
        w.write(make_example({"key": "last", "image": b"x", "label": 1}))
    path = tmp_path / "ab.tfrecord.gz"
    path.write_bytes(gzip.compress(a.read_bytes()) + gzip.compress(b.read_bytes()))
    with Catalog(tmp_path / "c.sqlite") as cat, cat.ingest(path, "ab") as reader:
        assert reader.get_keys() == [r[0] for r in rows] + ["last"]
        assert reader.get_feature("last", "image") == b"x"
        assert reader.get_feature(rows[4][0], "image") == rows[4][1]


def test_gzip_tfrecord_truncated_inside_a_record(tmp_path: Path):
    plain_path = tmp_path / "p.tfrecord"
    write_tfrecords(plain_path, 20)
    raw = plain_path.read_bytes()
    path = tmp_path / "t.tfrecord"
    path.write_bytes(gzip.compress(raw)[:-30])
    with Catalog(tmp_path / "c.sqlite") as cat, pytest.raises(IngestError) as err:
        cat.ingest(path, "t")
    assert str(path) in str(err.value)


def test_missing_library_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    import builtins

    real_import = builtins.__import__

    def no_indexed_gzip(name: str, *args: object, **kwargs: object) -> object:
        if name == "indexed_gzip":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    path = tmp_path / "x.tar.gz"
    src = tmp_path / "x.tar"
    make_tar(src, n=2)
    compress(src, path, "gzip")
    monkeypatch.setattr(builtins, "__import__", no_indexed_gzip)
    monkeypatch.delitem(__import__("sys").modules, "indexed_gzip", raising=False)
    with pytest.raises(CatalogError, match=r"shardcat\[compressed\]"):
        compressed.IndexingStream(str(path), "gzip")
