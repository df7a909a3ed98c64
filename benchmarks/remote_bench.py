"""Shards on S3 (moto's S3 server on loopback) against the same shards on local
disk, in one run.

``python -m benchmarks.remote_bench [--shards 4] [--mb 8] [--reads 300] [--rounds 5]``

Measures, interleaved round by round (medians): ``get_feature`` latency of one
random record; ``get_many`` of 1,000 random keys (records/s and the requests
the server counted); ingest throughput (MB/s) of the shard set; and the bytes
the server sent for one random record against the shard's size (what a
whole-shard download, as webdataset's or Mosaic's caches do, costs for the same
record). Loopback has no network latency: the S3 numbers are the cost of the
protocol and the server (moto is a Python server), not of a real network.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from shardcat import Catalog, TFRecordWriter
from shardcat.pb2 import BytesList, Example, Feature, Features
from shardcat.testing.servers import S3Server

from .util import print_table

PAYLOAD = 4000


def _example(key: str, payload: bytes) -> bytes:
    feats = {
        "key": Feature(bytes_list=BytesList(value=[key.encode()])),
        "image": Feature(bytes_list=BytesList(value=[payload])),
    }
    return Example(features=Features(feature=feats)).SerializeToString()


def _write(root: Path, shards: int, mb: int) -> tuple[list[Path], int]:
    rng = random.Random(1)
    per_shard = mb * 1024 * 1024 // (PAYLOAD + 40)
    paths = []
    for s in range(shards):
        path = root / f"train-{s:05d}.tfrecord"
        with TFRecordWriter(path) as w:
            for i in range(per_shard):
                w.write(_example(f"r{s}_{i}", rng.randbytes(PAYLOAD)))
        paths.append(path)
    return paths, per_shard


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--mb", type=int, default=8, help="MB per shard")
    ap.add_argument("--reads", type=int, default=300, help="single reads per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    for name, value in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench")):
        os.environ.setdefault(name, value)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    import boto3

    server = S3Server()
    server.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            (root / "local").mkdir()
            paths, per_shard = _write(root / "local", args.shards, args.mb)
            client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1")
            client.create_bucket(Bucket="bench")
            for p in paths:
                client.upload_file(str(p), "bench", f"train/{p.name}")
            for p in paths:  # warm the local files
                p.read_bytes()
            total_mb = sum(p.stat().st_size for p in paths) / 1e6
            opts = {"endpoint_url": server.endpoint}
            url = "s3://bench/train/*.tfrecord"
            ingest: dict[str, list[float]] = {"s3": [], "local": []}
            single: dict[str, list[float]] = {"s3": [], "local": [], "boto3": []}
            many: dict[str, list[float]] = {"s3": [], "local": []}
            requests, one_bytes = [], []
            rng = random.Random(2)
            for r in range(args.rounds):
                with Catalog(root / f"c{r}.sqlite") as cat:
                    for where in ("s3", "local") if r % 2 == 0 else ("local", "s3"):
                        start = time.perf_counter()
                        if where == "s3":
                            cat.ingest(url, "s3", storage_options=opts, workers=args.shards)
                        else:
                            cat.ingest(str(root / "local"), "local", workers=args.shards)
                        ingest[where].append(time.perf_counter() - start)
                    readers = {"s3": cat.dataset("s3"), "local": cat.dataset("local")}
                    keys = [
                        f"r{rng.randrange(args.shards)}_{rng.randrange(per_shard)}"
                        for _ in range(args.reads)
                    ]
                    for reader in readers.values():
                        reader.get_raw(keys[0])  # sources open
                    for where, reader in readers.items():
                        start = time.perf_counter()
                        for k in keys:
                            reader.get_feature(k, "image")
                        single[where].append((time.perf_counter() - start) / len(keys))
                    start = time.perf_counter()
                    for k in keys:  # the same ranged GETs, boto3 alone: the server's own cost
                        s, i = k[1:].split("_")
                        at = int(i) * (PAYLOAD + 40)
                        client.get_object(
                            Bucket="bench",
                            Key=f"train/{paths[int(s)].name}",
                            Range=f"bytes={at}-{at + PAYLOAD + 16}",
                        )["Body"].read()
                    single["boto3"].append((time.perf_counter() - start) / len(keys))
                    server.counter.reset()
                    readers["s3"].get_feature(keys[1], "image")
                    one_bytes.append(server.counter.body_bytes)
                    batch = [
                        f"r{rng.randrange(args.shards)}_{rng.randrange(per_shard)}"
                        for _ in range(1000)
                    ]
                    for where in ("s3", "local") if r % 2 else ("local", "s3"):
                        server.counter.reset()
                        start = time.perf_counter()
                        readers[where].get_many(batch, raw=True)
                        many[where].append(time.perf_counter() - start)
                        if where == "s3":
                            requests.append(len(server.counter.requests))
                    for reader in readers.values():
                        reader.close()
            med = {
                k: {w: statistics.median(v) for w, v in d.items()}
                for k, d in (("ingest", ingest), ("single", single), ("many", many))
            }
            shard_bytes = paths[0].stat().st_size
            rows = [
                (
                    "ingest (MB/s)",
                    f"{total_mb / med['ingest']['s3']:.0f}",
                    f"{total_mb / med['ingest']['local']:.0f}",
                    f"{med['ingest']['local'] / med['ingest']['s3']:.2f}x",
                ),
                (
                    "get_feature (µs, median of means)",
                    f"{med['single']['s3'] * 1e6:.0f}",
                    f"{med['single']['local'] * 1e6:.0f}",
                    f"{med['single']['local'] / med['single']['s3']:.3f}x",
                ),
                (
                    "  same ranged GETs with boto3 alone (µs)",
                    f"{med['single']['boto3'] * 1e6:.0f}",
                    "",
                    f"shardcat / boto3: {med['single']['boto3'] / med['single']['s3']:.2f}x",
                ),
                (
                    "get_many 1,000 keys (records/s)",
                    f"{1000 / med['many']['s3']:,.0f}",
                    f"{1000 / med['many']['local']:,.0f}",
                    f"{med['many']['local'] / med['many']['s3']:.2f}x",
                ),
            ]
            print(
                f"{args.shards} shards x {shard_bytes / 1e6:.1f} MB, {per_shard} records of "
                f"~{PAYLOAD} B each; {args.rounds} rounds, {args.reads} single reads per round"
            )
            print_table(("measure", "S3 (loopback)", "local", "S3 / local speed"), rows)
            print()
            print_table(
                ("per random record", "bytes", "requests"),
                [
                    ("shardcat, S3 ranged GET", f"{statistics.median(one_bytes):,.0f}", "1"),
                    ("whole-shard download", f"{shard_bytes:,}", "1"),
                    (
                        "get_many 1,000 keys: requests (max over rounds)",
                        "",
                        f"{max(requests)}",
                    ),
                ],
            )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
