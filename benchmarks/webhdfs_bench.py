"""Shards on HDFS through WebHDFS (the test suite's WebHDFS server on loopback: a
NameNode that redirects OPEN to a DataNode listener), in one run, interleaved
round by round (medians).

``python -m benchmarks.webhdfs_bench [--shards 4] [--mb 8] [--reads 200] [--rounds 5]``

One random record's ``get_feature`` three ways: shardcat as shipped (OPEN with
offset/length, then GETFILESTATUS proving the fileId: the change check), shardcat
with that check left out (what a read costs without it: the price of the check),
and fsspec's own ``cat_file(path, start, end)`` on the same filesystem (what
shardcat did for "other protocols" before). Reports ms per record, the requests
and body bytes the servers counted per record; and ``get_many`` of 1,000 random
keys (requests, ms). Loopback has no network latency: a real cluster adds a
round trip per request, which is what the request counts stand for.
"""

from __future__ import annotations

import argparse
import random
import statistics
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

from shardcat import Catalog, TFRecordWriter
from shardcat.sources import remote
from shardcat.testing.servers import WebHDFSServer

from .remote_bench import PAYLOAD, _example
from .util import print_table


def _shards(root: Path, shards: int, mb: int) -> int:
    per = mb * 1024 * 1024 // (PAYLOAD + 60)
    rng = random.Random(1)
    for s in range(shards):
        with TFRecordWriter(root / f"train-{s:05d}.tfrecord") as w:
            for i in range(per):
                w.write(_example(f"r{s}_{i}", rng.randbytes(PAYLOAD)))
    return per


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--mb", type=int, default=8)
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "hdfs"
        (root / "train").mkdir(parents=True)
        per = _shards(root / "train", args.shards, args.mb)
        server = WebHDFSServer(str(root))
        server.start()
        try:
            _run(server, Path(tmp) / "c.sqlite", per, args)
        finally:
            server.stop()


def _run(server: WebHDFSServer, where: Path, per: int, args: Any) -> None:
    root = Path(server.root) / "train"
    rng = random.Random(7)
    with Catalog(where) as cat:
        reader = cat.ingest(f"{server.url}/train/*.tfrecord", "train")
        places = _locations(root, f"{server.url}/train")
        fs = remote.filesystem(server.url + "/")
        keys = [f"r{rng.randrange(args.shards)}_{rng.randrange(per)}" for _ in range(args.reads)]
        for key in keys[:8]:
            reader.get_raw(key)  # sources opened, connections warm

        def checked(key: str) -> None:
            reader.get_raw(key)

        def unchecked(key: str) -> None:
            for source in reader._pool.sources.values():  # the check left out
                source._after = False  # type: ignore[attr-defined]
            try:
                reader.get_raw(key)
            finally:
                for source in reader._pool.sources.values():
                    source._after = True  # type: ignore[attr-defined]

        def cat_file(key: str) -> None:
            shard, i = key[1:].split("_")
            path, offset, length = places[int(shard)][int(i)]
            fs.cat_file(path, start=offset, end=offset + length)

        ways = {"shardcat (status after the read)": checked}
        ways |= {"shardcat, no change check": unchecked, "fsspec cat_file": cat_file}
        times: dict[str, list[float]] = {name: [] for name in ways}
        counts: dict[str, tuple[float, float]] = {}
        for _ in range(args.rounds):
            for name, way in ways.items():  # interleaved
                server.counter.reset()
                start = time.perf_counter()
                for key in keys:
                    way(key)
                times[name].append((time.perf_counter() - start) / len(keys) * 1000)
                counts[name] = (
                    len(server.counter.requests) / len(keys),
                    server.counter.body_bytes / len(keys),
                )
        table = [
            [
                name,
                f"{statistics.median(times[name]):.2f}",
                f"{counts[name][0]:.2f}",
                f"{counts[name][1]:,.0f}",
            ]
            for name in ways
        ]
        print_table(["one random record", "ms", "requests", "bytes"], table)
        batch = [f"r{rng.randrange(args.shards)}_{rng.randrange(per)}" for _ in range(1000)]
        spent = []
        for _ in range(args.rounds):
            server.counter.reset()
            start = time.perf_counter()
            reader.get_many(batch, raw=True)
            spent.append((time.perf_counter() - start) * 1000)
        ops = server.ops()
        print_table(
            ["get_many of 1,000", "ms", "requests", "OPEN", "GETFILESTATUS"],
            [
                [
                    "shardcat",
                    f"{statistics.median(spent):.1f}",
                    str(len(ops)),
                    str(ops.count("OPEN")),
                    str(ops.count("GETFILESTATUS")),
                ]
            ],
        )
        reader.close()


def _locations(root: Path, url: str) -> dict[int, list[tuple[str, int, int]]]:
    """Each shard's records as ``(shard URL, offset, length)`` (the TFRecord framing
    read off the local files the server serves), by shard number."""
    out: dict[int, list[tuple[str, int, int]]] = {}
    for s, path in enumerate(sorted(root.glob("*.tfrecord"))):
        data, at, found = path.read_bytes(), 0, []
        while at < len(data):
            length = struct.unpack_from("<Q", data, at)[0]
            found.append((f"{url}/{path.name}", at, 16 + length))
            at += 16 + length
        out[s] = found
    return out


if __name__ == "__main__":
    main()
