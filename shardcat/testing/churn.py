"""Churn: readers reading continuously while shards are rewritten and re-ingested.

Every payload names its key and version and is derived from them, so a reader
can tell whether bytes it got are exactly one version's bytes of that key
without knowing which version is current. A writer process rewrites shards
(new layout, new payload sizes; replaced with ``os.replace`` or rewritten in
place) and re-ingests them; reader processes (each one reader, shared by
``threads`` threads) read random keys (single reads and ``get_many`` batches)
and count what they get:

- ``ok``: a version's exact bytes of the key asked for;
- ``stale``: a :class:`~shardcat.StaleShardError` (the file changed and its
  re-index had not committed yet: a clear error, allowed);
- ``wrong``: any other bytes; ``missing``: None or ``KeyError`` for a key every
  version holds; ``other``: any other exception. All three must stay 0.

``tests/test_churn.py`` runs it for a few seconds; ``python -m benchmarks.churn``
runs it for as long as asked (a million reads and more).
"""

from __future__ import annotations

import hashlib
import io
import multiprocessing
import os
import random
import tarfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["KEYS_PER_SHARD", "expected_payload", "run", "write_version"]

KEYS_PER_SHARD = 200


def expected_payload(key: str, version: int) -> bytes:
    """The payload of ``key`` in ``version``: its name, then bytes derived from both
    (100 to 4,000 of them, so every version moves every offset)."""
    seed = hashlib.sha256(f"{key}/{version}".encode()).digest()
    size = 100 + int.from_bytes(seed[:2], "big") % 3900
    head = f"{key}|{version}|".encode()
    return head + (seed * (size // len(seed) + 1))[:size]


def _parse(data: bytes) -> tuple[str, int] | None:
    parts = data.split(b"|", 2)
    if len(parts) != 3:
        return None
    try:
        return parts[0].decode(), int(parts[1])
    except (UnicodeDecodeError, ValueError):
        return None


def _keys(shard: int) -> list[str]:
    return [f"s{shard}_{i:05d}" for i in range(KEYS_PER_SHARD)]


def _shard_path(directory: Path, fmt: str, shard: int) -> Path:
    return directory / f"part-{shard:02d}.{'tar' if fmt == 'tar' else 'tfrecord'}"


def write_version(directory: Path, fmt: str, shard: int, version: int, in_place: bool) -> None:
    """Write shard ``shard`` at ``version`` (its keys in a version-dependent order)."""
    from shardcat import TFRecordWriter, make_example

    keys = _keys(shard)
    random.Random(version * 1000 + shard).shuffle(keys)
    path = _shard_path(directory, fmt, shard)
    scratch = path.with_name(path.name + ".new")
    if fmt == "tar":
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
            for key in keys:
                data = expected_payload(key, version)
                info = tarfile.TarInfo(f"{key}.bin")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
        scratch.write_bytes(buf.getvalue())
    else:
        with TFRecordWriter(scratch) as w:
            for key in keys:
                w.write(make_example({"key": key, "bin": expected_payload(key, version)}))
    if in_place:  # same inode: truncate and write over the old bytes
        data = scratch.read_bytes()
        scratch.unlink()
        with open(path, "r+b") as f:
            f.truncate(0)
            f.write(data)
    else:
        os.replace(scratch, path)


def _read_loop(
    reader: Any, keys: list[str], until: float, seed: int
) -> tuple[Counter[str], list[str]]:
    from shardcat import StaleShardError

    counts: Counter[str] = Counter()
    examples: list[str] = []
    rng = random.Random(seed)
    while time.monotonic() < until:
        batch = rng.sample(keys, 8) if rng.random() < 0.2 else [rng.choice(keys)]
        try:
            if len(batch) == 1:
                got = [reader.get_feature(batch[0], "bin")]
            else:
                records = reader.get_many(batch)
                got = [reader.features(r)["bin"][0] for r in records]
        except StaleShardError:
            counts["stale"] += len(batch)
            continue
        except KeyError as exc:
            counts["missing"] += len(batch)
            examples.append(f"missing: {exc}")
            continue
        except Exception:  # reported to the parent, never swallowed
            counts["other"] += 1
            examples.append(traceback.format_exc())
            continue
        for key, data in zip(batch, got, strict=True):
            named = None if data is None else _parse(data)
            if data is None:
                counts["missing"] += 1
                examples.append(f"missing: {key}")
            elif named is None or named[0] != key or data != expected_payload(*named):
                counts["wrong"] += 1
                examples.append(f"wrong: {key} -> {data[:40]!r}")
            else:
                counts["ok"] += 1
    return counts, examples


def _reader(catalog: str, shards: int, until: float, seed: int, threads: int, queue: Any) -> None:
    """One reader read by ``threads`` threads at once (each its own random keys)."""
    from concurrent.futures import ThreadPoolExecutor

    from shardcat import Catalog

    counts: Counter[str] = Counter()
    examples: list[str] = []
    keys = [k for s in range(shards) for k in _keys(s)]
    try:
        with (
            Catalog(catalog, readonly=True) as cat,
            cat.dataset("churn") as reader,
            ThreadPoolExecutor(threads) as pool,
        ):
            seeds = [seed * 1000 + t for t in range(threads)]
            for found, seen in pool.map(lambda s: _read_loop(reader, keys, until, s), seeds):
                counts.update(found)
                examples += seen
    except Exception:  # reported to the parent, never swallowed
        counts["other"] += 1
        examples.append(traceback.format_exc())
    queue.put((dict(counts), examples[:5]))


def _writer(catalog: str, directory: str, fmt: str, shards: int, until: float, queue: Any) -> None:
    from shardcat import Catalog

    rng = random.Random(99)
    version = 1
    rounds = 0
    problems: list[str] = []
    try:
        with Catalog(catalog) as cat:
            while time.monotonic() < until:
                for shard in rng.sample(range(shards), min(2, shards)):
                    write_version(Path(directory), fmt, shard, version, in_place=rng.random() < 0.3)
                version += 1
                cat.ingest(
                    str(Path(directory) / f"part-*.{'tar' if fmt == 'tar' else 'tfrecord'}"),
                    "churn",
                    format=fmt,
                    workers=1,
                ).close()
                rounds += 1
    except Exception:
        problems.append(traceback.format_exc())
    queue.put(({"reingests": rounds}, problems))


def run(
    directory: str | os.PathLike[str],
    *,
    fmt: str = "tar",
    shards: int = 4,
    seconds: float = 3.0,
    readers: int = 2,
    threads: int = 1,
) -> dict[str, Any]:
    """Run the churn for ``seconds`` (``readers`` processes, each sharing one reader
    among ``threads`` threads); returns the summed counts, ``reingests`` and up to
    a few ``examples`` of anything that went wrong."""
    from shardcat import Catalog

    where = Path(directory)
    where.mkdir(parents=True, exist_ok=True)
    for shard in range(shards):
        write_version(where, fmt, shard, 0, in_place=False)
    catalog = str(where / "churn.sqlite")
    with Catalog(catalog) as cat:
        pattern = str(where / f"part-*.{'tar' if fmt == 'tar' else 'tfrecord'}")
        cat.ingest(pattern, "churn", format=fmt, workers=1).close()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    until = time.monotonic() + seconds
    procs = [ctx.Process(target=_writer, args=(catalog, str(where), fmt, shards, until, queue))]
    procs += [
        ctx.Process(target=_reader, args=(catalog, shards, until, seed, threads, queue))
        for seed in range(readers)
    ]
    for p in procs:
        p.start()
    totals: Counter[str] = Counter()
    examples: list[str] = []
    for _ in procs:
        counts, found = queue.get(timeout=seconds + 120)
        totals.update(counts)
        examples += found
    for p in procs:
        p.join(60)
    out: dict[str, Any] = {
        k: totals.get(k, 0) for k in ("ok", "stale", "wrong", "missing", "other")
    }
    out["reads"] = out["ok"] + out["stale"] + out["wrong"] + out["missing"]
    out["reingests"] = totals.get("reingests", 0)
    out["examples"] = examples
    return out
