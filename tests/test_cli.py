from __future__ import annotations

import csv
import io
import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardcat.cli import app
from shardcat.cli.skill import skill_text
from shardcat.facade.records import file_extension
from shardcat.formats.tfrecord import TFRecordWriter, make_example
from shardcat.sample import make_sample

runner = CliRunner()


def run(*args: str, ok: bool = True):
    result = runner.invoke(app, [str(a) for a in args])
    if ok:
        assert result.exit_code == 0, result.output + str(result.exception)
    return result


@pytest.fixture
def ingested(tmp_path: Path) -> Path:
    make_sample(tmp_path / "train", shards=3, records=300, image_bytes=64)
    catalog = tmp_path / "cat.sqlite"
    run("ingest", str(tmp_path / "train" / "*.tfrecord"), "-d", "train", "-c", catalog, "-w", "1")
    return catalog


def _command_name(command) -> str:
    return command.name or command.callback.__name__.replace("_", "-")


def test_every_command_has_help_text():
    names = [_command_name(c) for c in app.registered_commands]
    assert set(names) >= {
        "ingest",
        "datasets",
        "stats",
        "list",
        "get",
        "extract",
        "query",
        "verify",
        "install-skill",
        "drop",
        "sample",
    }
    for name in names:
        result = run(name, "--help")
        assert "Usage:" in result.output
        command = next(c for c in app.registered_commands if _command_name(c) == name)
        assert command.callback.__doc__, f"{name} has no help text"
        first_line = command.callback.__doc__.strip().splitlines()[0]
        assert first_line[:30] in " ".join(result.output.split())


def test_ingest_reports_counts_and_reingest_reads_nothing(tmp_path: Path, ingested: Path):
    result = run("ingest", str(tmp_path / "train" / "*.tfrecord"), "-d", "train", "-c", ingested)
    assert "300 records in 3 shards (0 indexed now)" in result.output


def test_ingest_default_catalog_in_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    make_sample(tmp_path / "d", shards=1, records=5, image_bytes=8)
    monkeypatch.chdir(tmp_path)
    result = run("ingest", str(tmp_path / "d"), "-w", "1")
    assert (tmp_path / "shardcat.sqlite").is_file()
    assert not (tmp_path / "d" / "shardcat.sqlite").exists()
    assert "dataset train: 5 records in 1 shards" in result.output


def test_ingest_env_var_names_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    make_sample(tmp_path / "d", shards=1, records=5, image_bytes=8)
    monkeypatch.setenv("SHARDCAT_CATALOG", str(tmp_path / "env.sqlite"))
    run("ingest", str(tmp_path / "d"), "-d", "viaenv")
    assert (tmp_path / "env.sqlite").is_file()
    assert "viaenv" in run("datasets").output


def test_datasets_table_and_json(ingested: Path):
    assert "train" in run("datasets", "-c", ingested).output
    data = json.loads(run("datasets", "-c", ingested, "--json").output)
    assert [(d["name"], d["records"], d["shards"]) for d in data] == [("train", 300, 3)]
    assert data[0]["fields"] == {"label": "integer", "score": "real", "caption": "text"} or set(
        data[0]["fields"]
    ) == {"label", "score", "caption"}


def test_stats_json(ingested: Path):
    stats = json.loads(run("stats", "train", "-c", ingested, "--json").output)
    assert stats["total_records"] == 300
    assert sorted(stats["records_per_file"].values()) == [100, 100, 100]


def test_list_shows_features_and_types(ingested: Path):
    data = json.loads(run("list", "train", "-c", ingested, "--json").output)
    assert data["first_key"] == "rec_000000000"
    assert data["features"] == {
        "caption": "bytes",
        "image": "bytes",
        "key": "bytes",
        "label": "int64",
        "score": "float",
    }
    assert "first record: rec_000000000" in run("list", "train", "-c", ingested).output


def test_query_table_json_csv_params(ingested: Path, tmp_path: Path):
    with sqlite3.connect(ingested) as conn:
        expected = conn.execute("SELECT count(*) FROM train WHERE label = 3").fetchone()[0]
    assert expected > 0
    rows = json.loads(
        run(
            "query",
            "SELECT count(*) AS n FROM train WHERE label = ?",
            "-p",
            "3",
            "-c",
            ingested,
            "--json",
        ).output
    )
    assert rows == [{"n": expected}]
    out = run(
        "query", "SELECT key, label FROM train ORDER BY position LIMIT 2", "-c", ingested, "--csv"
    ).output
    parsed = list(csv.reader(io.StringIO(out)))
    assert parsed[0] == ["key", "label"]
    assert [r[0] for r in parsed[1:]] == ["rec_000000000", "rec_000000001"]
    table = run("query", "SELECT key FROM train ORDER BY position LIMIT 1", "-c", ingested)
    assert "rec_000000000" in table.output


def test_query_refuses_writes(ingested: Path):
    result = run("query", "DELETE FROM shardcat_records_1", "-c", ingested, ok=False)
    assert result.exit_code == 1
    assert "error: " in result.output and "read-only" in result.output
    assert "Traceback" not in result.output
    with sqlite3.connect(ingested) as conn:
        assert conn.execute("SELECT count(*) FROM shardcat_records_1").fetchone()[0] == 300


def test_get_writes_exact_bytes(ingested: Path, tmp_path: Path):
    from shardcat import Catalog

    with Catalog(ingested) as cat, cat.dataset("train") as reader:
        image = reader.get_feature("rec_000000042", "image")
        label = reader.get_feature("rec_000000042", "label")
    result = run("get", "train", "rec_000000042", "image", "-c", ingested)
    assert result.stdout_bytes == image
    out = tmp_path / "x.jpg"
    run("get", "train", "rec_000000042", "image", "-c", ingested, "-o", out)
    assert out.read_bytes() == image
    assert run("get", "train", "rec_000000042", "label", "-c", ingested).output.strip() == str(
        label
    )


def test_get_errors_are_one_line(ingested: Path):
    missing = run("get", "train", "nope", "image", "-c", ingested, ok=False)
    assert missing.exit_code == 1
    assert missing.output.strip() == "error: key 'nope' not in dataset 'train'"
    nofeat = run("get", "train", "rec_000000001", "mask", "-c", ingested, ok=False)
    assert "has no feature 'mask'" in nofeat.output and "image" in nofeat.output
    nods = run("get", "other", "k", "f", "-c", ingested, ok=False)
    assert "no dataset 'other'" in nods.output and "train" in nods.output
    bad_index = run(
        "get", "train", "rec_000000001", "image", "--index", "3", "-c", ingested, ok=False
    )
    assert "out of range" in bad_index.output


def test_missing_catalog_is_a_clear_error(tmp_path: Path):
    result = run("datasets", "-c", tmp_path / "none.sqlite", ok=False)
    assert result.exit_code == 1
    assert "no catalog at" in result.output and "catalog ingest" in result.output


def test_extract_saves_images_with_extension(ingested: Path, tmp_path: Path):
    out = tmp_path / "out"
    result = run("extract", "train", "rec_000000007", "-c", ingested, "-o", out)
    files = sorted(p.name for p in out.iterdir())
    assert files == [
        "rec_000000007_caption_0.txt",
        "rec_000000007_image_0.jpg",
        "rec_000000007_key_0.txt",
    ]
    assert (out / files[1]).read_bytes().startswith(b"\xff\xd8\xff")
    assert f"caption[0] (text): sample 7 -> {out / files[0]}" in result.output
    assert (out / files[0]).read_bytes() == b"sample 7"
    assert "label: [" in result.output


def test_verify_reports_each_bad_record(tmp_path: Path):
    # records mid-file (beyond the fingerprint's first and last 64 KiB), damaged in
    # place with size and mtime put back: only their CRCs tell
    shard = tmp_path / "s" / "a.tfrecord"
    shard.parent.mkdir()
    offsets = []
    with TFRecordWriter(shard) as w:
        for i in range(40):
            offsets.append(w.write(make_example({"key": f"k{i}", "data": b"x" * 8000})))
    catalog = tmp_path / "c.sqlite"
    run("ingest", shard, "-d", "s", "-c", catalog)
    assert "0 bad" in run("verify", "s", "-c", catalog).output
    data = bytearray(shard.read_bytes())
    stat = shard.stat()
    for i in (20, 22):
        data[offsets[i] + 20] ^= 0xFF
    shard.write_bytes(bytes(data))
    import os

    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    result = run("verify", "s", "-c", catalog, ok=False)
    assert result.exit_code == 1
    # each named by its key, looked up in the catalog (issue 27)
    assert f"{shard}: at byte {offsets[20]} (key 'k20'): data CRC mismatch" in result.output
    assert f"{shard}: at byte {offsets[22]} (key 'k22'): data CRC mismatch" in result.output
    problems = json.loads(run("verify", "s", "-c", catalog, "--json", ok=False).stdout)
    assert [(p["offset"], p["key"]) for p in problems] == [
        (offsets[20], "k20"),
        (offsets[22], "k22"),
    ]


def test_ingest_corrupt_shard_fails_but_keeps_others(tmp_path: Path):
    make_sample(tmp_path / "d", shards=2, records=20, image_bytes=16)
    bad = sorted((tmp_path / "d").iterdir())[1]
    bad.write_bytes(bad.read_bytes()[:-3])
    catalog = tmp_path / "c.sqlite"
    result = run("ingest", tmp_path / "d", "-d", "t", "-c", catalog, ok=False)
    assert result.exit_code == 1
    assert f"failed: {bad}: at byte" in result.output
    assert "1 shard(s) failed; the other shards are in the catalog" in result.output
    assert json.loads(run("stats", "t", "-c", catalog, "--json").output)["total_records"] == 10


def test_ingest_bad_options(tmp_path: Path):
    assert "no files match" in run("ingest", tmp_path / "*.nope", ok=False).output
    make_sample(tmp_path / "d", shards=1, records=2, image_bytes=8)
    out = run("ingest", tmp_path / "d", "-d", "1bad", "-c", tmp_path / "c.sqlite", ok=False)
    assert "invalid dataset name '1bad'" in out.output
    out = run("ingest", tmp_path / "d", "--format", "zip", "-c", tmp_path / "c.sqlite", ok=False)
    assert "unknown format 'zip'" in out.output


def test_by_position_and_custom_key(tmp_path: Path):
    shard = tmp_path / "a.tfrecord"
    with TFRecordWriter(shard) as w:
        for i in range(4):
            w.write(make_example({"id": 100 + i, "v": f"value{i}"}))
    catalog = tmp_path / "c.sqlite"
    run("ingest", shard, "-d", "byid", "-k", "id", "-c", catalog)
    run("ingest", shard, "-d", "bypos", "--by-position", "-c", catalog)
    assert run("get", "byid", "102", "v", "-c", catalog).stdout_bytes == b"value2"
    assert run("get", "bypos", "3", "v", "-c", catalog).stdout_bytes == b"value3"


def test_drop_and_sample(tmp_path: Path, ingested: Path):
    run("drop", "train", "-c", ingested)
    assert "no datasets yet" in run("datasets", "-c", ingested).output
    out = run("sample", tmp_path / "smp", "--shards", "2", "--records", "6").stdout
    assert len(out.split()) == 2
    assert "at least 1" in run("sample", tmp_path / "x", "--shards", "0", ok=False).output


def test_install_skill_is_versioned(tmp_path: Path):
    from shardcat import __version__

    run("install-skill", "--dest", tmp_path / "skill")
    text = (tmp_path / "skill" / "SKILL.md").read_text()
    assert text == skill_text()
    assert f"shardcat {__version__}" in text and "{{VERSION}}" not in text


def test_debug_env_shows_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SHARDCAT_DEBUG", "1")
    result = runner.invoke(app, ["datasets", "-c", str(tmp_path / "none.sqlite")])
    assert result.exit_code == 1
    assert "Traceback" in result.output


@pytest.mark.parametrize(
    ("data", "ext"),
    [
        (b"\xff\xd8\xff\xe0rest", "jpg"),
        (b"\x89PNG\r\n\x1a\nrest", "png"),
        (b"GIF89a...", "gif"),
        (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "webp"),
        (b'{"a": 1}', "json"),
        (b"hello", "txt"),
        (b"\x00\x01\xfe\xff", "bin"),
    ],
)
def test_file_extension(data: bytes, ext: str):
    assert file_extension(data) == ext


def test_reingest_keeps_the_options_the_dataset_was_ingested_with(tmp_path: Path):
    shard = tmp_path / "a.tfrecord"
    with TFRecordWriter(shard) as w:
        for i in range(3):
            w.write(make_example({"id": i, "label": i}))
    catalog = tmp_path / "c.sqlite"
    run("ingest", shard, "-d", "ids", "-k", "id", "--no-fields", "-c", catalog)
    with TFRecordWriter(tmp_path / "b.tfrecord") as w:
        w.write(make_example({"id": 7, "label": 7}))
    result = run("ingest", str(tmp_path / "*.tfrecord"), "-d", "ids", "-c", catalog)
    assert "4 records in 2 shards (1 indexed now)" in result.output
    info = json.loads(run("datasets", "-c", catalog, "--json").output)[0]
    assert info["key_rule"] == "feature:id"
    assert info["options"]["fields"] is False
    assert info["fields"] == {}
    assert run("get", "ids", "7", "label", "-c", catalog).output.strip() == "7"
    changed = run("ingest", shard, "-d", "ids", "-k", "label", "-c", catalog, ok=False)
    assert "keyed by feature:id, not tfrecord keyed by feature:label" in changed.output


def test_ingest_says_how_many_records_on_duplicate_dropped(tmp_path: Path):
    shard = tmp_path / "d.tfrecord"
    with TFRecordWriter(shard) as w:
        for key in ("a", "b", "a", "c", "a"):
            w.write(make_example({"key": key}))
    catalog = tmp_path / "c.sqlite"
    result = run("ingest", shard, "-d", "d", "-c", catalog, "--on-duplicate", "last")
    assert "dataset d: 3 records in 1 shards" in result.stdout
    assert "2 records with duplicate keys dropped (--on-duplicate last)" in result.stderr
    unique = tmp_path / "u.tfrecord"
    with TFRecordWriter(unique) as w:
        w.write(make_example({"key": "z"}))
    result = run("ingest", unique, "-d", "u", "-c", catalog, "--on-duplicate", "last")
    assert "dropped" not in result.stderr  # nothing dropped: nothing said
