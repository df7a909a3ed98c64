"""``catalog convert``: tar archives -> TFRecords, tfd-utils ``tfd convert`` parity,
--delete only after a verified write."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardcat import Catalog, CorruptRecordError
from shardcat import convert as conv
from shardcat.cli import app
from shardcat.formats import tfrecord
from shardcat.formats.tfrecord import TFRecordFormat
from shardcat.pb2 import Example
from shardcat.testing.required import need

runner = CliRunner()


def make_tar(path: Path, start: int, n: int = 5) -> dict[str, dict[str, bytes]]:
    samples = {}
    with tarfile.open(path, "w") as tf:
        for i in range(start, start + n):
            key = f"sub/s{i:03d}"
            feats = {"jpg": bytes([i % 256]) * (100 + i), "cls": str(i % 3).encode()}
            for ext, data in feats.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            samples[key] = feats
    return samples


def examples(path: Path) -> dict[str, dict[str, bytes]]:
    out = {}
    for entry in TFRecordFormat().scan(str(path), {"key": "key", "fields": False}):
        with open(path, "rb") as f:
            f.seek(entry.offset + tfrecord.HEADER)
            ex = Example.FromString(f.read(entry.length))
        feats = {k: v.bytes_list.value[0] for k, v in ex.features.feature.items()}
        assert feats.pop("key") == str(entry.key).encode()
        out[str(entry.key)] = feats
    return out


@pytest.fixture
def tars(tmp_path: Path) -> tuple[Path, dict[str, dict[str, dict[str, bytes]]]]:
    src = tmp_path / "src"
    src.mkdir()
    expected = {}
    for i in range(3):
        expected[f"part-{i}"] = make_tar(src / f"part-{i}.tar", i * 10)
    (src / "notes.txt").write_text("not an archive")
    return src, expected


def test_convert_directory_with_delete(tmp_path: Path, tars):
    src, expected = tars
    out = tmp_path / "out"
    result = runner.invoke(app, ["convert", str(src), "-o", str(out), "--delete", "-w", "2"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [f"part-{i}.tfrecord" for i in range(3)]
    assert sorted(p.name for p in src.iterdir()) == ["notes.txt"]  # sources deleted
    for stem, samples in expected.items():
        assert examples(out / f"{stem}.tfrecord") == samples
    assert "converted 3 archive(s), 15 records; deleted 3 source(s)" in result.output
    with Catalog(tmp_path / "c.sqlite") as cat, cat.ingest(str(out / "*.tfrecord"), "t") as r:
        assert len(r) == 15
        assert r.get_feature("sub/s021", "jpg") == bytes([21]) * 121
        assert cat.query("SELECT count(*) FROM t WHERE cls = '1'") == [(5,)]


def test_convert_glob_json_beside_sources_keeps_them(tmp_path: Path, tars):
    src, _ = tars
    result = runner.invoke(app, ["convert", str(src / "part-[01].tar"), "--json", "-w", "1"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(Path(r["output"]).name, r["records"], r["deleted"]) for r in rows] == [
        ("part-0.tfrecord", 5, False),
        ("part-1.tfrecord", 5, False),
    ]
    assert (src / "part-0.tar").exists() and not (src / "part-2.tfrecord").exists()


def test_failed_conversion_keeps_the_source(tmp_path: Path, tars):
    src, _ = tars
    bad = src / "part-1.tar"
    bad.write_bytes(bad.read_bytes()[:700])  # truncated inside the first member
    out = tmp_path / "out"
    result = runner.invoke(app, ["convert", str(src / "*.tar"), "-o", str(out), "-d", "-w", "1"])
    assert result.exit_code == 1
    assert "failed:" in result.output and "truncated member 'sub/s010.jpg'" in result.output
    assert "1 of 3 archive(s) failed; their sources are kept" in result.output
    assert bad.exists()
    assert not (src / "part-0.tar").exists() and not (src / "part-2.tar").exists()
    assert sorted(p.name for p in out.iterdir()) == ["part-0.tfrecord", "part-2.tfrecord"]


def test_delete_waits_for_verification(tmp_path: Path, tars, monkeypatch: pytest.MonkeyPatch):
    src, _ = tars

    def fails(path: str, written: object) -> None:
        raise CorruptRecordError(path, 0, "read back differs")

    monkeypatch.setattr(conv, "_check_written", fails)
    results = conv.convert_tars([str(src / "part-0.tar")], tmp_path / "o", delete=True)
    assert [(r.records, r.deleted) for r in results] == [(0, False)]
    assert results[0].error is not None and "read back differs" in results[0].error
    assert (src / "part-0.tar").exists()
    assert list((tmp_path / "o").iterdir()) == []  # no partial file left


def test_check_written_compares_keys_and_lengths(tmp_path: Path):
    path = tmp_path / "x.tfrecord"
    with tfrecord.TFRecordWriter(path) as w:
        payload = tfrecord.make_example({"key": "a"}).SerializeToString()
        w.write(payload)
    conv._check_written(str(path), [("a", len(payload))])
    with pytest.raises(CorruptRecordError, match="differ from record 0"):
        conv._check_written(str(path), [("b", len(payload))])
    with pytest.raises(CorruptRecordError, match="read back 1 records, wrote 2"):
        conv._check_written(str(path), [("a", len(payload)), ("c", 1)])


def test_compressed_archives_and_names(tmp_path: Path):
    src = tmp_path / "a.tar"
    samples = make_tar(src, 0, 3)
    gz = tmp_path / "b.tar.gz"
    gz.write_bytes(gzip.compress(src.read_bytes()))
    assert conv.output_path(str(gz)) == str(tmp_path / "b.tfrecord")
    assert conv.output_path(str(tmp_path / "c.tgz"), "o") == "o/c.tfrecord"
    assert conv.tar_inputs(str(tmp_path)) == [str(src), str(gz)]
    (result,) = conv.convert_tars([str(gz)])
    assert result.error is None and result.records == 3
    assert examples(tmp_path / "b.tfrecord") == samples


def test_duplicate_stems_and_key_members_are_errors(tmp_path: Path):
    path = tmp_path / "d.tar"
    with tarfile.open(path, "w") as tf:
        for name in ("a.jpg", "b.jpg", "a.cls"):
            info = tarfile.TarInfo(name)
            tf.addfile(info, io.BytesIO(b""))
    (result,) = conv.convert_tars([str(path)])
    assert result.error is not None and "key 'a' comes back" in result.error
    assert not (tmp_path / "d.tfrecord").exists()
    keyed = tmp_path / "k.tar"
    with tarfile.open(keyed, "w") as tf:
        tf.addfile(tarfile.TarInfo("a.key"), io.BytesIO(b""))
    (result,) = conv.convert_tars([str(keyed)])
    assert result.error is not None and "feature 'key'" in result.error


def test_parity_with_tfd_convert(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    converter = need("tfd_utils.tar_converter", why="shardcat[bench]")
    src = tmp_path / "p.tar"
    make_tar(src, 0, 6)
    theirs = tmp_path / "theirs.tfrecord"
    converter.convert_tar_to_tfrecord(str(src), str(theirs))
    (result,) = conv.convert_tars([str(src)], tmp_path / "ours")
    assert result.error is None
    assert examples(tmp_path / "ours" / "p.tfrecord") == examples(theirs)
    capsys.readouterr()


def test_no_archives_is_an_error(tmp_path: Path):
    result = runner.invoke(app, ["convert", str(tmp_path / "*.tar")])
    assert result.exit_code == 1
    assert "no tar archives found" in result.output
