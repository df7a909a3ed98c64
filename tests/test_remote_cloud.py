"""``gs://`` and ``az://`` shards against real emulators on loopback, started and
stopped here: gcp-storage-emulator (reached by gcsfs) and Azurite (reached by
adlfs; ``make`` installs it into ``.node/``). Reads equal the local bytes, a
record is one ranged request (plus, on the GCS emulator, one metadata request:
it names no generation in its answers), batches are coalesced, a changed object
(same size, other bytes) is a StaleShardError and a deleted one a
MissingShardError naming the URL, forked readers open their own clients, and
secrets are never stored."""

from __future__ import annotations

import os
import random
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardcat.testing.required import missing, need

# before gcsfs is imported: its bucket-type probe speaks gRPC, which the emulator has not
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from shardcat import Catalog, MissingShardError, StaleShardError
from shardcat.catalog.processes import START_METHOD_ENV
from shardcat.sources import remote
from shardcat.testing.servers import AzuriteServer, GCSServer, azurite_binary

adlfs, _, gcsfs = (
    need(name, why="shardcat[remote,dev] (gcsfs, adlfs, gcp-storage-emulator)")
    for name in ("adlfs", "gcp_storage_emulator", "gcsfs")
)

from remote_shards import forked_reads_equal, small_shard, write_shards  # noqa: E402 - after the extras are checked

BUCKET = "shards"
SHARDS, RECORDS, PAYLOAD = 4, 500, 4000  # four ~2 MB TFRecord shards


def _keys(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"r{rng.randrange(SHARDS)}_{rng.randrange(RECORDS)}" for _ in range(n)]


def _range_length(header: str | None) -> int:
    m = re.fullmatch(r"bytes=(\d+)-(\d+)", header or "")
    assert m is not None, header
    return int(m.group(2)) - int(m.group(1)) + 1


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("local")
    write_shards(root, shards=SHARDS, records=RECORDS, payload=PAYLOAD, seed=5)
    return root


# -- GCS ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gcs(local: Path) -> Iterator[dict[str, Any]]:
    server = GCSServer(BUCKET)
    server.start()
    options = {"endpoint_url": server.endpoint, "token": "anon"}
    fs = gcsfs.GCSFileSystem(skip_instance_cache=True, **options)
    for path in sorted(local.iterdir()):
        fs.put_file(str(path), f"{BUCKET}/train/{path.name}")
    try:
        yield {"server": server, "fs": fs, "options": options}
    finally:
        server.stop()


@pytest.fixture(scope="module")
def gcs_catalog_file(gcs: dict[str, Any], local: Path, tmp_path_factory: Any) -> Path:
    path = tmp_path_factory.mktemp("gcat") / "train.sqlite"
    with Catalog(path) as cat:
        cat.ingest(
            f"gs://{BUCKET}/train/*.tfrecord", "train", storage_options=gcs["options"], workers=2
        ).close()
        cat.ingest(str(local), "local").close()
    return path


def _media(counter: Any) -> list[tuple[str, str, str | None]]:
    return [r for r in counter.gets() if r[1].startswith("/download/")]


def test_gcs_ingest_reads_back_identical_to_the_local_copy(
    gcs: dict[str, Any], gcs_catalog_file: Path, catalogs: Any
) -> None:
    cat = catalogs(gcs_catalog_file)
    train, here = cat.dataset("train"), cat.dataset("local")
    assert len(train) == len(here) == SHARDS * RECORDS
    keys = _keys(200, seed=3)
    assert train.get_many(keys, raw=True) == here.get_many(keys, raw=True)
    rows = cat.query("SELECT path, fingerprint FROM shardcat_shards WHERE path LIKE 'gs://%'")
    generation = gcs["fs"].info(f"{BUCKET}/train/train-00000.tfrecord")["generation"]
    assert (f"gs://{BUCKET}/train/train-00000.tfrecord", f"version:{generation}") in rows
    assert cat.info("train").options["storage_options"] == {
        "endpoint_url": gcs["options"]["endpoint_url"]
    }  # the token is not stored


@pytest.mark.parametrize("start", ["fork", "forkserver"])
def test_gcs_ingest_downloads_each_shard_once_and_the_first_record(
    gcs: dict[str, Any], local: Path, tmp_path: Path, start: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four shards, as on GCS (downloads name their generation): one listing and
    five downloads, each object streamed once whole and the rule (format, options)
    read off the first shard's first 64 KiB. The fifth download was its first
    4 MiB (all 2 MB of it: the shard downloaded twice), and a re-ingest of
    unchanged shards read that again. The emulator names no generation: each
    download is then followed by one metadata request asking it."""
    monkeypatch.setenv(START_METHOD_ENV, start)  # workers forked, or from a fork server
    server = gcs["server"]
    size = (local / "train-00000.tfrecord").stat().st_size
    url = f"gs://{BUCKET}/train/*.tfrecord"
    server.name_generation = True
    try:
        with Catalog(tmp_path / "n.sqlite") as cat:
            server.counter.reset()
            with cat.ingest(url, "t", storage_options=gcs["options"]) as made:
                assert len(made) == SHARDS * RECORDS
            media = _media(server.counter)
            shard = f"/download/storage/v1/b/{BUCKET}/o/train%2Ftrain-{{:05d}}.tfrecord"
            assert sorted((r[1].split("?")[0], r[2]) for r in media) == sorted(
                [(shard.format(s), f"bytes=0-{size - 1}") for s in range(SHARDS)]
                + [(shard.format(0), f"bytes=0-{(64 << 10) - 1}")]
            )
            assert len(server.counter.requests) == 1 + SHARDS + 1  # and the listing
            assert "?delimiter=" in server.counter.requests[0][1]
            server.counter.reset()
            cat.ingest(url, "t", storage_options=gcs["options"]).close()
            # unchanged: the listing and the rule's head, nothing per object
            assert [r[2] for r in server.counter.requests] == [None, f"bytes=0-{(64 << 10) - 1}"]
    finally:
        server.name_generation = False


def test_gcs_one_record_is_one_conditional_ranged_request(
    gcs: dict[str, Any], gcs_catalog_file: Path, catalogs: Any
) -> None:
    cat = catalogs(gcs_catalog_file)
    reader = cat.dataset("train")
    record = len(reader.get_raw("r2_123"))  # opens the source
    ((fingerprint,),) = cat.query(
        f"SELECT fingerprint FROM shardcat_shards WHERE path = 'gs://{BUCKET}/train/train-00002.tfrecord'"
    )
    generation = fingerprint.removeprefix("version:")
    counter = gcs["server"].counter
    counter.reset()
    assert reader.get_feature("r2_123", "image") == cat.dataset("local").get_feature(
        "r2_123", "image"
    )
    media = _media(counter)
    assert len(media) == 1
    assert record <= _range_length(media[0][2]) <= record + 16  # never a readahead
    assert f"ifGenerationMatch={generation}" in media[0][1]
    # the emulator names no generation in its answer (GCS sends x-goog-generation):
    # the read is proven by one metadata request, and nothing else is asked
    assert len(counter.requests) == 2


def test_gcs_generation_named_in_the_answer_makes_a_record_one_request(
    gcs: dict[str, Any], gcs_catalog_file: Path, catalogs: Any
) -> None:
    """As on GCS, whose downloads name the generation served (x-goog-generation)."""
    cat = catalogs(gcs_catalog_file)
    reader = cat.dataset("train")
    reader.get_raw("r3_9")
    server = gcs["server"]
    server.counter.reset()
    server.name_generation = True
    try:
        assert reader.get_raw("r3_10") == cat.dataset("local").get_raw("r3_10")
    finally:
        server.name_generation = False
    assert len(server.counter.requests) == len(_media(server.counter)) == 1


def test_gcs_get_many_coalesces_1000_random_records(
    gcs: dict[str, Any], gcs_catalog_file: Path, catalogs: Any
) -> None:
    cat = catalogs(gcs_catalog_file)
    reader = cat.dataset("train")
    keys = _keys(1000, seed=11)
    reader.get_raw(keys[0])
    counter = gcs["server"].counter
    counter.reset()
    assert reader.get_many(keys, raw=True) == cat.dataset("local").get_many(keys, raw=True)
    assert 1 <= len(_media(counter)) <= 12  # four 2 MB shards: about a request per MiB
    assert len(counter.requests) <= 2 * len(_media(counter))


def test_gcs_changed_and_deleted_objects_are_errors_naming_the_url(
    gcs: dict[str, Any], catalogs: Any, tmp_path: Path
) -> None:
    fs, url = gcs["fs"], f"gs://{BUCKET}/changing/x.tfrecord"
    x, y = small_shard(tmp_path / "x.tfrecord", "x"), small_shard(tmp_path / "y.tfrecord", "y")
    assert x.stat().st_size == y.stat().st_size
    fs.put_file(str(x), url)
    cat = catalogs(tmp_path / "c.sqlite")
    reader = cat.ingest(url, "t", storage_options=gcs["options"])
    assert reader.get_feature("x3", "image") == b"x-3" * 50
    fs.put_file(str(y), url)  # the same size, other bytes: another generation
    with pytest.raises(StaleShardError, match=r"gs://shards/changing/x\.tfrecord changed"):
        reader.get_feature("x3", "image")
    with pytest.raises(StaleShardError, match=r"gs://shards/changing/x\.tfrecord changed"):
        reader.get_many(["x1", "x2"])
    reader = cat.ingest(url, "t", storage_options=gcs["options"])  # re-indexed
    assert reader.get_feature("y3", "image") == b"y-3" * 50
    fs.rm(url)
    with pytest.raises(MissingShardError, match=r"gs://shards/changing/x\.tfrecord no longer"):
        reader.get_feature("y3", "image")


def test_gcs_forked_reader_opens_its_own_client(
    gcs_catalog_file: Path, catalogs: Any, gcs: dict[str, Any]
) -> None:
    remote.configure("gs", token="anon")  # a secret this process keeps for its workers
    try:
        forked_reads_equal(catalogs(gcs_catalog_file).dataset("train"), _keys(50, seed=5))
    finally:
        remote._configured.pop("gs", None)


def test_gcs_cli_ingest_with_storage_options(gcs: dict[str, Any], tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from shardcat.cli import app

    where = tmp_path / "cli.sqlite"
    result = CliRunner().invoke(
        app,
        [
            *("ingest", f"gs://{BUCKET}/train/train-0000[1].tfrecord", "-d", "cli"),
            *("-c", str(where), "--storage-option", f"endpoint_url={gcs['server'].endpoint}"),
            *("--storage-option", "token=anon"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"{RECORDS} records" in result.output


# -- Azure -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def azure(local: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    binary = azurite_binary()
    if binary is None:
        missing("azurite in .node/ (make .node/.installed)")
    server = AzuriteServer(binary, str(tmp_path_factory.mktemp("azurite")))
    server.start()
    options = {"connection_string": server.connection_string}
    fs = adlfs.AzureBlobFileSystem(skip_instance_cache=True, **options)
    fs.mkdir(BUCKET)
    for path in sorted(local.iterdir()):
        fs.put_file(str(path), f"{BUCKET}/train/{path.name}")
    try:
        yield {"server": server, "fs": fs, "options": options}
    finally:
        server.stop()


@pytest.fixture(scope="module")
def az_catalog_file(azure: dict[str, Any], local: Path, tmp_path_factory: Any) -> Path:
    path = tmp_path_factory.mktemp("acat") / "train.sqlite"
    with Catalog(path) as cat:
        cat.ingest(
            f"az://{BUCKET}/train/*.tfrecord", "train", storage_options=azure["options"], workers=2
        ).close()
        cat.ingest(str(local), "local").close()
    return path


def test_azure_ingest_reads_back_identical_and_stores_no_secret(
    azure: dict[str, Any], az_catalog_file: Path, catalogs: Any
) -> None:
    cat = catalogs(az_catalog_file)
    train, here = cat.dataset("train"), cat.dataset("local")
    assert len(train) == len(here) == SHARDS * RECORDS
    keys = _keys(200, seed=3)
    assert train.get_many(keys, raw=True) == here.get_many(keys, raw=True)
    etag = azure["fs"].info(f"{BUCKET}/train/train-00000.tfrecord")["etag"]
    rows = cat.query("SELECT path, fingerprint FROM shardcat_shards WHERE path LIKE 'az://%'")
    assert (f"az://{BUCKET}/train/train-00000.tfrecord", f"etag:{etag}") in rows
    assert cat.info("train").options["storage_options"] == {}
    with sqlite3.connect(az_catalog_file) as conn:
        dump = "\n".join(conn.iterdump())
    assert "AccountKey" not in dump and "Eby8vdM02" not in dump


def test_azure_one_record_is_one_conditional_ranged_request(
    azure: dict[str, Any], az_catalog_file: Path, catalogs: Any
) -> None:
    cat = catalogs(az_catalog_file)
    reader = cat.dataset("train")
    record = len(reader.get_raw("r1_77"))
    server = azure["server"]
    server.reset()
    assert reader.get_feature("r1_77", "image") == cat.dataset("local").get_feature(
        "r1_77", "image"
    )
    requests = server.requests()
    assert [r[0] for r in requests] == ["GET"]
    assert requests[0][1] == f"/devstoreaccount1/{BUCKET}/train/train-00001.tfrecord"
    assert record <= _range_length(requests[0][2]) <= record + 16


def test_azure_get_many_coalesces_1000_random_records(
    azure: dict[str, Any], az_catalog_file: Path, catalogs: Any
) -> None:
    cat = catalogs(az_catalog_file)
    reader = cat.dataset("train")
    keys = _keys(1000, seed=11)
    reader.get_raw(keys[0])
    server = azure["server"]
    server.reset()
    assert reader.get_many(keys, raw=True) == cat.dataset("local").get_many(keys, raw=True)
    requests = server.requests()
    assert 1 <= len(requests) <= 12
    assert {r[0] for r in requests} == {"GET"}


def test_azure_changed_and_deleted_objects_are_errors_naming_the_url(
    azure: dict[str, Any], catalogs: Any, tmp_path: Path
) -> None:
    fs, url = azure["fs"], f"az://{BUCKET}/changing/x.tfrecord"
    x, y = small_shard(tmp_path / "x.tfrecord", "x"), small_shard(tmp_path / "y.tfrecord", "y")
    fs.put_file(str(x), url)
    cat = catalogs(tmp_path / "c.sqlite")
    reader = cat.ingest(url, "t", storage_options=azure["options"])
    assert reader.get_feature("x3", "image") == b"x-3" * 50
    fs.put_file(str(y), url, overwrite=True)  # the same size, other bytes: another ETag
    with pytest.raises(StaleShardError, match=r"az://shards/changing/x\.tfrecord changed"):
        reader.get_feature("x3", "image")
    with pytest.raises(StaleShardError, match=r"az://shards/changing/x\.tfrecord changed"):
        reader.get_many(["x1", "x2"])
    reader = cat.ingest(url, "t", storage_options=azure["options"])
    assert reader.get_feature("y3", "image") == b"y-3" * 50
    fs.rm(url)
    with pytest.raises(MissingShardError, match=r"az://shards/changing/x\.tfrecord no longer"):
        reader.get_feature("y3", "image")


def test_azure_forked_reader_opens_its_own_client(
    az_catalog_file: Path, catalogs: Any, azure: dict[str, Any]
) -> None:
    remote.configure("az", **azure["options"])  # the connection string is not stored
    try:
        forked_reads_equal(catalogs(az_catalog_file).dataset("train"), _keys(50, seed=5))
    finally:
        remote._configured.pop("az", None)
