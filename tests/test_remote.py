"""Shards on object storage: moto's S3 server and a Range-capable HTTP server on
loopback (started here, stopped at the end), counting the requests and bytes
they serve: one request per record, coalesced batches, stale and missing
objects, retries, a server killed mid-read, forked readers, secrets never
stored, compressed shards read from their seek points."""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
import random
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from features import payloads
from fsspec.implementations.local import LocalFileSystem

from shardcat import Catalog, MissingShardError, ShardIOError, StaleShardError
from shardcat.paths import brace_expand
from shardcat.readers.reader import Reader
from shardcat.sources import cache, remote, remote_file
from shardcat.testing.required import need

boto3 = need("boto3", "moto", "s3fs", why="shardcat[remote,dev] (s3fs, moto[server])")

import checked  # noqa: E402 - after the extras are checked
from remote_shards import forked_reads_equal, sample_tar, small_shard, write_shards  # noqa: E402 - after the extras are checked

from shardcat.testing.servers import RangeServer, S3Server  # noqa: E402 - after the extras are checked

BUCKET = "shards"
RECORDS = 2000  # per shard, ~4 KB each: four shards of ~8 MB
PAYLOAD = 4000


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The S3 server, a bucket with four ~8 MB TFRecord shards, their local copies."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    server = S3Server()
    server.start()
    client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    local = tmp_path_factory.mktemp("local")
    for path in write_shards(local, shards=4, records=RECORDS, payload=PAYLOAD, seed=7):
        client.upload_file(str(path), BUCKET, f"train/{path.name}")
    try:
        yield {"server": server, "client": client, "local": local, "endpoint": server.endpoint}
    finally:
        server.stop()


@pytest.fixture(scope="session")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RangeServer]:
    root = tmp_path_factory.mktemp("www")
    write_shards(root, shards=4, records=RECORDS, payload=PAYLOAD, seed=7)
    server = RangeServer(str(root))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_catalog_file(s3: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A catalog with the S3 shards as dataset ``train``, their local copies as ``local``."""
    path = tmp_path_factory.mktemp("cat") / "train.sqlite"
    with Catalog(path) as cat:
        cat.ingest(
            f"s3://{BUCKET}/train/*.tfrecord",
            "train",
            storage_options={"endpoint_url": s3["endpoint"], "key": "testing", "secret": "testing"},
            workers=2,
        ).close()
        cat.ingest(str(s3["local"]), "local").close()
    return path


@pytest.fixture
def s3_catalog(s3_catalog_file: Path, catalogs: Any) -> Catalog:
    return catalogs(s3_catalog_file)  # type: ignore[no-any-return]


def _keys(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"r{rng.randrange(4)}_{rng.randrange(RECORDS)}" for _ in range(n)]


# -- S3 --------------------------------------------------------------------------


def test_s3_ingest_reads_back_identical_to_the_local_copy(s3_catalog: Catalog) -> None:
    train, local = s3_catalog.dataset("train"), s3_catalog.dataset("local")
    assert len(train) == len(local) == 4 * RECORDS
    keys = _keys(200, seed=3)
    assert train.get_many(keys, raw=True) == local.get_many(keys, raw=True)
    info = s3_catalog.info("train")
    assert info.source == [f"s3://{BUCKET}/train/*.tfrecord"]
    paths = [r[0] for r in s3_catalog.query("SELECT path FROM shardcat_shards ORDER BY path")]
    assert f"s3://{BUCKET}/train/train-00000.tfrecord" in paths


def test_s3_one_record_is_one_request_of_its_size(s3: dict[str, Any], s3_catalog: Catalog) -> None:
    reader = s3_catalog.dataset("train")
    record = len(reader.get_raw("r2_1234"))  # the source opened (no request by itself)
    counter = s3["server"].counter
    counter.reset()
    value = reader.get_feature("r2_1234", "image")
    assert value == s3_catalog.dataset("local").get_feature("r2_1234", "image")
    assert len(counter.requests) == 1
    assert counter.requests[0][0] == "GET"
    assert record <= counter.body_bytes <= record + 16  # the payload, never a readahead


def test_s3_get_many_coalesces_1000_random_records(s3: dict[str, Any], s3_catalog: Catalog) -> None:
    reader = s3_catalog.dataset("train")
    keys = _keys(1000, seed=11)
    reader.get_raw(keys[0])
    counter = s3["server"].counter
    counter.reset()
    got = reader.get_many(keys, raw=True)
    assert got == s3_catalog.dataset("local").get_many(keys, raw=True)
    assert len(counter.gets()) <= 40
    assert len(counter.requests) == len(counter.gets())  # no HEAD, no listing


def test_storage_options_are_stored_without_secrets(
    s3: dict[str, Any], s3_catalog: Catalog
) -> None:
    assert s3_catalog.info("train").options["storage_options"] == {"endpoint_url": s3["endpoint"]}
    with sqlite3.connect(s3_catalog.path) as conn:
        text = json.dumps(conn.execute("SELECT * FROM shardcat_datasets").fetchall())
    assert "secret" not in text and "testing" not in text
    given = {
        "key": "k",
        "secret": "s",
        "token": "t",
        "anon": True,
        "client_kwargs": {"aws_session_token": "x", "region_name": "r"},
    }
    assert remote.public_options(given) == {"anon": True, "client_kwargs": {"region_name": "r"}}


def test_s3_changed_and_deleted_objects_are_errors_naming_the_url(
    catalogs: Any, s3: dict[str, Any], tmp_path: Path
) -> None:
    client, url = s3["client"], f"s3://{BUCKET}/changing/x.tfrecord"
    client.upload_file(
        str(small_shard(tmp_path / "x.tfrecord", "x")), BUCKET, "changing/x.tfrecord"
    )
    cat = catalogs(tmp_path / "c.sqlite")
    reader = cat.ingest(url, "t", storage_options={"endpoint_url": s3["endpoint"]})
    assert reader.get_feature("x3", "image") == b"x-3" * 50
    client.upload_file(
        str(small_shard(tmp_path / "y.tfrecord", "y")), BUCKET, "changing/x.tfrecord"
    )
    with pytest.raises(StaleShardError, match=r"s3://shards/changing/x\.tfrecord changed"):
        reader.get_feature("x3", "image")
    with pytest.raises(StaleShardError, match=r"s3://shards/changing/x\.tfrecord changed"):
        reader.get_many(["x1", "x2"])
    reader = cat.ingest(url, "t")  # the ETag differs: re-indexed
    assert reader.get_feature("y3", "image") == b"y-3" * 50
    assert reader.get_raw("x3") is None
    client.delete_object(Bucket=BUCKET, Key="changing/x.tfrecord")
    with pytest.raises(
        MissingShardError, match=r"s3://shards/changing/x\.tfrecord no longer exists"
    ):
        reader.get_feature("y3", "image")


def test_forked_reader_opens_its_own_session(s3_catalog: Catalog) -> None:
    forked_reads_equal(s3_catalog.dataset("train"), _keys(50, seed=5))


def test_gzip_tfrecord_on_s3_reads_from_the_nearest_seek_point(
    catalogs: Any, s3: dict[str, Any], tmp_path: Path
) -> None:
    need("indexed_gzip", why="shardcat[compressed]")
    src = (s3["local"] / "train-00003.tfrecord").read_bytes()
    (tmp_path / "z.tfrecord.gz").write_bytes(gzip.compress(src, compresslevel=1))
    size = (tmp_path / "z.tfrecord.gz").stat().st_size
    s3["client"].upload_file(str(tmp_path / "z.tfrecord.gz"), BUCKET, "gz/z.tfrecord.gz")
    cat = catalogs(tmp_path / "c.sqlite")
    reader = cat.ingest(
        f"s3://{BUCKET}/gz/z.tfrecord.gz", "z", storage_options={"endpoint_url": s3["endpoint"]}
    )
    local = cat.ingest(str(s3["local"] / "train-00003.tfrecord"), "l")
    counter = s3["server"].counter
    counter.reset()
    assert reader.get_raw("r3_1900") == local.get_raw("r3_1900")
    assert 1 <= len(counter.gets()) <= 2
    assert counter.body_bytes <= 2 * remote_file.WINDOW < size / 3  # not from the start
    assert reader.get_many(["r3_5", "r3_1000"], raw=True) == local.get_many(
        ["r3_5", "r3_1000"], raw=True
    )


def test_tfrecord_random_access_on_s3(catalogs: Any, s3: dict[str, Any], tmp_path: Path) -> None:
    from shardcat import TFRecordRandomAccess

    remote.configure("s3", endpoint_url=s3["endpoint"])
    try:
        with TFRecordRandomAccess(
            f"s3://{BUCKET}/train/train-0000[01].tfrecord", index_file=str(tmp_path / "i.sqlite")
        ) as reader:
            assert len(reader) == 2 * RECORDS
            local = catalogs(tmp_path / "l.sqlite").ingest(
                str(s3["local"] / "train-00001.tfrecord")
            )
            assert reader.get_feature("r1_9", "image") == local.get_feature("r1_9", "image")
    finally:
        remote._configured.pop("s3", None)


@pytest.mark.parametrize("name", ["train-00002.tfrecord", "train-0000[2].tfrecord"])
def test_cli_ingest_with_storage_options(s3: dict[str, Any], tmp_path: Path, name: str) -> None:
    """One object, and a glob (listed with the options too: the endpoint is not AWS)."""
    from typer.testing import CliRunner

    from shardcat.cli import app

    where = tmp_path / "cli.sqlite"
    result = CliRunner().invoke(
        app,
        [
            "ingest",
            f"s3://{BUCKET}/train/{name}",
            "-d",
            "cli",
            "-c",
            str(where),
            "--storage-option",
            f"endpoint_url={s3['endpoint']}",
            "--storage-option",
            "key=testing",
            "--storage-option",
            "secret=hunter2",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "2,000 records" in result.output
    assert Catalog(where).info("cli").options["storage_options"] == {"endpoint_url": s3["endpoint"]}
    assert b"hunter2" not in where.read_bytes()


# -- HTTP ------------------------------------------------------------------------


def test_http_brace_ingest_single_reads_and_batches(
    catalogs: Any, http: RangeServer, s3: dict[str, Any], tmp_path: Path
) -> None:
    cat = catalogs(tmp_path / "web.sqlite")
    reader = cat.ingest(f"{http.url}/train-{{00000..00003}}.tfrecord", "web")
    assert len(reader) == 4 * RECORDS
    local = cat.ingest(str(s3["local"]), "local")
    reader.get_raw("r0_0")
    http.counter.reset()
    assert reader.get_raw("r3_77") == local.get_raw("r3_77")
    assert [r[0] for r in http.counter.requests] == ["GET"]
    assert http.counter.body_bytes <= PAYLOAD + 64
    keys = _keys(1000, seed=2)
    http.counter.reset()
    assert reader.get_many(keys, raw=True) == local.get_many(keys, raw=True)
    assert len(http.counter.requests) <= 40


def test_http_tar_member_is_one_request(catalogs: Any, http: RangeServer, tmp_path: Path) -> None:
    tar = sample_tar(Path(http.root) / "web-000.tar")
    cat = catalogs(tmp_path / "tar.sqlite")
    reader = cat.ingest(f"{http.url}/web-{{000..000}}.tar", "tar")
    local = cat.ingest(str(tar), "tarlocal")
    reader.get_feature("s001", "cls")
    http.counter.reset()
    assert reader.get_feature("s007", "jpg") == local.get_feature("s007", "jpg")
    assert len(http.counter.requests) == 1 and http.counter.body_bytes == 3000
    http.counter.reset()
    assert reader.get_record("s009") == local.get_record("s009")
    assert len(http.counter.requests) == 1  # the sample's members, one request


@pytest.mark.parametrize("conditions", [True, False], ids=["412", "ignores-conditions"])
def test_http_without_etags_a_same_size_replacement_is_stale_never_its_bytes(
    catalogs: Any, tmp_path: Path, conditions: bool
) -> None:
    """A server that sends no ETag: reads are conditional on the indexed Last-Modified
    (If-Unmodified-Since) and check the one answered (for servers that ignore the
    condition), so an object replaced after the reader opened (same size, other
    bytes) is a StaleShardError, never the new bytes."""
    root = tmp_path / "www"
    root.mkdir()
    shard = small_shard(root / "x.tfrecord", "x")
    os.utime(shard, (1_700_000_000, 1_700_000_000))
    server = RangeServer(str(root), etags=False, conditions=conditions)
    server.start()
    try:
        cat = catalogs(tmp_path / "c.sqlite")
        reader = cat.ingest(f"{server.url}/x.tfrecord", "t")
        assert reader.get_feature("x3", "image") == b"x-3" * 50
        small_shard(tmp_path / "y.tfrecord", "x")  # same keys and size, other bytes
        data = (tmp_path / "y.tfrecord").read_bytes().replace(b"x-3x-3", b"X-3X-3")
        assert len(data) == shard.stat().st_size
        shard.write_bytes(data)
        os.utime(shard, (1_700_000_100, 1_700_000_100))
        server.counter.reset()
        with pytest.raises(StaleShardError, match=r"x\.tfrecord changed.*Last-Modified differs"):
            reader.get_feature("x3", "image")
        assert len(server.counter.requests) == 1  # the read itself, no HEAD
        with pytest.raises(StaleShardError):
            reader.get_many(["x1", "x3"])
    finally:
        server.stop()


class _PlainFS(LocalFileSystem):  # type: ignore[misc]
    """A store without conditional reads: the local disk behind a ``plainfs://`` URL."""

    protocol = ("plainfs",)

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        path = str(path)
        return super()._strip_protocol(path.removeprefix("plainfs://"))

    def unstrip_protocol(self, name: str) -> str:
        return "plainfs://" + name


def test_other_protocols_check_the_object_after_each_read_never_returning_its_new_bytes(
    catalogs: Any, tmp_path: Path
) -> None:
    """A protocol with no conditional read (an fsspec filesystem shardcat knows nothing
    of): ``fs.info`` after each read, once per shard after a batch, so a same-size
    replacement after the reader opened is a StaleShardError, never its bytes."""
    fsspec.register_implementation("plainfs", _PlainFS, clobber=True)
    shard = small_shard(tmp_path / "x.tfrecord", "x")
    reader = catalogs(tmp_path / "c.sqlite").ingest(f"plainfs://{tmp_path}/*.tfrecord", "t")
    assert reader.get_feature("x3", "image") == b"x-3" * 50
    raw = reader.get_many(["x1", "x3"], raw=True)
    assert raw == [reader.get_raw("x1"), reader.get_raw("x3")] and b"x-3" * 50 in raw[1]
    data = shard.read_bytes().replace(b"x-3x-3", b"X-3X-3")
    shard.write_bytes(data)
    os.utime(shard, (1_700_000_100, 1_700_000_100))
    with pytest.raises(StaleShardError, match=r"x\.tfrecord changed after it was indexed"):
        reader.get_feature("x3", "image")
    with pytest.raises(StaleShardError):
        reader.get_many(["x1", "x3"])


def test_http_answers_of_another_range_are_placed_by_content_range_or_refused(
    catalogs: Any, tmp_path: Path
) -> None:
    """A server (or proxy) answering a wider, aligned range: the record's bytes are
    cut out of it by its Content-Range. One answering other bytes of the same length
    (a range moved by 16 bytes): a ShardIOError naming the URL, never those bytes."""
    root = tmp_path / "www"
    root.mkdir()
    small_shard(root / "x.tfrecord", "x")
    local = catalogs(tmp_path / "local.sqlite").ingest(str(root / "x.tfrecord"), "t")
    server = RangeServer(str(root))
    server.start()
    try:
        cat = catalogs(tmp_path / "c.sqlite")
        reader = cat.ingest(f"{server.url}/x.tfrecord", "a")
        server.align = 512
        server.counter.reset()
        assert reader.get_raw("x3") == local.get_raw("x3")
        assert len(server.counter.requests) == 1 and server.counter.body_bytes == 512
        assert reader.get_many(["x1", "x7"], raw=True) == local.get_many(["x1", "x7"], raw=True)
        server.align, server.shift = 0, 16
        with pytest.raises(ShardIOError, match=r"x\.tfrecord: cannot read bytes .*answered"):
            reader.get_raw("x3")
        with pytest.raises(ShardIOError):
            reader.get_many(["x1", "x7"], raw=True)
        with pytest.raises(ShardIOError, match=r"x\.tfrecord: cannot read bytes"):
            cat.ingest(f"{server.url}/x.tfrecord", "b")  # its first bytes, for its format
    finally:
        server.stop()


def test_http_retries_transient_errors_then_fails_naming_the_url(
    catalogs: Any, http: RangeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote, "BACKOFF", 0.01)
    cat = catalogs(tmp_path / "r.sqlite")
    reader = cat.ingest(f"{http.url}/train-00001.tfrecord", "r")
    expected = reader.get_raw("r1_3")
    http.counter.reset()
    http.fail_next = 2
    assert reader.get_raw("r1_3") == expected
    assert len(http.counter.requests) == 3
    http.fail_next = remote.RETRIES + 1
    with pytest.raises(ShardIOError, match=r"train-00001\.tfrecord: the store did not answer"):
        reader.get_raw("r1_4")
    http.fail_next = 0
    assert reader.get_raw("r1_4") == payloads(Path(http.root) / "train-00001.tfrecord")["r1_4"]


def test_server_killed_mid_read_then_back(
    catalogs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote, "BACKOFF", 0.01)
    root = tmp_path / "www"
    root.mkdir()
    small_shard(root / "k.tfrecord", "k", 100)
    server = RangeServer(str(root))
    server.start()
    try:
        cat = catalogs(tmp_path / "k.sqlite")
        reader = cat.ingest(f"{server.url}/k.tfrecord", "k")
        keys = [f"k{i}" for i in range(100)]
        expected = reader.get_many(keys, raw=True)
        server.stop()
        with pytest.raises(ShardIOError, match=r"k\.tfrecord"):
            reader.get_raw("k5")
        server = RangeServer(str(root), port=server.port)
        server.start()
        assert reader.get_many(keys, raw=True) == expected
    finally:
        server.stop()


# -- paths ------------------------------------------------------------------------


def test_brace_expand() -> None:
    assert brace_expand("s-{000..003}.tar") == ["s-000.tar", "s-001.tar", "s-002.tar", "s-003.tar"]
    assert brace_expand("{a,b}/x-{1..2}") == ["a/x-1", "a/x-2", "b/x-1", "b/x-2"]
    assert brace_expand("x-{8..10}") == ["x-8", "x-9", "x-10"]
    assert brace_expand("plain") == ["plain"]
    assert brace_expand("odd-{x}.tar") == ["odd-{x}.tar"]


def test_is_url() -> None:
    assert remote.is_url("s3://b/k") and remote.is_url("https://h/p")
    assert not remote.is_url("/data/x.tfrecord") and not remote.is_url("file:///x")


# -- the node-local cache -------------------------------------------------------------


def _cached(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if not p.name.endswith((".lock", ".part")))


def _wait_for(check: Any, what: str) -> None:
    """Poll ``check()`` (a background download) up to a minute; no timing asserted."""
    for _ in range(600):
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"still waiting for {what}")


@pytest.fixture
def cache_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "cache"
    yield directory
    cache.configure_cache(None)
    cache._config.clear()


def test_cache_serves_whole_shards_locally(
    s3: dict[str, Any], s3_catalog: Catalog, cache_dir: Path
) -> None:
    cache.configure_cache(cache_dir, 1 << 30)
    keys = _keys(300, seed=9)
    with s3_catalog.dataset("train") as reader:
        for s in range(4):
            reader.get_raw(f"r{s}_0")  # opens each shard's source: its download starts
        _wait_for(lambda: len(_cached(cache_dir)) == 4, "four cached shards")
        with s3_catalog.dataset("train") as again:  # new sources find the copies
            counter = s3["server"].counter
            counter.reset()
            assert again.get_many(keys, raw=True) == s3_catalog.dataset("local").get_many(
                keys, raw=True
            )
            assert again.get_raw("r3_3") == s3_catalog.dataset("local").get_raw("r3_3")
            assert counter.requests == []
    sizes = sorted(p.stat().st_size for p in _cached(cache_dir))
    assert sizes == sorted(
        (s3["local"] / f"train-{s:05d}.tfrecord").stat().st_size for s in range(4)
    )


def test_cache_stays_under_its_cap_with_concurrent_processes(
    s3_catalog: Catalog, s3: dict[str, Any], cache_dir: Path
) -> None:
    shard = (s3["local"] / "train-00000.tfrecord").stat().st_size
    cap = int(2.5 * shard)  # room for two shards of four
    cache.configure_cache(cache_dir, cap)
    cache_dir.mkdir()
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(sum(p.stat().st_size for p in cache_dir.iterdir() if p.exists()))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    keys = _keys(100, seed=4)
    with s3_catalog.dataset("train") as reader:
        children = [
            ctx.Process(target=_epochs, args=(reader, keys, out, cache_dir)) for _ in range(4)
        ]
        for child in children:
            child.start()
        results = [out.get(timeout=120) for _ in children]
        for child in children:
            child.join(timeout=60)
    stop.set()
    watcher.join()
    expected = s3_catalog.dataset("local").get_many(keys, raw=True)
    assert all(r == expected for r in results)
    assert all(c.exitcode == 0 for c in children)
    assert max(seen) <= cap
    assert 1 <= len(_cached(cache_dir)) <= 2
    assert not [p for p in cache_dir.iterdir() if p.name.endswith(".part")]


def _epochs(reader: Any, keys: list[str], out: Any, directory: Path) -> None:
    """A DataLoader worker's epochs: every shard in turn, then its downloads finished."""
    for s in range(4):
        with Reader(reader.catalog, "train") as fresh:  # another reader on its catalog
            fresh.get_raw(f"r{s}_1")
            time.sleep(0.3)  # let downloads run (and race) between processes
    mine = f".{os.getpid()}."
    _wait_for(
        lambda: not [p for p in directory.iterdir() if mine in p.name and p.name.endswith(".part")],
        "this worker's downloads",
    )
    out.put(reader.get_many(keys, raw=True))


@pytest.mark.parametrize(
    "url",
    [
        "{u}/x.tfrecord?X-Amz-Signature=s3cr3t&X-Amz-Credential=AKIA",
        "http://me:s3cr3t@{h}/x.tfrecord",
    ],
    ids=["presigned", "userinfo"],
)
def test_secrets_in_a_shard_url_never_reach_an_error_message(
    catalogs: Any, tmp_path: Path, url: str
) -> None:
    """A presigned URL's signature or a URL's password is stored (later reads need
    it) but every error shows the URL with it masked: messages end up in logs."""
    from typer.testing import CliRunner

    from shardcat.cli import app

    root = tmp_path / "www"
    root.mkdir()
    shard = small_shard(root / "x.tfrecord", "x")
    server = RangeServer(str(root))
    server.start()
    try:
        url = url.format(u=server.url, h=f"127.0.0.1:{server.port}")
        cat = catalogs(tmp_path / "c.sqlite")
        reader = cat.ingest(url, "t")
        assert reader.get_feature("x3", "image") == b"x-3" * 50
        shard.write_bytes(shard.read_bytes().replace(b"x-3x-3", b"X-3X-3"))
        errors = []
        for call in (lambda: reader.get_feature("x3", "image"), lambda: reader.get_many(["x3"])):
            with pytest.raises(StaleShardError) as stale:
                call()
            errors.append(stale.value)
        catalog = str(tmp_path / "c.sqlite")
        outputs = [
            CliRunner().invoke(app, ["get", "t", "x3", "image", "-c", catalog]),
            CliRunner().invoke(app, ["verify", "t", "-c", catalog]),
        ]
        shard.unlink()
        with pytest.raises(MissingShardError) as missing:
            reader.get_feature("x1", "image")
        errors.append(missing.value)
        server.stop()
        with pytest.raises(ShardIOError) as down:
            reader.get_feature("x2", "image")
        errors.append(down.value)
        for error in errors:
            assert "s3cr3t" not in str(error) and "x.tfrecord" in str(error), str(error)
            assert error.path is not None and "s3cr3t" in error.path  # the attribute is whole
        outputs.append(CliRunner().invoke(app, ["get", "t", "x2", "image", "-c", catalog]))
        for out in outputs:
            assert out.exit_code != 0 and isinstance(out.exception, SystemExit), out.output
            assert "s3cr3t" not in out.output and "x.tfrecord" in out.output, out.output
    finally:
        server.stop()


@pytest.mark.parametrize("kind", ["tfrecord", "tar", "recordio"])
def test_a_remote_shard_damaged_in_place_is_refused_by_every_read_path(
    catalogs: Any, tmp_path: Path, kind: str
) -> None:
    """Bit rot on the server (same size, same Last-Modified, past the fingerprint's
    head and tail): the headers cannot tell, the stored check of each record can."""
    root = tmp_path / "www"
    d = checked.write(kind, root)
    server = RangeServer(str(root), etags=False, conditions=False)
    server.start()
    try:
        cat = catalogs(tmp_path / "c.sqlite")
        url = f"{server.url}/{d.path.name}"  # type: ignore[union-attr]
        reader = cat.ingest(url, "r")
        assert reader.get_raw(d.key) == d.good
        reader.close()
        d.damage()
        d.path = url
        with cat.dataset("r") as fresh:
            checked.every_read_refuses(fresh, d)
    finally:
        server.stop()
