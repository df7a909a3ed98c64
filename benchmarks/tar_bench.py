"""tar and .tar.gz side by side with tfd-utils' TarRandomAccess, in one run.

``python -m benchmarks.tar_bench [--mb 100] [--reads 300] [--gz-reads-tfd 8] [--data DIR]
[--gz-rounds 3] [--ratarmount-python PY]``

Measures: ingest of a tar shard set (4 shards) against tfd-utils' index build;
random ``get_feature`` on one ~100 MB ``.tar`` and on the same archive as
``.tar.gz`` (median µs per read, fresh readers, the same random keys for both
tools). tfd-utils reads a ``.tar.gz`` through ``tarfile``/``gzip``, which
decompresses from the start of the file for every backward seek, so its
``.tar.gz`` reads are sampled fewer times (``--gz-reads-tfd``).

Then the ``.tar.gz`` index build: shardcat's ingest of ``big.tar.gz`` (one
worker) with the one-pass ``_inflate`` extension and with the two-pass
fallback (Python's gzip, then indexed_gzip's ``build_full_index``), against
ratarmount's index build (``SQLiteIndexedTar``, its default backend and
``parallelization=1``, and its indexed_gzip backend) at the same 1 MiB
seek-point spacing; rounds interleaved, the file warmed first, medians.
ratarmount runs in the interpreter ``--ratarmount-python`` (a venv with
``ratarmountcore``; it is not one of shardcat's extras), timed inside it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gzip
import io
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from benchmarks.util import print_table, timed
from shardcat import Catalog, TarReader


def _payload(rng: random.Random, words: list[bytes], n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        out += rng.choice(words) + b" "
        if rng.random() < 0.3:
            out += rng.randbytes(8)
    return bytes(out[:n])


def make_archives(directory: Path, total_mb: int, shards: int = 4) -> list[Path]:
    """``shards`` WebDataset tars of ``total_mb`` MB in all: jpg-like (half
    compressible), json and cls members per sample; plus ``big.tar(.gz)`` of
    ``total_mb`` MB for random reads."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    words = [rng.randbytes(rng.randint(3, 9)).hex().encode() for _ in range(500)]
    paths = []
    for i in range(shards):
        paths.append(directory / f"part-{i:02d}.tar")
        _write_tar(paths[-1], rng, words, total_mb * 1_000_000 // shards, i)
    big = directory / "big.tar"
    _write_tar(big, rng, words, total_mb * 1_000_000, 99)
    with open(big, "rb") as src, gzip.open(directory / "big.tar.gz", "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    return paths


def _write_tar(path: Path, rng: random.Random, words: list[bytes], size: int, shard: int) -> None:
    total, i = 0, 0
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        while total < size:
            key = f"s{shard:02d}_{i:06d}"
            members = (
                ("jpg", _payload(rng, words, rng.randint(20_000, 60_000))),
                ("json", json.dumps({"width": i, "height": i % 7}).encode()),
                ("cls", str(i % 10).encode()),
            )
            for ext, data in members:
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
                total += len(data) + 512
            i += 1


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        yield


def _median_us(read: Callable[[str], object], keys: list[str]) -> float:
    times = []
    for key in keys:
        start = time.perf_counter()
        value = read(key)
        times.append(time.perf_counter() - start)
        if value is None:
            raise RuntimeError(f"no jpg for {key}")
    return statistics.median(times) * 1e6


def run(
    data: Path, total_mb: int, reads: int, gz_reads_tfd: int
) -> list[tuple[str, str, str, str]]:
    from tfd_utils import TarRandomAccess as TfdTar

    if not (data / "big.tar.gz").exists():
        make_archives(data, total_mb)
    parts = sorted(data.glob("part-*.tar"))
    rows = []
    work = Path(tempfile.mkdtemp(prefix="tar_bench_"))
    try:
        # ingest of the shard set vs tfd-utils' index build (both from scratch, 2 workers)
        ours = timed(
            lambda: (
                Catalog(work / "ingest.sqlite")
                .ingest([str(p) for p in parts], "parts", workers=2)
                .close()
            )
        )
        with _quiet():
            tfd = TfdTar([str(p) for p in parts], index_file=work / "t.tar_index", max_workers=2)
            theirs = timed(lambda: tfd.index)
            tfd.close()
        mb = sum(p.stat().st_size for p in parts) / 1e6
        rows.append(
            (
                f"ingest {len(parts)} tars, {mb:.0f} MB",
                f"{ours:.2f} s",
                f"{theirs:.2f} s",
                f"{ours / theirs:.2f}x",
            )
        )
        for name, n_tfd in (("big.tar", reads), ("big.tar.gz", gz_reads_tfd)):
            path = str(data / name)
            with TarReader(path, index_file=work / f"{name}.sqlite", grouping="tfd") as reader:
                keys = reader.get_keys()
                sample = random.Random(1).sample(keys, reads)
                _median_us(lambda k: reader.get_feature(k, "jpg"), sample[:20])  # warm up
                ours_us = _median_us(lambda k: reader.get_feature(k, "jpg"), sample)
            with _quiet():
                tfd = TfdTar(path, index_file=work / f"{name}.tar_index")
                _ = tfd.index
                read_theirs = functools.partial(tfd.get_feature, feature_name="jpg")
                theirs_us = _median_us(read_theirs, sample[:n_tfd])
                tfd.close()
            rows.append(
                (
                    f"random get_feature, {name} ({os.path.getsize(path) / 1e6:.0f} MB)",
                    f"{ours_us:,.0f} µs",
                    f"{theirs_us:,.0f} µs",
                    f"{ours_us / theirs_us:.4f}x",
                )
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


_RATARMOUNT = """
import sys, time
from ratarmountcore.mountsource.formats.tar import SQLiteIndexedTar
path, index, backend = sys.argv[1:4]
options = {} if backend == "default" else {"prioritizedBackends": [backend]}
start = time.perf_counter()
tar = SQLiteIndexedTar(path, gzipSeekPointSpacing=1 << 20, indexFilePath=index, **options)
print(time.perf_counter() - start)
tar.__exit__(None, None, None)
"""


def _ratarmount_s(python: str, path: Path, index: Path, backend: str) -> float:
    index.unlink(missing_ok=True)
    out = subprocess.run(
        [python, "-c", _RATARMOUNT, str(path), str(index), backend],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(out.split()[-1])


def _shardcat_s(path: Path, catalog: Path, one_pass: bool) -> float:
    from shardcat.sources import compressed

    native = compressed._INFLATE
    if one_pass and native is None:
        raise RuntimeError("the _inflate extension is not built: python setup.py build_ext")
    compressed._INFLATE = native if one_pass else None
    try:
        catalog.unlink(missing_ok=True)
        return timed(lambda: Catalog(catalog).ingest(str(path), "gz", workers=1).close())
    finally:
        compressed._INFLATE = native


def gzip_index_rows(
    data: Path, rounds: int, ratarmount_python: str
) -> list[tuple[str, str, str, str]]:
    """The ``.tar.gz`` index build, interleaved rounds, medians and ratios."""
    path = data / "big.tar.gz"
    path.read_bytes()  # warm the page cache
    contenders: dict[str, Callable[[Path], float]] = {
        "shardcat, one pass (_inflate)": lambda w: _shardcat_s(path, w / "a.sqlite", True),
        "shardcat, two passes (fallback)": lambda w: _shardcat_s(path, w / "b.sqlite", False),
        "ratarmount, default backend": lambda w: _ratarmount_s(
            ratarmount_python, path, w / "r.sqlite", "default"
        ),
        "ratarmount, indexed_gzip backend": lambda w: _ratarmount_s(
            ratarmount_python, path, w / "r.sqlite", "indexed_gzip"
        ),
    }
    found = subprocess.run([ratarmount_python, "-c", "import ratarmountcore"], check=False)
    if found.returncode:
        print(f"(no ratarmountcore in {ratarmount_python}: shardcat only)")
        contenders = {k: v for k, v in contenders.items() if not k.startswith("ratarmount")}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    work = Path(tempfile.mkdtemp(prefix="tar_bench_gz_"))
    try:
        for i in range(rounds + 1):  # round 0 warms up and is not counted
            for name, run_one in contenders.items():
                seconds = run_one(work)
                if i:
                    times[name].append(seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    median = {name: statistics.median(t) for name, t in times.items()}
    ratarmount = median.get("ratarmount, default backend")
    ours = median["shardcat, one pass (_inflate)"]
    size = f"{os.path.getsize(path) / 1e6:.0f} MB"
    return [
        (
            f"{name}, big.tar.gz ({size})",
            f"{seconds:.2f} s",
            "-" if ratarmount is None else f"{seconds / ratarmount:.2f}x",
            f"{seconds / ours:.2f}x",
        )
        for name, seconds in median.items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tar_bench", description=__doc__)
    parser.add_argument("--mb", type=int, default=100, help="archive size (MB)")
    parser.add_argument("--reads", type=int, default=300, help="random reads per tool")
    parser.add_argument("--gz-reads-tfd", type=int, default=8, help="tfd-utils .tar.gz reads")
    parser.add_argument(
        "--data", type=Path, default=Path(__file__).parent / "data" / "tar", help="data directory"
    )
    parser.add_argument("--gz-rounds", type=int, default=3, help=".tar.gz index build rounds")
    parser.add_argument(
        "--ratarmount-python", default=sys.executable, help="interpreter with ratarmountcore"
    )
    parser.add_argument("--gz-only", action="store_true", help="only the .tar.gz index build")
    args = parser.parse_args(argv)
    data = args.data / f"{args.mb}mb"
    if not args.gz_only:
        rows = run(data, args.mb, args.reads, args.gz_reads_tfd)
        header = ("what", "shardcat", "tfd-utils 1.3.0", "shardcat / tfd-utils")
        print_table(header, rows)
    elif not (data / "big.tar.gz").exists():
        make_archives(data, args.mb)
    if args.gz_rounds > 0:
        header = (".tar.gz index build, 1 MiB spacing", "median", "/ ratarmount", "/ one pass")
        print_table(header, gzip_index_rows(data, args.gz_rounds, args.ratarmount_python))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
