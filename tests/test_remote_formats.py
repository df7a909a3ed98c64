"""Every built-in container format, plain and compressed, ingested from an HTTP
server and from a WebHDFS server on loopback reads back exactly what the same
shards ingested locally give (the format contract's writers and records), record
by record and in batches; a compressed shard's record costs a bounded number of
requests (on WebHDFS: of OPENs, each a NameNode redirect and a DataNode read, and
at most one status check after each)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_contract as contracts

from shardcat import Catalog
from shardcat.testing.formats import BIG_RECORDS, COMPRESSORS, RECORDS
from shardcat.testing.required import need
from shardcat.testing.servers import RangeServer, WebHDFSServer

need("aiohttp", "fsspec", why="shardcat[remote] (fsspec, aiohttp)")

CASES = [
    (cls, compression)
    for cls in (
        contracts.TestTFRecord,
        contracts.TestTar,
        contracts.TestRecordIO,
        contracts.TestParquet,
    )
    for compression in (None, *cls.COMPRESSIONS)
]


@pytest.fixture(scope="module")
def servers(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[RangeServer, WebHDFSServer]]:
    """An HTTP server and a WebHDFS server over one directory."""
    root = str(tmp_path_factory.mktemp("www"))
    www, hdfs = RangeServer(root), WebHDFSServer(root)
    www.start()
    hdfs.start()
    try:
        yield www, hdfs
    finally:
        www.stop()
        hdfs.stop()


@pytest.mark.parametrize("store", ["http", "webhdfs"])
@pytest.mark.parametrize(
    ("contract", "compression"),
    CASES,
    ids=[f"{c.FORMAT}-{z or 'plain'}" for c, z in CASES],
)
def test_remote_reads_equal_local(
    servers: tuple[RangeServer, WebHDFSServer],
    tmp_path: Path,
    contract: Any,
    compression: str | None,
    store: str,
) -> None:
    www, hdfs = servers
    case = contract()
    name = f"{case.FORMAT}-{compression or 'plain'}-{store}"
    root = Path(www.root) / name
    root.mkdir()
    shards = [case.shard_path(root, i) for i in range(2)]
    for shard in shards:
        case.write(
            shard,
            BIG_RECORDS if shard == shards[0] else [(f"s1_{k}", f) for k, f in RECORDS],
        )
    if compression is not None:
        need(COMPRESSORS[compression][2], why="shardcat[compressed]")
        shards = [case.compressed_copy(s, compression) for s in shards]
        for original in root.iterdir():
            if original not in shards and not original.name.endswith(".idx"):
                original.unlink()
    base = www.url if store == "http" else hdfs.url
    urls = [f"{base}/{name}/{s.name}" for s in shards]
    with Catalog(tmp_path / "c.sqlite") as cat:
        far = cat.ingest(urls, "far")  # RecordIO: keyed by the .idx beside each .rec
        near = cat.ingest([str(s) for s in shards], "near")
        assert len(far) == len(near) > 0
        assert far.options.get("idx") == near.options.get("idx")
        if case.FORMAT == "recordio" and compression is None:
            assert far.options["idx"] is True
            assert (
                list(far.iter_keys())
                == list(near.iter_keys())
                == [k for k, _ in BIG_RECORDS] + [f"s1_{k}" for k, _ in RECORDS]
            )
        everything = list(range(len(near)))
        # Parquet's raw record is a container naming its file: compare the rows
        raw = case.FORMAT != "parquet"
        assert far.get_many_at(everything, raw=raw) == near.get_many_at(everything, raw=raw)
        with cat.dataset("far") as fresh:  # a source opened for this read
            www.counter.reset()
            hdfs.counter.reset()
            last = len(near) - 1
            assert fresh.get_record_at(last, raw=raw) == near.get_record_at(last, raw=raw)
            # xz: opening reads the stream's footer and block index, at its end;
            # a Parquet row: its row group and the footer, two ranges
            bound = {None: 1, "gzip": 2, "bz2": 2, "xz": 5}[compression] + (not raw)
            if store == "http":
                assert 1 <= len(www.counter.requests) <= bound
            else:
                ops = hdfs.ops()
                assert 1 <= ops.count("OPEN") == ops.count("DATANODE") <= bound
                assert 1 <= ops.count("GETFILESTATUS") <= ops.count("OPEN")
                assert len(ops) == 2 * ops.count("OPEN") + ops.count("GETFILESTATUS")
