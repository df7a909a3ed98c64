"""Bad records set aside, not their shard (issue 27, finding 2): ``on_bad_record="skip"``
indexes every good record of a damaged TFRecord, tar or RecordIO shard (the scan
resynchronises after damaged framing), lists each bad one in the catalog, and a good
re-ingest clears them; the default still fails the shard, naming the option. Every
test runs with the native scanner and with the pure-Python reference scan."""

from __future__ import annotations

import gzip
import io
import json
import os
import sqlite3
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardcat import Catalog, make_example
from shardcat.catalog import versions
from shardcat.catalog.bad_records import SetAside
from shardcat.cli import app
from shardcat.errors import CatalogError, IngestError, SchemaVersionError
from shardcat.formats import native
from shardcat.formats.recordio import RecordIOWriter
from shardcat.formats.tfrecord import FRAME, HEADER, TFRecordWriter
from shardcat.migrations import schema as schema_steps
from shardcat.readers.sampler import RecordSampler
from tests.damage import flip_keeping_mtime

runner = CliRunner()
SKIP_HINT = "(on_bad_record='skip' indexes the other records)"


@pytest.fixture(params=["native", "reference"])
def scanner(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "native" and not native.available():
        if os.environ.get("CI") == "true":
            raise RuntimeError("CI must build the native scanner")
        pytest.skip("the native scanner is not built")
    monkeypatch.setenv("SHARDCAT_NATIVE", "1" if request.param == "native" else "0")
    return str(request.param)


# -- TFRecord --------------------------------------------------------------------------


def write_tfrecord(path: Path, n: int, size: int = 50) -> dict[str, tuple[int, bytes]]:
    """Records r0.. (an image of ``size`` bytes each); key -> (frame offset, payload)."""
    truth = {}
    with TFRecordWriter(path) as w:
        for i in range(n):
            payload = make_example(
                {"key": f"r{i}", "label": i, "image": bytes([i % 251]) * size}
            ).SerializeToString()
            truth[f"r{i}"] = (w.write(payload), payload)
    return truth


def assert_exact(cat: Catalog, dataset: str, truth: dict[str, bytes]) -> None:
    """The dataset holds exactly ``truth``'s keys, each with its bytes, and a sampler
    over it reaches exactly those records."""
    with cat.dataset(dataset) as reader:
        assert sorted(reader.get_keys()) == sorted(truth)
        for key, payload in truth.items():
            assert reader.get_raw(key) == payload
        positions = list(RecordSampler(reader, num_replicas=1, rank=0))
        assert sorted(positions) == list(range(len(truth)))
        assert sorted(reader.key_at(p) for p in positions) == sorted(truth)


def test_tfrecord_bad_data_crc_and_bad_length(tmp_path: Path, scanner: str):
    path = tmp_path / "a.tfrecord"
    truth = write_tfrecord(path, 20)
    off5, payload5 = truth["r5"]
    off12, payload12 = truth["r12"]
    # a flipped payload byte (inside the image): the frame is intact, its data CRC is not
    flip_keeping_mtime(path, off5 + HEADER + payload5.index(bytes([5]) * 50) + 20)
    flip_keeping_mtime(path, off12 + 1)  # a flipped length byte: the length CRC fails
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(path, "d", on_bad_record="skip", workers=1).close()
        good = {k: p for k, (_, p) in truth.items() if k not in ("r5", "r12")}
        assert_exact(cat, "d", good)
        assert cat.bad_records("d") == [
            SetAside(str(path), off5, FRAME + len(payload5), "data CRC mismatch", "r5"),
            SetAside(str(path), off12, FRAME + len(payload12), "length CRC mismatch", None),
        ]
        with cat.dataset("d") as reader:
            stats = reader.get_stats()
        assert (stats["total_records"], stats["bad_records"]) == (18, 2)
        assert stats["bad_records_per_file"] == {"a.tfrecord": 2}


def test_tfrecord_damage_at_the_end_and_at_the_start(tmp_path: Path, scanner: str):
    path = tmp_path / "a.tfrecord"
    truth = write_tfrecord(path, 6)
    size = path.stat().st_size
    payload0 = truth["r0"][1]
    off5, _ = truth["r5"]
    flip_keeping_mtime(path, 9)  # the first frame's length CRC
    with open(path, "r+b") as f:
        f.truncate(size - 10)  # the last frame cut short
    with Catalog(tmp_path / "c.sqlite") as cat:
        # (not detected from a first frame that is damaged: named)
        cat.ingest(path, "d", format="tfrecord", on_bad_record="skip", workers=1).close()
        assert_exact(cat, "d", {k: truth[k][1] for k in ("r1", "r2", "r3", "r4")})
        assert [(b.offset, b.length, b.key) for b in cat.bad_records("d")] == [
            (0, FRAME + len(payload0), None),
            (off5, size - 10 - off5, None),
        ]
        assert cat.bad_records("d")[1].reason.startswith("truncated record")


def test_default_raises_naming_the_option_and_keeps_the_other_shards(tmp_path: Path):
    good = tmp_path / "a.tfrecord"
    truth = write_tfrecord(good, 5)
    bad = tmp_path / "b.tfrecord"
    write_tfrecord(bad, 5)
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(tmp_path / "a.tfrecord", "d", workers=1).close()
        flip_keeping_mtime(bad, HEADER + 30)
        with pytest.raises(IngestError) as err:
            cat.ingest(tmp_path / "*.tfrecord", "d", workers=1)
        assert str(err.value) == f"{bad}: at byte 0: data CRC mismatch {SKIP_HINT}"
        assert_exact(cat, "d", {k: p for k, (_, p) in truth.items()})
        assert cat.bad_records("d") == []
        with pytest.raises(CatalogError, match="on_bad_record must be one of raise, skip"):
            cat.ingest(good, "d", on_bad_record="ignore")


def test_a_good_reingest_clears_them(tmp_path: Path, scanner: str):
    path = tmp_path / "a.tfrecord"
    truth = write_tfrecord(path, 8)
    pristine = path.read_bytes()
    flip_keeping_mtime(path, truth["r3"][0] + 2)
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(path, "d", on_bad_record="skip", workers=1).close()
        assert [b.offset for b in cat.bad_records("d")] == [truth["r3"][0]]
        path.write_bytes(pristine)  # repaired (a new mtime)
        cat.ingest(path, "d", workers=1).close()
        assert cat.bad_records("d") == []
        assert_exact(cat, "d", {k: p for k, (_, p) in truth.items()})


# -- tar -------------------------------------------------------------------------------


def write_tar(path: Path, n: int) -> tuple[dict[str, dict[str, bytes]], dict[str, int]]:
    """Samples s0.. of jpg, cls and json members; the samples and each member's
    header offset."""
    samples: dict[str, dict[str, bytes]] = {}
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for i in range(n):
            sample = {
                "jpg": bytes([i]) * (700 + i),
                "cls": str(i).encode(),
                "json": json.dumps({"i": i}).encode(),
            }
            samples[f"s{i}"] = sample
            for ext, data in sample.items():
                info = tarfile.TarInfo(f"s{i}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    with tarfile.open(path) as tf:
        heads = {m.name: m.offset for m in tf.getmembers()}
    return samples, heads


@pytest.mark.parametrize("grouping", ["webdataset", "tfd"])
def test_tar_broken_headers_mid_archive(tmp_path: Path, scanner: str, grouping: str):
    path = tmp_path / "a.tar"
    samples, heads = write_tar(path, 10)
    flip_keeping_mtime(path, heads["s7.json"] + 148, 0x01)  # its checksum: the name reads
    flip_keeping_mtime(path, heads["s4.cls"], 0x80)  # its name: no longer UTF-8
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(path, "d", grouping=grouping, on_bad_record="skip", workers=1).close()
        good = {k: v for k, v in samples.items() if k not in ("s4", "s7")}
        with cat.dataset("d") as reader:
            assert sorted(reader.get_keys()) == sorted(good)
            for key, sample in good.items():
                assert reader.get_record(key) == sample
            assert sorted(RecordSampler(reader, num_replicas=1, rank=0)) == list(range(8))
        why = "bad tar header checksum (corrupt header)"
        assert cat.bad_records("d") == [
            SetAside(str(path), heads["s4.cls"], heads["s4.json"] - heads["s4.cls"], why, "s4"),
            SetAside(str(path), heads["s7.json"], heads["s8.jpg"] - heads["s7.json"], why, "s7"),
        ]


def test_tar_last_member_broken(tmp_path: Path, scanner: str):
    path = tmp_path / "a.tar"
    samples, heads = write_tar(path, 3)
    flip_keeping_mtime(path, heads["s2.json"] + 150, 0x01)
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(path, "d", on_bad_record="skip", workers=1).close()
        with cat.dataset("d") as reader:
            assert sorted(reader.get_keys()) == ["s0", "s1"]
            assert reader.get_record("s1") == samples["s1"]
        (found,) = cat.bad_records("d")
        assert (found.offset, found.length, found.key) == (
            heads["s2.json"],
            path.stat().st_size - heads["s2.json"],
            "s2",
        )


# -- RecordIO --------------------------------------------------------------------------


def write_rec(path: Path, n: int, idx: bool = True) -> list[tuple[int, bytes]]:
    out = []
    with RecordIOWriter(path, "auto" if idx else None) as w:
        for i in range(n):
            payload = bytes([i + 1]) * (30 + i)
            out.append((w.write(payload), payload))
    return out


@pytest.mark.parametrize("idx", [True, False], ids=["idx-keys", "position-keys"])
def test_recordio_broken_magic(tmp_path: Path, scanner: str, idx: bool):
    path = tmp_path / "a.rec"
    records = write_rec(path, 12, idx)
    flip_keeping_mtime(path, records[4][0] + 1)  # the magic word of record 4
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(path, "d", on_bad_record="skip", workers=1, options={"header": False}).close()
        kept = [payload for i, (_, payload) in enumerate(records) if i != 4]
        with cat.dataset("d") as reader:
            assert len(reader) == 11
            assert [reader.get_record_at(p, raw=True) for p in range(11)] == kept
            if idx:
                assert reader.get_raw("5") == records[5][1]
                assert "4" not in reader
        (found,) = cat.bad_records("d")
        assert found == SetAside(
            str(path),
            records[4][0],
            records[5][0] - records[4][0],
            "bad RecordIO magic 0xced7dc0a, expected 0xced7230a",
            "4" if idx else None,
        )


# -- verify and stats ------------------------------------------------------------------


def test_verify_names_the_key_and_lists_the_set_aside_ones(tmp_path: Path, scanner: str):
    path = tmp_path / "a.tfrecord"
    truth = write_tfrecord(path, 200, size=2000)  # ~400 KiB: a flip mid-file keeps the fingerprint
    off3, payload3 = truth["r3"]
    flip_keeping_mtime(path, off3 + HEADER + payload3.index(bytes([3]) * 50))  # set aside
    db = tmp_path / "c.sqlite"
    with Catalog(db) as cat:
        cat.ingest(path, "d", on_bad_record="skip", workers=1).close()
    off, payload = truth["r100"]
    flip_keeping_mtime(path, off + HEADER + payload.index(bytes([100]) * 50))  # after ingest
    result = runner.invoke(app, ["verify", "d", "-c", str(db)])
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        f"{path}: at byte {off} (key 'r100'): data CRC mismatch",
        f"{path}: at byte {off3} (key 'r3'): set aside at ingest: data CRC mismatch",
    ]
    assert "199 records checked, 1 bad, 1 set aside at ingest" in result.stderr
    as_json = runner.invoke(app, ["verify", "d", "-c", str(db), "--json"])
    assert [
        (p["offset"], p["key"], p.get("set_aside", False)) for p in json.loads(as_json.stdout)
    ] == [
        (off, "r100", False),
        (off3, "r3", True),
    ]
    stats = runner.invoke(app, ["stats", "d", "-c", str(db)])
    assert stats.exit_code == 0, stats.output
    words = " ".join(stats.stdout.split())  # the table wraps its title
    assert "d: 199 records in 1 shards, 1 bad records set aside" in words
    assert "│ a.tfrecord │ 199 │ 1 │" in words
    stats_json = json.loads(runner.invoke(app, ["stats", "d", "-c", str(db), "--json"]).stdout)
    assert stats_json["bad_records_per_file"] == {"a.tfrecord": 1}


def test_cli_ingest_skip_and_the_default_error(tmp_path: Path):
    shards = tmp_path / "shards"
    shards.mkdir()
    truth = write_tfrecord(shards / "a.tfrecord", 4)
    flip_keeping_mtime(shards / "a.tfrecord", truth["r2"][0] + 3)
    db = tmp_path / "c.sqlite"
    failed = runner.invoke(app, ["ingest", str(shards), "-d", "d", "-c", str(db)])
    assert failed.exit_code == 1
    off = truth["r2"][0]
    assert (
        f"at byte {off}: length CRC mismatch (catalog ingest --on-bad-record skip indexes "
        "the other records)" in failed.output
    )
    ok = runner.invoke(
        app, ["ingest", str(shards), "-d", "d", "-c", str(db), "--on-bad-record", "skip"]
    )
    assert ok.exit_code == 0, ok.output
    assert "dataset d: 3 records in 1 shards" in ok.stdout
    assert "1 bad records set aside (catalog verify d lists them)" in ok.stderr
    wrong = runner.invoke(
        app, ["ingest", str(shards), "-d", "d", "-c", str(db), "--on-bad-record", "x"]
    )
    assert wrong.exit_code == 1
    assert "--on-bad-record must be one of raise, skip, not 'x'" in wrong.output


def test_a_compressed_shard_still_fails_in_skip_mode(tmp_path: Path):
    path = tmp_path / "a.tfrecord"
    truth = write_tfrecord(path, 4)
    flip_keeping_mtime(path, truth["r1"][0] + 3)
    packed = tmp_path / "b.tfrecord.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    path.unlink()
    with Catalog(tmp_path / "c.sqlite") as cat, pytest.raises(IngestError) as err:
        cat.ingest(packed, "d", on_bad_record="skip", workers=1)
    assert str(err.value) == f"{packed}: at byte {truth['r1'][0]}: length CRC mismatch"


def test_copied_shard_rows_and_snapshots_keep_their_bad_records(tmp_path: Path):
    path = tmp_path / "a.tfrecord"
    truth = write_tfrecord(path, 5)
    flip_keeping_mtime(path, truth["r1"][0] + 3)
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(path, "d", on_bad_record="skip", workers=1).close()
        cat.ingest(path, "e", on_bad_record="skip", workers=1).close()  # rows copied from d
        assert cat.bad_records("e") == cat.bad_records("d")
        assert [b.offset for b in cat.bad_records("e")] == [truth["r1"][0]]
        cat.snapshot("d", tmp_path / "snap.sqlite")
        expected = cat.bad_records("d")
    with Catalog(tmp_path / "snap.sqlite", immutable=True) as snap:
        assert snap.bad_records("d") == expected


# -- schema ----------------------------------------------------------------------------


def test_the_schema_step_adds_the_table_to_an_older_catalog(tmp_path: Path):
    """The step before which there was no bad-records table (whatever its number once
    the steps of parallel work are in order) adds it; the catalog then takes them."""
    step = next(n for n, f in schema_steps.STEPS.items() if f.__name__ == "_add_bad_records")
    path = tmp_path / "a.tfrecord"
    truth = write_tfrecord(path, 4)
    db = tmp_path / "c.sqlite"
    with Catalog(db) as cat:
        cat.ingest(path, "d", workers=1).close()
    with sqlite3.connect(db) as conn:
        fresh = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'shardcat_bad_records'"
        ).fetchone()
        conn.execute("DROP TABLE shardcat_bad_records")
        conn.execute("UPDATE shardcat_meta SET value = ? WHERE name = 'schema_version'", (step,))
    conn.close()
    with pytest.raises(SchemaVersionError, match="open it once without readonly=True"):
        Catalog(db, readonly=True)
    flip_keeping_mtime(path, truth["r2"][0] + 3)
    with Catalog(db) as cat:  # opening for writing upgrades
        assert cat.bad_records("d") == []
        cat.ingest(path, "d", on_bad_record="skip", workers=1, rescan=True).close()
        assert [b.key for b in cat.bad_records("d")] == [None]
    with sqlite3.connect(db) as conn:
        upgraded = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'shardcat_bad_records'"
        ).fetchone()
        version = conn.execute(
            "SELECT value FROM shardcat_meta WHERE name = 'schema_version'"
        ).fetchone()
    conn.close()
    assert upgraded == fresh
    assert version == (str(versions.SCHEMA_VERSION),)
