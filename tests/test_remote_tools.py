"""The tools beyond ingest and reads on shards in object storage (moto's S3 server
on loopback, counting its requests): ``convert`` of remote tar archives,
``migrate`` of legacy indexes whose shards are remote, ``verify``, RecordIO
``.idx`` files beside remote ``.rec`` files, ingest judging shards from the
listing, Parquet shards, and a PostgreSQL catalog over S3 shards."""

from __future__ import annotations

import io
import os
import struct
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardcat import Catalog, IngestError
from shardcat.catalog.processes import START_METHOD_ENV
from shardcat.testing.required import missing, need

boto3 = need("boto3", "moto", "s3fs", why="shardcat[remote,dev] (s3fs, moto[server])")


from shardcat.testing.servers import S3Server  # noqa: E402 - after the extras are checked

BUCKET = "tools"


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    """The S3 server and a boto3 client of it, with bucket ``tools``."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    server = S3Server()
    server.start()
    server.client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1")
    server.client.create_bucket(Bucket=BUCKET)
    server.options = {"endpoint_url": server.endpoint}
    try:
        yield server
    finally:
        server.stop()


def _upload(s3: Any, local: Path, prefix: str) -> str:
    """Upload the files of ``local`` under ``prefix``; the URL of that prefix."""
    for path in sorted(local.iterdir()):
        s3.client.upload_file(str(path), BUCKET, f"{prefix}/{path.name}")
    return f"s3://{BUCKET}/{prefix}"


def _tar(path: Path, samples: int) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as archive:
        for i in range(samples):
            for ext, data in (("jpg", f"{path.stem}-{i}".encode() * 50), ("cls", b"%d" % i)):
                member = tarfile.TarInfo(f"{path.stem}_s{i:03d}.{ext}")
                member.size = len(data)
                archive.addfile(member, io.BytesIO(data))


def _requests(s3: Any, prefix: str) -> list[tuple[str, str]]:
    return [(m, p) for m, p, _ in s3.counter.requests if prefix in p]


# -- convert ---------------------------------------------------------------------


@pytest.mark.parametrize("start", ["fork", "forkserver"])
def test_convert_remote_tars_to_local_tfrecords(
    s3: Any, tmp_path: Path, start: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers forked, or started by a fork server (beside other threads): these get
    the caller's environment as it is now (the credentials)."""
    monkeypatch.setenv(START_METHOD_ENV, start)
    if start == "forkserver":  # a fork server started before the credentials were set
        import multiprocessing.forkserver

        with monkeypatch.context() as before:
            for name in [k for k in os.environ if k.startswith("AWS_")]:
                before.delenv(name)
            multiprocessing.forkserver.ensure_running()
    local = tmp_path / "tars"
    local.mkdir()
    for s in range(2):
        _tar(local / f"web-{s:03d}.tar", 10)
    url = _upload(s3, local, "convert")
    from typer.testing import CliRunner

    from shardcat.cli import app

    out = tmp_path / "out"
    s3.counter.reset()
    result = CliRunner().invoke(
        app,
        [
            "convert",
            f"{url}/*.tar",
            "-o",
            str(out),
            "--storage-option",
            f"endpoint_url={s3.endpoint}",
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"{url}/web-001.tar -> {out}/web-001.tfrecord (10 records)" in result.output
    # one listing, then each archive: its HEAD and one GET of the whole object
    gets = [p for m, p in _requests(s3, "/convert") if m == "GET" and p.endswith(".tar")]
    assert sorted(gets) == [f"/{BUCKET}/convert/web-000.tar", f"/{BUCKET}/convert/web-001.tar"]
    with Catalog(tmp_path / "c.sqlite") as cat:
        far = cat.ingest(str(out), "far")
        near = cat.ingest(str(local), "near")
        assert (
            far.get_feature("web-000_s007", "jpg")
            == near.get_feature("web-000_s007", "jpg")
            == b"web-000-7" * 50
        )
    # remote sources need a local output directory, and are never deleted
    result = CliRunner().invoke(
        app, ["convert", f"{url}/web-000.tar", "--storage-option", f"endpoint_url={s3.endpoint}"]
    )
    assert result.exit_code != 0
    assert "is remote: give a local --output-dir" in result.output
    result = CliRunner().invoke(
        app,
        [
            "convert",
            f"{url}/web-000.tar",
            "-o",
            str(out),
            "--delete",
            "--storage-option",
            f"endpoint_url={s3.endpoint}",
        ],
    )
    assert result.exit_code != 0
    assert f"--delete removes local archives only, not {url}/web-000.tar" in result.output


# -- migrate, verify -------------------------------------------------------------


def test_migrate_tfd_index_of_shards_moved_to_s3(s3: Any, tmp_path: Path) -> None:
    """tfd-utils' index of local shards, the shards moved to S3 (``--remap``): the
    entries are imported without a re-scan (each shard's sample re-read in one
    merged request), and read back like the local copy; verify reads the remote
    shards in merged requests too."""
    need("tfd_utils", why="shardcat[bench]")
    from legacy_fixtures import tfd_tfrecord_index, write_tfrecords
    from typer.testing import CliRunner

    from shardcat.cli import app

    old = tmp_path / "old"
    paths = write_tfrecords(old, shards=2, per_shard=300)
    index = tfd_tfrecord_index([str(p) for p in paths])
    url = _upload(s3, old, "moved")  # the index goes along: not a shard, never read
    where = tmp_path / "m.sqlite"
    s3.counter.reset()
    result = CliRunner().invoke(
        app,
        [
            "migrate",
            str(index),
            "-c",
            str(where),
            "--remap",
            f"{old}={url}",
            "--storage-option",
            f"endpoint_url={s3.endpoint}",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    import json

    shards = json.loads(result.stdout)["datasets"][0]["shards"]
    assert [(s["path"], s["action"], s["verified"], s["records"]) for s in shards] == [
        (f"{url}/{p.name}", "imported", True, 300) for p in paths
    ]
    gets = [r for r in s3.counter.requests if r[0] == "GET" and r[1].endswith(".tfrecord")]
    first, second = (f"/{BUCKET}/moved/{p.name}" for p in paths)
    frame = 16 + struct.unpack_from("<Q", paths[0].read_bytes())[0]  # the first record's
    # no shard streamed whole for a scan: per shard its first 6 bytes (compressed?)
    # and the 64 sampled records in one merged request; once the first shard's first
    # record and 512 bytes (the format's options, to the record's end as the index
    # says) and one record (the key feature); the ingest reads no head of its own
    # (it takes the options detected)
    assert sorted(gets) == sorted(
        [
            ("GET", first, f"bytes=0-{frame + 511}"),
            ("GET", first, "bytes=0-5"),
            ("GET", first, f"bytes=12-{11 + struct.unpack_from('<Q', paths[0].read_bytes())[0]}"),
            ("GET", first, "bytes=0-5"),
            ("GET", first, f"bytes=0-{paths[0].stat().st_size - 1}"),
            ("GET", second, "bytes=0-5"),
            ("GET", second, f"bytes=0-{paths[1].stat().st_size - 1}"),
        ]
    ), gets
    with Catalog(where) as cat:
        far = cat.dataset("train")
        assert far.options["storage_options"] == {"endpoint_url": s3.endpoint}
        near = cat.ingest([str(p) for p in paths], "near", key="key")
        keys = [f"r{s}_{i}" for s in range(2) for i in range(0, 300, 7)]
        assert far.get_many(keys, raw=True) == near.get_many(keys, raw=True)
        s3.counter.reset()
        assert far.verify() == []
        gets = [r for r in s3.counter.requests if r[0] == "GET"]
        assert len(gets) == 2  # 600 records, one merged request per shard
    result = CliRunner().invoke(app, ["verify", "train", "-c", str(where)])
    assert result.exit_code == 0, result.output
    assert "train: 600 records checked, 0 bad" in result.output
    # an object changed on the store: verify names it
    s3.client.put_object(Bucket=BUCKET, Key=f"moved/{paths[0].name}", Body=b"x" * 10)
    result = CliRunner().invoke(app, ["verify", "train", "-c", str(where)])
    assert result.exit_code == 1
    assert f"{url}/{paths[0].name}: at byte 0: " in result.output
    assert "changed after it was indexed" in result.output


def test_migrate_tfd_tar_index_of_tars_moved_to_http(tmp_path: Path) -> None:
    """tfd-utils' ``.tar_index`` of local archives moved to an HTTP server
    (``--remap``): the options are read off the first archive's first 64 KiB, as a
    remote ingest reads its rule (a tar's options need no more), not a 4 MiB head
    (here the whole 1.7 MB archive, then streamed again to re-index it)."""
    need("tfd_utils", why="shardcat[bench]")
    from legacy_fixtures import tfd_tar_index

    from shardcat.testing.servers import RangeServer

    old = tmp_path / "tars"
    old.mkdir()
    for name in ("a", "b"):
        with tarfile.open(old / f"{name}.tar", "w", format=tarfile.USTAR_FORMAT) as archive:
            for i in range(150):
                for ext, data in (("jpg", bytes([i]) * 10_000), ("cls", b"%d" % i)):
                    member = tarfile.TarInfo(f"{name}{i:03d}.{ext}")
                    member.size = len(data)
                    archive.addfile(member, io.BytesIO(data))
    index = tfd_tar_index(str(old / "*.tar"))
    size = (old / "a.tar").stat().st_size
    assert size == (old / "b.tar").stat().st_size == 1_771_520
    server = RangeServer(str(old))
    server.start()
    try:
        with Catalog(tmp_path / "m.sqlite") as cat:
            server.counter.reset()
            report = cat.migrate(str(index), remap=[f"{old}={server.url}"])
            [made] = report.datasets
            assert [(s.path, s.records) for s in made.shards] == [
                (f"{server.url}/a.tar", 150),
                (f"{server.url}/b.tar", 150),
            ]
            gets = {
                name: sorted(r for m, p, r in server.counter.requests if m == "GET" and p == name)
                for name in ("/a.tar", "/b.tar")
            }
            # the options' head, the compression check, the re-index's one streamed read
            whole = f"bytes=0-{size - 1}"
            assert gets == {
                "/a.tar": sorted(["bytes=0-65535", "bytes=0-5", whole]),
                "/b.tar": sorted(["bytes=0-5", whole]),
            }
            assert _shard_bytes(server.counter.requests, {"/a.tar": size}) == 65_536 + 6 + size
            near = cat.ingest(str(old / "*.tar"), "near", grouping="tfd")
            far = cat.dataset(made.dataset)
            keys = sorted(near.iter_keys())
            assert sorted(far.iter_keys()) == keys and len(keys) == 300
            assert far.get_many(keys[::17], raw=True) == near.get_many(keys[::17], raw=True)
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://me:s3cr3t@{host}/web-000.tar", "http://me:***@{host}/web-000.tar"),
        ("http://{host}/web-000.tar?X-Amz-Signature=s3cr3t", "http://{host}/web-000.tar?..."),
    ],
    ids=["password", "presigned"],
)
def test_convert_lines_show_a_url_without_its_secret(tmp_path: Path, url: str, shown: str) -> None:
    from typer.testing import CliRunner

    from shardcat.cli import app
    from shardcat.testing.servers import RangeServer

    (tmp_path / "www").mkdir()
    _tar(tmp_path / "www" / "web-000.tar", 4)
    server = RangeServer(str(tmp_path / "www"))
    server.start()
    try:
        host = f"127.0.0.1:{server.port}"
        url, shown = url.format(host=host), shown.format(host=host)
        out = tmp_path / "out"
        result = CliRunner().invoke(app, ["convert", url, "-o", str(out)])
        assert result.exit_code == 0, result.output
        assert f"{shown} -> {out}/web-000.tfrecord (4 records)" in result.output
        assert "s3cr3t" not in result.output
        server.stop()  # a failed archive's line too
        result = CliRunner().invoke(app, ["convert", url, "-o", str(tmp_path / "again")])
        assert result.exit_code != 0 and "s3cr3t" not in result.output, result.output
        assert "web-000.tar" in result.output
    finally:
        server.stop()


# -- RecordIO .idx ---------------------------------------------------------------


def _rec_shards(directory: Path, shards: int, records: int, payload: Any, key: Any = None) -> None:
    """``part-<s>.rec`` with its MXNet ``.idx`` in ``directory`` for ``s < shards``:
    record ``i`` has IRHeader label and id ``i``, bytes ``payload(s, i)`` and
    ``.idx`` key ``key(s, i)`` (default ``k<s>_<i>``)."""
    from shardcat.formats.recordio import IRHeader, RecordIOWriter, pack

    directory.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        with RecordIOWriter(directory / f"part-{s}.rec") as w:
            for i in range(records):
                name = f"k{s}_{i}" if key is None else key(s, i)
                w.write(pack(IRHeader(0, float(i), i, 0), payload(s, i)), name)


def test_recordio_keys_from_the_idx_beside_each_rec_on_s3(s3: Any, tmp_path: Path) -> None:
    local = tmp_path / "rec"
    _rec_shards(local, 2, 50, lambda s, i: b"img%d-%d" % (s, i))
    (local / "part-1.idx").rename(tmp_path / "kept.idx")  # part-1 has none on the store
    url = _upload(s3, local, "rec")
    (tmp_path / "kept.idx").rename(local / "part-1.idx")
    with Catalog(tmp_path / "r.sqlite") as cat:
        s3.counter.reset()
        no_idx = r"part-1.rec: no MXNet index part-1.idx beside it"
        with pytest.raises(IngestError, match=no_idx) as e1:
            cat.ingest(f"{url}/*.rec", "far", storage_options=s3.options)
        assert [f.path for f in e1.value.failures] == [f"{url}/part-1.rec"]
        s3.client.upload_file(str(local / "part-1.idx"), BUCKET, "rec/part-1.idx")
        far = cat.ingest(f"{url}/*.rec", "far", storage_options=s3.options)
        near = cat.ingest(str(local / "*.rec"), "near")
        assert far.options["idx"] is near.options["idx"] is True
        assert list(far.iter_keys()) == list(near.iter_keys())
        assert far.get_raw("k1_33") == near.get_raw("k1_33")
        assert far.get_raw("k1_33").endswith(b"img1-33")


@pytest.mark.parametrize("store", ["http", "s3"])
def test_remote_recordio_ingest_fetches_each_idx_once(store: str, s3: Any, tmp_path: Path) -> None:
    """The rule of remote RecordIO shards asks the store whether the first ``.idx``
    exists (one HEAD, no bytes). A new dataset whose ``.idx`` use is not given reads
    every ``.idx`` once to learn whether their keys collide (as a local ingest
    does), then each scan reads its own; with ``idx`` given, each ``.idx`` is
    downloaded once, by its shard's scan. (The rule downloaded the first ``.idx``
    whole too; a re-ingest of unchanged shards downloaded it once more.)"""
    from shardcat.testing.servers import RangeServer

    local = tmp_path / "recidx"
    _rec_shards(local, 3, 200, lambda s, i: bytes([s, i % 251]) * 900)
    sizes = {p.name: p.stat().st_size for p in local.iterdir()}
    http = RangeServer(str(local))
    if store == "http":
        http.start()
        counter, url, prefix = http.counter, http.url + "/part-{0..2}.rec", "/"
        options: dict[str, Any] = {}
    else:
        counter, prefix = s3.counter, f"/{BUCKET}/recidx/"
        url, options = _upload(s3, local, "recidx") + "/*.rec", s3.options

    def idx_requests() -> dict[str, list[tuple[str, str | None]]]:
        out: dict[str, list[tuple[str, str | None]]] = {}
        for method, path, asked in counter.requests:
            if path.endswith(".idx"):
                out.setdefault(path.removeprefix(prefix), []).append((method, asked))
        return out

    def fetched(name: str) -> tuple[str, str]:
        return ("GET", f"bytes=0-{sizes[name] - 1}")

    try:
        with Catalog(tmp_path / "r.sqlite") as cat:
            counter.reset()
            with cat.ingest(url, "checked", storage_options=options) as checked:
                assert checked.options["idx"] is True and len(checked) == 600
            once = [("HEAD", None), fetched("part-0.idx")]
            assert idx_requests() == {  # the rule's HEAD; the keys checked; the scan
                "part-0.idx": [("HEAD", None), *once, *once],
                "part-1.idx": [("HEAD", None), fetched("part-1.idx")] * 2,
                "part-2.idx": [("HEAD", None), fetched("part-2.idx")] * 2,
            }
        with Catalog(tmp_path / "given.sqlite") as cat:  # (a dataset of the same shards
            counter.reset()  # in the same catalog would copy their rows: no scan)
            given = {"idx": True}
            with cat.ingest(url, "far", options=given, storage_options=options) as far:
                assert far.options["idx"] is True and len(far) == 600
                assert far.get_raw("k2_77").endswith(bytes([2, 77]) * 900)
            assert idx_requests() == {
                "part-0.idx": [("HEAD", None), ("HEAD", None), fetched("part-0.idx")],
                "part-1.idx": [("HEAD", None), fetched("part-1.idx")],
                "part-2.idx": [("HEAD", None), fetched("part-2.idx")],
            }
            idx_bytes = sum(
                sizes[name]
                for name, asked in idx_requests().items()
                for method, _ in asked
                if method == "GET"
            )
            assert idx_bytes == sum(v for k, v in sizes.items() if k.endswith(".idx")) == 3 * 2626
            counter.reset()
            cat.ingest(url, "far", options=given, storage_options=options).close()
            # unchanged: the rule's one question about the first .idx, no download
            assert idx_requests() == {"part-0.idx": [("HEAD", None)]}
    finally:
        if store == "http":
            http.stop()


def test_remote_recordio_with_colliding_idx_keys_is_keyed_like_a_local_ingest(
    tmp_path: Path,
) -> None:
    """Shards whose ``.idx`` keys collide (DALI's ``rec2idx`` numbers every file's
    records from 0): keyed by position with each ``.idx`` key in ``idx_key``, with
    the warning saying so, remote as local. A remote ingest failed on the second
    shard with duplicate keys."""
    from shardcat.testing.servers import RangeServer

    local = tmp_path / "dali"
    _rec_shards(local, 3, 40, lambda s, i: b"r%d-%d" % (s, i), key=lambda s, i: str(i))
    http = RangeServer(str(local))
    http.start()
    try:
        with Catalog(tmp_path / "near.sqlite") as cat, pytest.warns(UserWarning) as near_w:
            near = cat.ingest(str(local / "part-*.rec"), "d")
            near_rows = [
                tuple(r) for r in cat.query("SELECT key, idx_key FROM d ORDER BY position")
            ]
            near_raw = [near.get_raw(k) for k in ("0", "45", "119")]
        with Catalog(tmp_path / "far.sqlite") as cat, pytest.warns(UserWarning) as far_w:
            far = cat.ingest(f"{http.url}/part-{{0..2}}.rec", "d")
            assert far.key_rule == "position" and far.options["idx"] == "column"
            rows = cat.query("SELECT key, idx_key FROM d ORDER BY position")
            assert [tuple(r) for r in rows] == near_rows
            assert [far.get_raw(k) for k in ("0", "45", "119")] == near_raw
            assert far.get_raw("45").endswith(b"r1-5")
        for caught in (near_w, far_w):
            (message,) = [str(w.message) for w in caught if ".idx keys collide" in str(w.message)]
            assert "'0' is in part-0.idx and in part-1.idx (and 79 more keys)" in message
        assert near_rows[45] == ("45", "5")
    finally:
        http.stop()


@pytest.mark.parametrize(
    "given", [{"options": {"idx": False}}, {"key": None}], ids=["idx-off", "by-position"]
)
def test_remote_recordio_scan_that_does_not_read_the_idx_does_not_fetch_it(
    given: dict[str, Any], tmp_path: Path
) -> None:
    """Options under which a scan ignores the ``.idx`` (``idx=False``; keyed by
    position): no shard's ``.idx`` is downloaded (each was, whole, for nothing)."""
    from shardcat.testing.servers import RangeServer

    local = tmp_path / "noidx"
    _rec_shards(local, 2, 50, lambda s, i: b"r%d-%d" % (s, i))
    http = RangeServer(str(local))
    http.start()
    try:
        with (
            Catalog(tmp_path / "r.sqlite") as cat,
            cat.ingest(f"{http.url}/part-{{0..1}}.rec", "far", **given) as far,
        ):
            assert far.key_rule == "position" and len(far) == 100
            assert far.get_raw(75).endswith(b"r1-25")
        gets = [p for m, p, _ in http.counter.requests if m == "GET" and p.endswith(".idx")]
        assert gets == []
    finally:
        http.stop()


# -- ingest judges shards from the listing ---------------------------------------


@pytest.mark.parametrize("start", ["fork", "forkserver"])
def test_ingest_judges_listed_objects_without_a_head_each(
    s3: Any, tmp_path: Path, start: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers forked or started by a fork server (beside other threads) alike: the
    latter are handed what the listing said."""
    from legacy_fixtures import write_tfrecords

    monkeypatch.setenv(START_METHOD_ENV, start)

    local = tmp_path / "listed"
    paths = write_tfrecords(local, shards=4, per_shard=20)
    url = _upload(s3, local, "listed")
    with Catalog(tmp_path / "l.sqlite") as cat:
        s3.counter.reset()
        assert len(cat.ingest(f"{url}/*.tfrecord", "far", storage_options=s3.options)) == 80
        methods = [(m, p.endswith(".tfrecord")) for m, p, _ in s3.counter.requests]
        # one listing of the bucket; per object: its GETs (the first shard's first
        # 64 KiB once, for the rule; each shard streamed once), no HEAD
        assert methods.count(("GET", False)) == 1
        assert [m for m, _ in methods].count("HEAD") == 0
        assert methods.count(("GET", True)) == 1 + 4
        s3.counter.reset()
        assert len(cat.ingest(f"{url}/*.tfrecord", "far", storage_options=s3.options)) == 80
        # unchanged: the listing and the rule's 64 KiB head, nothing per object
        assert [(m, p.endswith(".tfrecord")) for m, p, _ in s3.counter.requests] == [
            ("GET", False),
            ("GET", True),
        ]
        # one object replaced: the listing's ETag says so, it alone is read again
        s3.client.put_object(
            Bucket=BUCKET, Key=f"listed/{paths[1].name}", Body=paths[2].read_bytes()
        )
        s3.counter.reset()
        with pytest.raises(IngestError, match="duplicate key 'r2_0'") as e2:
            cat.ingest(f"{url}/*.tfrecord", "far", storage_options=s3.options)
        assert [f.path for f in e2.value.failures] == [f"{url}/{paths[1].name}"]
        assert [m for m, _, _ in s3.counter.requests].count("HEAD") == 0
        objects = [p.rsplit("/", 1)[-1] for m, p, _ in s3.counter.requests if p.endswith("d")]
        assert objects == [paths[0].name, paths[1].name]  # the format's head; the changed one


def test_ingest_rule_read_off_a_first_record_longer_than_the_head(s3: Any, tmp_path: Path) -> None:
    """The rule of remote shards is read off the first shard's first record: its
    first 64 KiB, then the rest of a longer first record (here a 200 KB
    SequenceExample, so ``message`` is ``sequence_example``) in one more request;
    never the 4 MiB head it was."""
    from shardcat.formats.tfrecord import TFRecordWriter
    from shardcat.pb2 import (
        BytesList,
        Feature,
        FeatureList,
        FeatureLists,
        Features,
        SequenceExample,
    )

    def seq(key: str, frames: int) -> bytes:
        frame = Feature(bytes_list=BytesList(value=[bytes(range(256)) * 40]))
        return SequenceExample(
            context=Features(feature={"key": Feature(bytes_list=BytesList(value=[key.encode()]))}),
            feature_lists=FeatureLists(feature_list={"f": FeatureList(feature=[frame] * frames)}),
        ).SerializeToString()

    (tmp_path / "seq").mkdir()
    path = tmp_path / "seq" / "clips.tfrecord"
    first = seq("c0", 20)
    with TFRecordWriter(path) as w:
        for payload in [first, *(seq(f"c{i}", 1) for i in range(1, 400))]:
            w.write(payload)
    assert len(first) > 64 << 10 and path.stat().st_size > 4 << 20
    url = _upload(s3, tmp_path / "seq", "seq")
    with Catalog(tmp_path / "q.sqlite") as cat:
        s3.counter.reset()
        with cat.ingest(f"{url}/clips.tfrecord", "clips", storage_options=s3.options) as reader:
            assert reader.options["message"] == "sequence_example"
            assert len(reader) == 400
        end = 12 + len(first) + 4
        gets = [r for m, p, r in s3.counter.requests if m == "GET" and p.endswith("clips.tfrecord")]
        assert gets[:2] == ["bytes=0-65535", f"bytes=65536-{end - 1}"]
        # then the shard streamed once for its scan (no 4 MiB head of the rule)
        assert gets[2:] == [f"bytes=0-{path.stat().st_size - 1}"]


# -- Parquet ---------------------------------------------------------------------


def test_parquet_rows_on_s3_are_their_row_group_and_footer(s3: Any, tmp_path: Path) -> None:
    pa = need("pyarrow", why="shardcat[parquet]")
    import pyarrow.parquet as pq

    local = tmp_path / "pq"
    local.mkdir()
    for s in range(2):
        table = pa.table(
            {
                "key": [f"p{s}_{i}" for i in range(100)],
                "image": [os.urandom(500) for _ in range(100)],
                "label": list(range(100)),
            }
        )
        pq.write_table(table, local / f"part-{s}.parquet", row_group_size=10)
    url = _upload(s3, local, "pq")
    with Catalog(tmp_path / "p.sqlite") as cat:
        far = cat.ingest(f"{url}/*.parquet", "far", storage_options=s3.options)
        near = cat.ingest(str(local), "near")
        assert len(far) == len(near) == 200
        assert cat.query("SELECT sum(label) FROM far")[0][0] == 2 * sum(range(100))
        far.get_record("p0_0")  # the source opened
        s3.counter.reset()
        row = far.get_record("p1_57")
        assert row == near.get_record("p1_57") and row["label"] == 57
        ranges = [r for m, _, r in s3.counter.requests if m == "GET"]
        assert len(ranges) == len(s3.counter.requests) == 2, ranges  # row group, footer
        keys = [f"p{i % 2}_{i}" for i in range(0, 100, 3)]
        assert far.get_many(keys) == near.get_many(keys)
        assert far.verify() == []


# -- a PostgreSQL catalog over S3 shards -----------------------------------------


def test_postgres_catalog_with_shards_on_s3(s3: Any, tmp_path: Path) -> None:
    from shardcat.testing.postgres import find_binaries, postgres_server

    need("psycopg", why="shardcat[postgres]")
    if find_binaries() is None:
        missing("the PostgreSQL server binaries")
    from shardcat import TFRecordWriter, make_example

    local = tmp_path / "pg"
    local.mkdir()
    paths = [local / f"pg-{s}.tfrecord" for s in range(3)]
    for s, path in enumerate(paths):
        with TFRecordWriter(path) as w:
            for i in range(50):
                image = f"img {s} {i} ".encode() * (20 + i)
                w.write(make_example({"key": f"r{s}_{i}", "label": i % 7, "image": image}))
    url = _upload(s3, local, "pg")
    options = {**s3.options, "key": "testing", "secret": "testing"}
    with postgres_server() as server:
        with Catalog(server) as cat:
            far = cat.ingest(f"{url}/*.tfrecord", "far", storage_options=options, workers=2)
            assert len(far) == 150
            assert cat.info("far").options["storage_options"] == s3.options  # no secrets
        with Catalog(tmp_path / "local.sqlite") as near_cat, Catalog(server) as cat:
            near = near_cat.ingest([str(p) for p in paths], "near")
            far = cat.dataset("far")
            keys = [f"r{s}_{i}" for s in range(3) for i in range(0, 50, 4)]
            assert far.get_many(keys, raw=True) == near.get_many(keys, raw=True)
            s3.counter.reset()
            assert far.get_raw("r2_33") == near.get_raw("r2_33")
            assert [m for m, _, _ in s3.counter.requests] == ["GET"]  # one ranged GET
            assert cat.query("SELECT count(*) FROM far WHERE label = 3")[0][0] == 3 * 7
            assert far.verify() == []


# -- migrate of per-shard text indexes stored beside remote shards -------------------


def _legacy_tree(root: Path) -> dict[str, list[Path]]:
    """DALI ``tfrecord2idx`` indexes beside two TFRecord shards (``tf/``) and MXNet
    ``.idx`` files beside two RecordIO shards (``rec/``): ~1.5 MB per shard."""
    from legacy_fixtures import tfrecord2idx

    from shardcat.formats.tfrecord import TFRecordWriter, make_example

    (root / "tf").mkdir(parents=True)
    _rec_shards(root / "rec", 2, 600, lambda s, i: bytes([s, i % 251]) * 1250)
    rec = [root / "rec" / f"part-{s}.rec" for s in range(2)]
    tf = []
    for s in range(2):
        path = root / "tf" / f"train-{s:05d}.tfrecord"
        with TFRecordWriter(path) as w:
            for i in range(600):
                w.write(make_example({"key": f"t{s}_{i}", "payload": bytes([s, i % 251]) * 1250}))
        tfrecord2idx(path, root / "tf" / f"train-{s:05d}.tfrecord.idx")
        tf.append(path)
    return {"tf": tf, "rec": rec}


def _shard_bytes(requests: list[tuple[str, str, str | None]], sizes: dict[str, int]) -> int:
    """The shard bytes the GETs asked for (their ranges, clamped to the objects)."""
    total = 0
    for method, path, asked in requests:
        size = sizes.get(path)
        if method != "GET" or size is None:
            continue
        if asked is None:
            total += size
            continue
        start, _, end = asked.removeprefix("bytes=").partition("-")
        total += min(int(end or size - 1), size - 1) - int(start) + 1
    return total


def test_migrate_text_indexes_beside_shards_on_s3(s3: Any, tmp_path: Path) -> None:
    """``catalog migrate s3://bucket/prefix/``: one listing of the prefix (no HEAD),
    each index downloaded once, the shards never downloaded (their sample re-read),
    the entries imported without a re-scan, equal to a local migrate of the files."""
    from typer.testing import CliRunner

    from shardcat.cli import app

    local = tmp_path / "legacy"
    shards = _legacy_tree(local)
    for sub in ("tf", "rec"):
        for path in sorted((local / sub).iterdir()):
            s3.client.upload_file(str(path), BUCKET, f"legacy/{sub}/{path.name}")
    url = f"s3://{BUCKET}/legacy"
    where = tmp_path / "far.sqlite"
    s3.counter.reset()
    result = CliRunner().invoke(
        app,
        [
            "migrate",
            url + "/",
            "-c",
            str(where),
            "--sample",
            "4",
            "--storage-option",
            f"endpoint_url={s3.endpoint}",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    import json

    report = json.loads(result.stdout)
    got = {
        d["dataset"]: [
            (s["path"], s["legacy"], s["action"], s["verified"], s["records"]) for s in d["shards"]
        ]
        for d in report["datasets"]
    }
    assert got == {
        "train": [
            (f"{url}/tf/{p.name}", f"{url}/tf/{p.name}.idx", "imported", True, 600)
            for p in shards["tf"]
        ],
        "part": [
            (f"{url}/rec/{p.name}", f"{url}/rec/{p.stem}.idx", "imported", True, 600)
            for p in shards["rec"]
        ],
    }
    requests = list(s3.counter.requests)
    # discovery: one listing of the prefix, then per index file one download and one
    # 512-byte read of the shard beside it (its format)
    discovery = [(f"/{BUCKET}", None)]
    for sub, index, shard, size in (
        ("rec", "part-0.idx", "part-0.rec", 8448),
        ("rec", "part-1.idx", "part-1.rec", 8448),
        ("tf", "train-00000.tfrecord.idx", "train-00000.tfrecord", 7362),
        ("tf", "train-00001.tfrecord.idx", "train-00001.tfrecord", 7362),
    ):
        discovery += [
            (f"/{BUCKET}/legacy/{sub}/{index}", f"bytes=0-{size - 1}"),
            (f"/{BUCKET}/legacy/{sub}/{shard}", "bytes=0-511"),
        ]
    assert [(p, r) for _, p, r in requests[:9]] == discovery
    # no HEAD but the ingest's one per shard as it commits (is it still that version?)
    heads = sorted(p for m, p, _ in requests if m == "HEAD")
    assert heads == sorted(
        f"/{BUCKET}/legacy/{p.parent.name}/{p.name}" for s in shards.values() for p in s
    )
    sizes = {
        f"/{BUCKET}/legacy/{p.parent.name}/{p.name}": p.stat().st_size
        for s in shards.values()
        for p in s
    }
    # the shards are never downloaded: per shard 512 bytes (its format, pairing it
    # with its index), 6 (compressed?), the 4 sampled records, and for each dataset's
    # first shard its first record (options, which the ingest takes as detected)
    fetched = {p: _shard_bytes([r for r in requests if r[1] == p], sizes) for p in sizes}
    # (before the ingest took them: 3.1 MB of the 6.1 MB, each first shard whole)
    assert sum(fetched.values()) < sum(sizes.values()) / 100
    for path, size in sizes.items():
        assert fetched[path] < size / 100, (path, fetched[path], size)
    indexes = [p for m, p, _ in requests if m == "GET" and p.endswith(".idx")]
    # each index file once (the ingest takes the options detected, no second look)
    assert sorted(indexes) == [
        f"/{BUCKET}/legacy/{name}"
        for name in [
            "rec/part-0.idx",
            "rec/part-1.idx",
            "tf/train-00000.tfrecord.idx",
            "tf/train-00001.tfrecord.idx",
        ]
    ]
    with Catalog(tmp_path / "near.sqlite") as near_cat:
        near_report = near_cat.migrate(str(local))
        assert sorted(d.dataset for d in near_report.datasets) == ["part", "train"]
        with Catalog(where) as far_cat:
            for name in ("train", "part"):
                far, near = far_cat.dataset(name), near_cat.dataset(name)
                assert far.options["storage_options"] == {"endpoint_url": s3.endpoint}
                keys = list(near.iter_keys())
                assert list(far.iter_keys()) == keys and len(keys) == 1200
                picked = keys[::37]
                assert far.get_many(picked, raw=True) == near.get_many(picked, raw=True)
    from legacy_fixtures import dump

    for name in ("train", "part"):  # the same entries, but for where the shards are
        far_dump, near_dump = dump(where, name), dump(tmp_path / "near.sqlite", name)
        assert [r[1:] for r in far_dump["records"]] == [r[1:] for r in near_dump["records"]]
        assert len(far_dump["records"]) == 1200


def test_migrate_remote_text_indexes_dry_run_globs_and_errors(s3: Any, tmp_path: Path) -> None:
    """``Catalog.migrate`` of a glob of remote shards (their indexes beside them),
    ``--dry-run`` writes nothing; a malformed index, an index with no shard beside
    it and a prefix with nothing are errors naming the URL."""
    from legacy_fixtures import tfrecord2idx
    from typer.testing import CliRunner

    from shardcat.cli import app
    from shardcat.errors import CatalogError, LegacyIndexError

    local = tmp_path / "legacy"
    shards = _legacy_tree(local)
    for path in sorted((local / "tf").iterdir()):
        s3.client.upload_file(str(path), BUCKET, f"errs/{path.name}")
    url = f"s3://{BUCKET}/errs"
    where = tmp_path / "dry.sqlite"
    result = CliRunner().invoke(
        app,
        [
            "migrate",
            f"{url}/*.tfrecord",
            "-c",
            str(where),
            "--dry-run",
            "--storage-option",
            f"endpoint_url={s3.endpoint}",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    import json

    report = json.loads(result.stdout)
    assert report["dry_run"] is True
    [dataset] = report["datasets"]
    assert dataset["dataset"] == "train" and dataset["format"] == "tfrecord"
    assert [(s["path"], s["action"], s["verified"], s["records"]) for s in dataset["shards"]] == [
        (f"{url}/{p.name}", "import", True, 600) for p in shards["tf"]
    ]
    assert not where.exists()
    # one shard of the glob: only its index is read
    with Catalog(tmp_path / "one.sqlite") as cat:
        one = cat.migrate(f"{url}/train-0000[1].tfrecord", storage_options=s3.options)
        [made] = one.datasets
        assert [(s.path, s.action) for s in made.shards] == [
            (f"{url}/train-00001.tfrecord", "imported")
        ]
        far = cat.dataset(made.dataset)
        with Catalog(tmp_path / "near.sqlite") as near_cat:
            [near_made] = near_cat.migrate(str(shards["tf"][1])).datasets
            near = near_cat.dataset(near_made.dataset)
            keys = list(near.iter_keys())
            assert list(far.iter_keys()) == keys and len(keys) == 600
            assert far.get_many(keys[::50], raw=True) == near.get_many(keys[::50], raw=True)
    # an index whose shard is not on the store: skipped, named with the reason; named
    # explicitly, an error naming the URL
    tfrecord2idx(shards["tf"][0], tmp_path / "lone.tfrecord.idx")
    s3.client.upload_file(str(tmp_path / "lone.tfrecord.idx"), BUCKET, "errs/lone.tfrecord.idx")
    with Catalog(tmp_path / "e.sqlite") as cat:
        report = cat.migrate(url + "/", storage_options=s3.options, dry_run=True)
        assert dict(report.skipped)[f"{url}/lone.tfrecord.idx"].startswith(
            f"{url}/lone.tfrecord.idx: cannot tell which shard this"
        )
        [made] = report.datasets
        assert [(s.path, s.action) for s in made.shards] == [
            (f"{url}/{p.name}", "import") for p in shards["tf"]
        ]
        # a folder named without its slash: the same (one listing of its folder first)
        again = cat.migrate(url, storage_options=s3.options, dry_run=True)
        assert again.skipped == report.skipped
        assert [s.path for s in again.datasets[0].shards] == [s.path for s in made.shards]
        with pytest.raises(CatalogError, match=f"^{url}/lone.tfrecord.idx: cannot tell which"):
            cat.migrate(f"{url}/lone.tfrecord.idx", storage_options=s3.options)
        # a malformed index: the URL and the line
        s3.client.put_object(
            Bucket=BUCKET, Key="errs/train-00001.tfrecord.idx", Body=b"0 2556\n2556 x\n"
        )
        with pytest.raises(LegacyIndexError) as caught:
            cat.migrate(url + "/", storage_options=s3.options)
        assert str(caught.value) == (
            f"{url}/train-00001.tfrecord.idx: at byte 7: expected '<offset> <size>', found '2556 x'"
        )
        with pytest.raises(CatalogError, match=f"no objects match '{url}/none/'"):
            cat.migrate(f"{url}/none/", storage_options=s3.options)


def test_migrate_tfd_index_stored_beside_its_shards_on_s3(s3: Any, tmp_path: Path) -> None:
    """A tfd-utils pickle uploaded with its shards: its shards are the objects of the
    same name beside it (re-rooted), imported verified as with ``--remap``."""
    need("tfd_utils", why="shardcat[bench]")
    from legacy_fixtures import tfd_tfrecord_index, write_tfrecords

    old = tmp_path / "old"
    paths = write_tfrecords(old, shards=2, per_shard=50)
    index = tfd_tfrecord_index([str(p) for p in paths])
    url = _upload(s3, old, "tfdbeside")
    with Catalog(tmp_path / "t.sqlite") as cat:
        report = cat.migrate(f"{url}/", storage_options=s3.options)
        [made] = report.datasets
        assert made.legacy == [f"{url}/{index.name}"]
        assert [(s.path, s.action, s.resolved_by, s.records) for s in made.shards] == [
            (f"{url}/{p.name}", "imported", "re-rooted beside the index", 50) for p in paths
        ]
        near = cat.ingest([str(p) for p in paths], "near", key="key")
        keys = [f"r{s}_{i}" for s in range(2) for i in range(0, 50, 7)]
        assert cat.dataset(made.dataset).get_many(keys, raw=True) == near.get_many(keys, raw=True)


# -- drop-in readers given a tfd-utils index_file, their shards on object storage -------


def test_tfrecord_random_access_on_s3_with_a_tfd_index_file(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``TFRecordRandomAccess("s3://.../*.tfrecord", index_file=<tfd-utils index>)``,
    the index local (made over the local copies) or on the store beside the shards:
    its entries imported (verified through the remote source, no re-scan), once; the
    records and entries equal those of the same reader call on the local shards."""
    need("tfd_utils", why="shardcat[bench]")
    import shutil
    import warnings

    from legacy_fixtures import dump, indexed_at, tfd_tfrecord_index, write_tfrecords

    from shardcat import TFRecordRandomAccess
    from shardcat.sources import remote

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    old = tmp_path / "old"
    paths = write_tfrecords(old, shards=2, per_shard=300)
    index = tfd_tfrecord_index([str(p) for p in paths], index_file=old / "train.index")
    url = _upload(s3, old, "dropin")  # the index goes along
    (tmp_path / "near").mkdir()
    near_index = tmp_path / "near" / "train.index"  # the same index, for the local reader
    shutil.copy(index, near_index)
    with pytest.warns(UserWarning, match="2 shards imported"):
        near = TFRecordRandomAccess(str(old / "*.tfrecord"), index_file=str(near_index))
    keys = [f"r{s}_{i}" for s in range(2) for i in range(0, 300, 7)]
    remote.configure("s3", endpoint_url=s3.endpoint)
    try:
        with near:
            for given in (str(index), f"{url}/train.index"):
                with pytest.warns(UserWarning, match="2 shards imported; each shard checked"):
                    far = TFRecordRandomAccess(f"{url}/*.tfrecord", index_file=given)
                with far:
                    if given == str(index):
                        assert far.index_file == f"{index}.shardcat.sqlite"
                    else:  # no "beside it" on the store: the per-user cache directory
                        assert Path(far.index_file).parent == tmp_path / "cache" / "shardcat"
                    assert far.tfrecord_files == [f"{url}/{p.name}" for p in paths]
                    assert sorted(far.get_keys()) == sorted(near.get_keys())
                    assert far.get_many(keys, raw=True) == near.get_many(keys, raw=True)
                    assert far.get_feature("r1_9", "label") == near.get_feature("r1_9", "label")
                    catalog, name = Path(far.index_file), far.dataset
                got = dump(catalog, name)
                want = dump(Path(near.index_file), near.dataset)
                assert [r[1:] for r in got["records"]] == [r[1:] for r in want["records"]]
                assert [s[0] for s in got["shards"]] == [f"{url}/{p.name}" for p in paths]
                assert [s[-2] for s in got["shards"]] == ["ready", "ready"]
                before = indexed_at(catalog)
                s3.counter.reset()
                with warnings.catch_warnings():
                    warnings.simplefilter("error")  # imported already: no warning, no import
                    with TFRecordRandomAccess(f"{url}/*.tfrecord", index_file=given) as again:
                        assert again.get_many(keys, raw=True) == near.get_many(keys, raw=True)
                assert indexed_at(catalog) == before
                # the index is not read again (a remote one: asked for its identity only)
                assert [m for m, p, _ in s3.counter.requests if p.endswith(".index")] == (
                    [] if given == str(index) else ["HEAD"]
                )
    finally:
        remote._configured.pop("s3", None)


def test_reader_given_a_remote_index_file_that_is_missing_corrupt_or_no_index(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need("tfd_utils", why="shardcat[bench]")
    from legacy_fixtures import write_tfrecords

    from shardcat import CatalogError, TFRecordRandomAccess
    from shardcat.errors import LegacyIndexError
    from shardcat.sources import remote

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    write_tfrecords(tmp_path / "d", shards=1, per_shard=5)
    url = _upload(s3, tmp_path / "d", "badindex")
    s3.client.put_object(Bucket=BUCKET, Key="badindex/cut.index", Body=b"\x80\x04}\x94(\x8c")
    s3.client.put_object(Bucket=BUCKET, Key="badindex/notes.index", Body=b"hello\n")
    remote.configure("s3", endpoint_url=s3.endpoint)
    try:
        with pytest.raises(CatalogError, match=f"^index_file {url}/gone.index does not exist"):
            TFRecordRandomAccess(f"{url}/*.tfrecord", index_file=f"{url}/gone.index")
        with pytest.raises(LegacyIndexError, match=f"^{url}/cut.index: at byte "):
            TFRecordRandomAccess(f"{url}/*.tfrecord", index_file=f"{url}/cut.index")
        with pytest.raises(CatalogError, match=f"^index_file {url}/notes.index is not a tfd-utils"):
            TFRecordRandomAccess(f"{url}/*.tfrecord", index_file=f"{url}/notes.index")
        assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").rglob("*.sqlite"))
    finally:
        remote._configured.pop("s3", None)


def test_tar_random_access_on_s3_with_a_tfd_tar_index_file(s3: Any, tmp_path: Path) -> None:
    """``TarRandomAccess("s3://.../*.tar", index_file=<tfd-utils .tar_index>)``: the
    index's archives placed onto the reader's remote ones by name; a remote archive
    is re-indexed from its data (one streamed read: its headers are not walked with
    a request each), and read as the same call on the local archives reads it."""
    need("tfd_utils", why="shardcat[bench]")
    from legacy_fixtures import tfd_tar_index

    from shardcat import TarRandomAccess
    from shardcat.sources import remote

    old = tmp_path / "tars"
    old.mkdir()
    for name in ("a", "b"):
        _tar(old / f"{name}.tar", 20)
    index = tfd_tar_index(str(old / "*.tar"))
    url = _upload(s3, old, "dropintar")
    with TarRandomAccess(str(old / "*.tar"), index_file=tmp_path / "near.sqlite") as near:
        remote.configure("s3", endpoint_url=s3.endpoint)
        try:
            with pytest.warns(UserWarning, match="tar index.*2 shards re-indexed; each shard"):
                far = TarRandomAccess(f"{url}/*.tar", index_file=str(index))
            with far:
                keys = sorted(near.get_keys())
                assert sorted(far.get_keys()) == keys and len(keys) == 40
                assert [far.get_record(k) for k in keys] == [near.get_record(k) for k in keys]
        finally:
            remote._configured.pop("s3", None)
