"""Shards and checks shared by the remote-storage test modules (S3, HTTP, GCS,
Azure, WebHDFS): TFRecord shards of random payloads, small same-size shards for
replacement tests, and the forked-reader check."""

from __future__ import annotations

import io
import multiprocessing
import os
import random
import tarfile
from pathlib import Path
from typing import Any

from features import b, ex_bytes

from shardcat import TFRecordWriter
from shardcat.sources import remote


def write_shards(root: Path, *, shards: int, records: int, payload: int, seed: int) -> list[Path]:
    """``shards`` TFRecord shards ``train-0000N.tfrecord`` of ``records`` records
    keyed ``r<shard>_<i>``, each an ``image`` of ``payload`` random bytes."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(shards):
        path = root / f"train-{s:05d}.tfrecord"
        with TFRecordWriter(path) as w:
            for i in range(records):
                w.write(ex_bytes(key=b(f"r{s}_{i}".encode()), image=b(rng.randbytes(payload))))
        paths.append(path)
    return paths


def small_shard(path: Path, prefix: str, n: int = 10) -> Path:
    """Shards written with prefixes of one length have the same size."""
    with TFRecordWriter(path) as w:
        for i in range(n):
            w.write(
                ex_bytes(key=b(f"{prefix}{i}".encode()), image=b(f"{prefix}-{i}".encode() * 50))
            )
    return path


def sample_tar(path: Path, samples: int = 20) -> Path:
    """A ustar archive of ``samples`` samples ``s000``...: a 3,000-byte ``jpg`` member
    of random bytes and a ``cls`` member holding the sample's number."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as archive:
        for i in range(samples):
            for ext, data in (("jpg", os.urandom(3000)), ("cls", str(i).encode())):
                member = tarfile.TarInfo(f"s{i:03d}.{ext}")
                member.size = len(data)
                archive.addfile(member, io.BytesIO(data))
    return path


def _child(reader: Any, keys: list[str], out: Any) -> None:
    data = reader.get_many(keys, raw=True)
    out.put((data, sorted({key[0] for key in remote._filesystems}), os.getpid()))


def forked_reads_equal(reader: Any, keys: list[str]) -> None:
    """A forked child of a process whose remote session is open reads the same bytes
    through a filesystem of its own; the parent's still works after."""
    expected = reader.get_many(keys, raw=True)  # the parent's session is open now
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child, args=(reader, keys, out))
    child.start()
    data, pids, pid = out.get(timeout=120)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert data == expected
    assert pid in pids and pid != os.getpid()  # the child made its own filesystem
    assert reader.get_many(keys, raw=True) == expected
