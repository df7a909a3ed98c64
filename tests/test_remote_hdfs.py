"""HDFS shards through WebHDFS (``webhdfs://namenode:port/path``) against a WebHDFS
REST server on loopback (a NameNode that redirects OPEN to a DataNode listener,
started and stopped here), its requests counted: a record is OPEN (NameNode +
DataNode) and one GETFILESTATUS after it, a batch two requests per merged range
and one status per shard; a file replaced by one of the same size (even between
the redirect and the DataNode's read) is a StaleShardError, never the new bytes; a
deleted one a MissingShardError; a killed server a ShardIOError naming the URL
without the token, and reads go on once it is back; forked readers; ``hdfs://``
without a Hadoop client is one clear error suggesting ``webhdfs://``."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardcat import (
    Catalog,
    CatalogError,
    MissingShardError,
    ShardIOError,
    StaleShardError,
)
from shardcat.sources import remote
from shardcat.testing.required import need

need("fsspec.implementations.webhdfs", "requests", why="shardcat[remote] (fsspec, requests)")

from remote_shards import forked_reads_equal, sample_tar, small_shard, write_shards  # noqa: E402 - after the extras are checked

from shardcat.testing.servers import WebHDFSServer  # noqa: E402 - after the extras are checked

SHARDS, RECORDS, PAYLOAD = 4, 500, 4000  # four ~2 MB TFRecord shards
READ = ["OPEN", "DATANODE", "GETFILESTATUS"]  # one record: the bytes, then the proof


def _replace(path: Path, data: bytes) -> None:
    """Replace the file by a new one (a new inode: a new HDFS fileId)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@pytest.fixture(scope="module")
def hdfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebHDFSServer]:
    root = tmp_path_factory.mktemp("hdfs")
    write_shards(root / "train", shards=SHARDS, records=RECORDS, payload=PAYLOAD, seed=3)
    server = WebHDFSServer(str(root))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def hdfs_catalog_file(hdfs: WebHDFSServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cat") / "h.sqlite"
    with Catalog(path) as cat:
        cat.ingest(f"{hdfs.url}/train/*.tfrecord", "train", workers=2).close()
        cat.ingest(str(Path(hdfs.root) / "train"), "local").close()
    return path


@pytest.fixture
def hdfs_catalog(hdfs_catalog_file: Path, catalogs: Any) -> Catalog:
    return catalogs(hdfs_catalog_file)  # type: ignore[no-any-return]


def _keys(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"r{rng.randrange(SHARDS)}_{rng.randrange(RECORDS)}" for _ in range(n)]


def test_glob_ingest_reads_back_identical_with_hdfs_identity(
    hdfs: WebHDFSServer, hdfs_catalog: Catalog
) -> None:
    train, local = hdfs_catalog.dataset("train"), hdfs_catalog.dataset("local")
    assert len(train) == len(local) == SHARDS * RECORDS
    keys = _keys(300, seed=1)
    assert train.get_many(keys, raw=True) == local.get_many(keys, raw=True)
    rows = hdfs_catalog.query(
        "SELECT path, size, mtime_ns, fingerprint FROM shardcat_shards ORDER BY path"
    )
    first = f"{hdfs.url}/train/train-00000.tfrecord"
    fs = remote.filesystem(first)
    status = fs.info(first)
    assert (first, status["length"]) in [(r[0], r[1]) for r in rows]
    row = next(r for r in rows if r[0] == first)
    assert row[2] == status["modificationTime"] * 1_000_000
    assert row[3] == f"version:{status['fileId']}@{status['modificationTime']}"


def test_one_record_is_open_plus_one_status(hdfs: WebHDFSServer, hdfs_catalog: Catalog) -> None:
    reader = hdfs_catalog.dataset("train")
    record = len(reader.get_raw("r2_123"))
    hdfs.counter.reset()
    value = reader.get_feature("r2_123", "image")
    assert value == hdfs_catalog.dataset("local").get_feature("r2_123", "image")
    assert hdfs.ops() == READ
    opened = hdfs.counter.requests[0][1]
    assert "offset=" in opened and f"length={record}" in opened  # the record, no readahead
    assert record <= hdfs.counter.body_bytes <= record + 16


def test_get_many_coalesces_1000_random_records(hdfs: WebHDFSServer, hdfs_catalog: Catalog) -> None:
    reader = hdfs_catalog.dataset("train")
    keys = _keys(1000, seed=11)
    reader.get_raw(keys[0])
    hdfs.counter.reset()
    assert reader.get_many(keys, raw=True) == hdfs_catalog.dataset("local").get_many(keys, raw=True)
    ops = hdfs.ops()
    # each ~2 MB shard is one merged range: OPEN + DataNode, and one status per shard
    assert sorted(ops) == sorted(["OPEN", "DATANODE"] * SHARDS + ["GETFILESTATUS"] * SHARDS)
    assert len(ops) == 12


def test_tar_members_and_samples(catalogs: Any, hdfs: WebHDFSServer, tmp_path: Path) -> None:
    (Path(hdfs.root) / "web").mkdir()
    tar = sample_tar(Path(hdfs.root) / "web" / "web-000.tar")
    cat = catalogs(tmp_path / "tar.sqlite")
    reader = cat.ingest(f"{hdfs.url}/web/web-{{000..000}}.tar", "tar")
    local = cat.ingest(str(tar), "tarlocal")
    reader.get_feature("s001", "cls")
    hdfs.counter.reset()
    assert reader.get_feature("s007", "jpg") == local.get_feature("s007", "jpg")
    assert hdfs.ops() == READ and hdfs.counter.body_bytes == 3000
    hdfs.counter.reset()
    assert reader.get_record("s009") == local.get_record("s009")
    assert hdfs.ops() == READ  # the sample's two members: one range, one status
    assert reader.verify() == []


def test_storage_options_are_stored_without_secrets(tmp_path: Path) -> None:
    given = {
        "user": "alice",
        "token": "t",
        "password": "p",
        "kerb_kwargs": {"principal": "alice@REALM"},
        "kerberos": False,
        "proxy_to": "bob",
    }
    assert remote.public_options(given) == {"user": "alice", "kerberos": False, "proxy_to": "bob"}


def test_cli_ingest_stores_the_user_not_the_password(hdfs: WebHDFSServer, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from shardcat.cli import app

    where = tmp_path / "cli.sqlite"
    result = CliRunner().invoke(
        app,
        [
            *("ingest", f"{hdfs.url}/train/train-0000[01].tfrecord", "-d", "cli", "-c", str(where)),
            *("--storage-option", "user=alice", "--storage-option", "password=hunter2"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "1,000 records" in result.output
    with Catalog(where) as cat:
        assert cat.info("cli").options["storage_options"] == {"user": "alice"}
    assert b"hunter2" not in where.read_bytes()


def test_replaced_and_deleted_files_are_errors_naming_the_url(
    catalogs: Any, hdfs: WebHDFSServer, tmp_path: Path
) -> None:
    shard = Path(hdfs.root) / "changing" / "x.tfrecord"
    shard.parent.mkdir()
    small_shard(shard, "x")
    url = f"{hdfs.url}/changing/x.tfrecord"
    cat = catalogs(tmp_path / "c.sqlite")
    reader = cat.ingest(url, "t", storage_options={"user": "alice"})
    assert reader.get_feature("x3", "image") == b"x-3" * 50
    other = small_shard(tmp_path / "y.tfrecord", "y").read_bytes()
    assert len(other) == shard.stat().st_size  # same size, other bytes, a new fileId
    _replace(shard, other)
    with pytest.raises(StaleShardError, match=r"changing/x\.tfrecord changed"):
        reader.get_feature("x3", "image")
    with pytest.raises(StaleShardError, match=r"changing/x\.tfrecord changed"):
        reader.get_many(["x1", "x2"])
    reader = cat.ingest(url, "t")  # another fileId: re-indexed
    assert reader.get_feature("y3", "image") == b"y-3" * 50
    assert reader.get_raw("x3") is None
    shard.unlink()
    with pytest.raises(MissingShardError, match=r"changing/x\.tfrecord no longer exists"):
        reader.get_feature("y3", "image")


def test_replaced_between_redirect_and_datanode_read_is_stale_not_new_bytes(
    catalogs: Any, hdfs: WebHDFSServer, tmp_path: Path
) -> None:
    """The NameNode's redirect names no fileId: the DataNode serves the new file's
    bytes, and the status after the read is what refuses them."""
    shard = Path(hdfs.root) / "race" / "x.tfrecord"
    shard.parent.mkdir()
    small_shard(shard, "x")
    cat = catalogs(tmp_path / "r.sqlite")
    reader = cat.ingest(f"{hdfs.url}/race/x.tfrecord", "r")
    other = small_shard(tmp_path / "z.tfrecord", "z").read_bytes()
    hdfs.before_data = lambda: _replace(shard, other)
    try:
        hdfs.counter.reset()
        with pytest.raises(StaleShardError, match=r"race/x\.tfrecord changed"):
            reader.get_raw("x4")
        ops = hdfs.ops()  # (the error path asks for the status once more)
        assert ops[:3] == READ and set(ops[3:]) <= {"GETFILESTATUS"}
        assert hdfs.counter.body_bytes > 0  # the DataNode did send the new bytes
    finally:
        hdfs.before_data = None


def test_server_killed_mid_read_then_back(
    catalogs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote, "BACKOFF", 0.01)
    root = tmp_path / "hdfs"
    (root / "k").mkdir(parents=True)
    small_shard(root / "k" / "k.tfrecord", "k", 100)
    server = WebHDFSServer(str(root))
    server.start()
    remote.configure("webhdfs", token="s3cr3t-delegation")
    try:
        cat = catalogs(tmp_path / "k.sqlite")
        reader = cat.ingest(f"{server.url}/k/k.tfrecord", "k")
        keys = [f"k{i}" for i in range(100)]
        expected = reader.get_many(keys, raw=True)
        assert "delegation=s3cr3t-delegation" in server.counter.requests[-1][1]
        server.counter.reset()
        server.fail_next = 2  # two 503s, then the answer
        assert reader.get_raw("k5") == expected[5]
        assert server.ops() == ["OPEN", "OPEN", *READ]  # the 503s were OPENs too
        server.before_data = server.stop  # the DataNode dies as it is asked for bytes
        with pytest.raises(ShardIOError, match=r"webhdfs://127\.0\.0\.1:\d+/k/k\.tfrecord") as e:
            reader.get_raw("k6")
        assert "s3cr3t" not in str(e.value)
        server.before_data = None
        server.stop()
        server.start()  # same ports, same fileIds
        assert reader.get_many(keys, raw=True) == expected
        assert reader.get_raw("k6") == expected[6]
    finally:
        remote._configured.pop("webhdfs", None)
        server.before_data = None
        server.stop()


def test_forked_reader_opens_its_own_session(hdfs_catalog: Catalog) -> None:
    forked_reads_equal(hdfs_catalog.dataset("train"), _keys(50, seed=5))


def test_reingest_reads_only_the_changed_file(
    catalogs: Any, hdfs: WebHDFSServer, tmp_path: Path
) -> None:
    folder = Path(hdfs.root) / "re"
    folder.mkdir()
    for name in ("a", "b", "c"):
        small_shard(folder / f"{name}.tfrecord", name)
    cat = catalogs(tmp_path / "re.sqlite")
    pattern = f"{hdfs.url}/re/*.tfrecord"
    cat.ingest(pattern, "re").close()
    _replace(folder / "b.tfrecord", small_shard(tmp_path / "q.tfrecord", "q").read_bytes())
    hdfs.counter.reset()
    reader = cat.ingest(pattern, "re")
    opened = {r[1].split("?")[0].rsplit("/", 1)[1] for r in hdfs.counter.requests}
    # b re-read; a only as the first file, its head sniffed for the format; c not at all
    assert "b.tfrecord" in opened and "c.tfrecord" not in opened
    assert reader.get_feature("q1", "image") == b"q-1" * 50
    assert reader.get_feature("a1", "image") == b"a-1" * 50
    assert reader.get_raw("b1") is None


def test_tfrecord_random_access(catalogs: Any, hdfs: WebHDFSServer, tmp_path: Path) -> None:
    from shardcat import TFRecordRandomAccess

    with TFRecordRandomAccess(
        f"{hdfs.url}/train/train-0000[01].tfrecord", index_file=str(tmp_path / "i.sqlite")
    ) as reader:
        assert len(reader) == 2 * RECORDS
        local = catalogs(tmp_path / "l.sqlite").ingest(
            str(Path(hdfs.root) / "train" / "train-00001.tfrecord")
        )
        assert reader.get_feature("r1_9", "image") == local.get_feature("r1_9", "image")


# -- hdfs:// (pyarrow, libhdfs) ----------------------------------------------------------


@pytest.fixture
def no_hadoop(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No JVM or libhdfs where pyarrow looks (this machine has no Hadoop client anyway)."""
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))
    monkeypatch.setenv("ARROW_LIBHDFS_DIR", str(tmp_path / "no-libhdfs"))
    monkeypatch.delenv("CLASSPATH", raising=False)


def test_hdfs_without_a_hadoop_client_suggests_webhdfs(no_hadoop: None) -> None:
    with pytest.raises(CatalogError) as caught:
        remote.filesystem("hdfs://namenode:8020/train/x.tfrecord")
    message = str(caught.value)
    assert message.startswith("hdfs://namenode:8020/train/x.tfrecord: cannot open hdfs://")
    for needed in ("pyarrow", "JAVA_HOME", "libhdfs", "CLASSPATH", "webhdfs://namenode:9870/"):
        assert needed in message
    assert "\n" not in message


def test_cli_hdfs_without_a_hadoop_client_is_one_line(no_hadoop: None, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from shardcat.cli import app

    result = CliRunner().invoke(
        app, ["ingest", "hdfs://namenode:8020/train/*.tfrecord", "-c", str(tmp_path / "c.sqlite")]
    )
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "webhdfs://namenode:9870/" in lines[0] and "Traceback" not in result.output


def test_node_local_cache_is_filled_through_checked_reads(
    hdfs: WebHDFSServer, hdfs_catalog: Catalog, tmp_path: Path
) -> None:
    import time

    from shardcat.sources import cache

    directory = tmp_path / "cache"
    cache.configure_cache(directory, 1 << 30)
    try:
        with hdfs_catalog.dataset("train") as reader:
            hdfs.counter.reset()
            reader.get_raw("r1_0")  # opens the shard's source: its download starts
            for _ in range(600):  # a background download: polled, no timing asserted
                done = [p for p in directory.iterdir() if not p.name.endswith((".lock", ".part"))]
                if done:
                    break
                time.sleep(0.1)
            assert len(done) == 1
            size = (Path(hdfs.root) / "train" / "train-00001.tfrecord").stat().st_size
            assert done[0].stat().st_size == size
            assert hdfs.ops().count("GETFILESTATUS") == hdfs.ops().count("OPEN")  # each checked
        with hdfs_catalog.dataset("train") as again:
            hdfs.counter.reset()
            keys = [f"r1_{i}" for i in range(0, RECORDS, 7)]
            assert again.get_many(keys, raw=True) == hdfs_catalog.dataset("local").get_many(
                keys, raw=True
            )
            assert hdfs.counter.requests == []
    finally:
        cache.configure_cache(None)
        cache._config.clear()
