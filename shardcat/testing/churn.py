"""Churn: readers reading continuously while shards are rewritten and re-ingested.

Every payload names its key and version and is derived from them, so a reader
can tell whether bytes it got are exactly one version's bytes of that key
without knowing which version is current. A writer process rewrites shards
(new layout, new payload sizes; replaced with ``os.replace`` or rewritten in
place) and re-ingests them; reader processes (each one reader, shared by
``threads`` threads) read random keys (single reads, ``get_many`` and ``get_dicts`` batches)
and count what they get:

- ``ok``: a version's exact bytes of the key asked for;
- ``stale``: a :class:`~shardcat.StaleShardError`, ``error``: another
  :class:`~shardcat.ShardcatError` (allowed where the writer explains it);
- ``unexplained``: such an error although the shard it names was neither being
  rewritten when the read began nor rewritten or re-ingested while it ran (the
  writer keeps a counter per shard, odd from its rewrite to its re-ingest's commit);
- ``wrong``: any other bytes; ``missing``: None or ``KeyError`` for a key every
  version holds; ``other``: an exception that is not a ShardcatError. These four
  must stay 0.

``tests/test_churn.py`` runs a few re-ingests; ``python -m benchmarks.churn``
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
from dataclasses import dataclass
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


class _Shards:
    """What the writer is doing, shared with the readers: one counter per shard, odd
    while the shard is being rewritten and its re-ingest has not committed."""

    def __init__(self, ctx: Any, shards: int) -> None:
        self.epochs = ctx.Array("q", shards)
        self.done = ctx.Event()

    def now(self) -> list[int]:
        with self.epochs.get_lock():
            return list(self.epochs)

    def bump(self, shards: list[int]) -> None:
        with self.epochs.get_lock():
            for shard in shards:
                self.epochs[shard] += 1


def _explained(exc: Exception, before: list[int], after: list[int]) -> bool:
    """Whether an error of a read by key is the writer's doing: the shard it names
    (an error naming none is not explained) was being rewritten when the read
    began, or was rewritten or re-ingested while it ran."""
    path = str(getattr(exc, "path", None) or "")
    named = [i for i in range(len(before)) if f"part-{i:02d}." in path]
    return any(before[i] % 2 or after[i] != before[i] for i in named)


def _read(reader: Any, batch: list[str]) -> list[Any]:
    if len(batch) == 1:
        return [reader.get_feature(batch[0], "bin")]
    if batch[0][-1] in "02468":  # half the batches as dicts (the training path)
        return [d["bin"] for d in reader.get_dicts(batch, ["bin"])]
    return [reader.features(r)["bin"][0] for r in reader.get_many(batch)]


def _read_loop(
    reader: Any, shards: _Shards, min_reads: int, seed: int
) -> tuple[Counter[str], list[str]]:
    """Read random keys until the writer is done and ``min_reads`` were read."""
    from shardcat import ShardcatError, StaleShardError

    counts: Counter[str] = Counter()
    examples: list[str] = []
    rng = random.Random(seed)
    keys = [k for s in range(len(shards.epochs)) for k in _keys(s)]
    reads = 0
    while not (shards.done.is_set() and reads >= min_reads):
        batch = rng.sample(keys, 8) if rng.random() < 0.2 else [rng.choice(keys)]
        reads += len(batch)
        before = shards.now()
        try:
            got = _read(reader, batch)
        except KeyError as exc:  # KeyNotFoundError: every version holds every key
            counts["missing"] += len(batch)
            examples.append(f"missing: {exc!r}")
            continue
        except ShardcatError as exc:
            kind = "stale" if isinstance(exc, StaleShardError) else "error"
            counts[kind] += len(batch)
            if not _explained(exc, before, shards.now()):
                counts["unexplained"] += len(batch)
                examples.append(f"unexplained {type(exc).__name__}: {exc}")
            elif kind == "error":
                examples.append(f"{type(exc).__name__}: {exc}")
            continue
        except Exception:  # not a ShardcatError: reported to the parent, never swallowed
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


def _reader(
    catalog: str, shards: _Shards, min_reads: int, seed: int, threads: int, queue: Any
) -> None:
    """One reader, read by ``threads`` threads at once (each its own random keys)."""
    from concurrent.futures import ThreadPoolExecutor

    from shardcat import Catalog

    counts: Counter[str] = Counter()
    examples: list[str] = []
    try:
        with (
            Catalog(catalog, readonly=True) as cat,
            cat.dataset("churn") as reader,
            ThreadPoolExecutor(threads) as pool,
        ):
            seeds = [seed * 1000 + t for t in range(threads)]
            loops = pool.map(lambda s: _read_loop(reader, shards, min_reads, s), seeds)
            for found, seen in loops:
                counts.update(found)
                examples += seen
    except Exception:  # not a ShardcatError: reported to the parent, never swallowed
        counts["other"] += 1
        examples.append(traceback.format_exc())
    queue.put((dict(counts), examples[:5]))


def _writer(
    catalog: str, directory: str, fmt: str, shards: _Shards, stop: _Stop, queue: Any
) -> None:
    from shardcat import Catalog

    rng = random.Random(99)
    version = 1
    rounds = 0
    problems: list[str] = []
    count = len(shards.epochs)
    try:
        with Catalog(catalog) as cat:
            while not stop.reached(rounds):
                chosen = rng.sample(range(count), min(2, count))
                shards.bump(chosen)  # odd: rewritten, not yet re-ingested
                for shard in chosen:
                    write_version(Path(directory), fmt, shard, version, in_place=rng.random() < 0.3)
                version += 1
                cat.ingest(
                    str(Path(directory) / f"part-*.{'tar' if fmt == 'tar' else 'tfrecord'}"),
                    "churn",
                    format=fmt,
                    workers=1,
                ).close()
                shards.bump(chosen)  # even: committed
                rounds += 1
    except Exception:
        problems.append(traceback.format_exc())
    finally:
        shards.done.set()
    queue.put(({"reingests": rounds}, problems))


@dataclass(frozen=True)
class _Stop:
    """When the writer stops: after ``rounds`` re-ingests, or at ``until``."""

    rounds: int | None
    until: float | None

    def reached(self, rounds: int) -> bool:
        if self.rounds is not None and rounds >= self.rounds:
            return True
        return self.until is not None and time.monotonic() >= self.until


def run(
    directory: str | os.PathLike[str],
    *,
    fmt: str = "tar",
    shards: int = 4,
    seconds: float | None = None,
    rounds: int | None = None,
    readers: int = 2,
    min_reads: int = 0,
    threads: int = 1,
) -> dict[str, Any]:
    """Run the churn: the writer re-ingests ``rounds`` times (or for ``seconds``), the
    readers (processes, each one reader shared by ``threads`` threads) read until it
    is done and each thread has read ``min_reads`` records; returns
    the summed counts, ``reads``, ``reingests`` and up to a few ``examples``."""
    from shardcat import Catalog

    if rounds is None and seconds is None:
        raise ValueError("give rounds or seconds")
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
    state = _Shards(ctx, shards)
    stop = _Stop(rounds, None if seconds is None else time.monotonic() + seconds)
    procs = [ctx.Process(target=_writer, args=(catalog, str(where), fmt, state, stop, queue))]
    procs += [
        ctx.Process(target=_reader, args=(catalog, state, min_reads, seed, threads, queue))
        for seed in range(readers)
    ]
    for p in procs:
        p.start()
    totals: Counter[str] = Counter()
    examples: list[str] = []
    for _ in procs:
        counts, found = queue.get(timeout=(seconds or 0) + 600)
        totals.update(counts)
        examples += found
    for p in procs:
        p.join(60)
    kinds = ("ok", "stale", "error", "unexplained", "wrong", "missing", "other")
    out: dict[str, Any] = {k: totals.get(k, 0) for k in kinds}
    out["reads"] = sum(out[k] for k in ("ok", "stale", "error", "wrong", "missing"))
    out["reingests"] = totals.get("reingests", 0)
    out["examples"] = examples
    return out
