"""``shardcat.ray.read_dataset`` vs Ray Data's own readers, and Ray ingest vs local
ingest, on the same shards, side by side.

``python -m benchmarks.ray_bench [--samples 20000] [--shards 8] [--image-bytes 4000]
[--repeats 3] [--cpus 2] [--only read|ingest] [--quick]``

Data (written to a temporary directory each run): the same samples as WebDataset
tar shards (``<key>.jpg`` random bytes + ``<key>.cls``, the class ``n % 100``) and
as TFRecord shards (features ``key``, ``jpg``, ``cls``), both ingested into one
catalog (untimed). Ray runs on this machine (``ray.init(address="local",
num_cpus=--cpus)``: a new instance even where a cluster already runs here; a
small object store). Each contender reads every row of its dataset through
``iter_batches`` (nothing is kept); they run round-robin and the median is kept:

- **shardcat tar** ``read_dataset(cat, "tar")`` vs **ray webdataset**
  ``ray.data.read_webdataset(dir, decoder=None)`` (raw member bytes, as ours);
- **shardcat tfrecord** ``read_dataset(cat, "tfrecord")`` vs **ray tfrecords**
  ``ray.data.read_tfrecords(dir)`` (it imports tensorflow: skipped, and said so,
  where tensorflow is not installed; ``make bench-ray-tf`` runs the read side in
  ``.venv-raytf``, which has it);
- **shardcat where 1%** ``read_dataset(cat, "tar", where="cls = 7")`` vs
  **ray webdataset + filter** (the same subset by reading everything and
  filtering): what pushing the predicate into the catalog saves.

Ratios are shardcat time / Ray time (below 1: shardcat is faster); rows/s are
printed for each.

Ingest (``--only ingest``): the TFRecord shards ingested into a new SQLite catalog
each time, by ``Catalog.ingest(..., workers=2)`` (forked workers here) and by
``engine="ray"`` on a local cluster of ``--cpus`` worker nodes of one CPU each
(a head without CPUs: ``shardcat.testing.ray.local_cluster``), round-robin, the
median kept; the ratio is Ray time / local time (above 1: Ray costs more).
"""

from __future__ import annotations

import argparse
import io
import statistics
import tarfile
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.util import print_table, round_robin_times
from shardcat import Catalog, TFRecordWriter, make_example


def write_data(root: Path, samples: int, shards: int, image_bytes: int) -> None:
    """The samples as tar shards under ``root/tar`` and TFRecord shards under ``root/tf``."""
    import random

    rng = random.Random(5)
    (root / "tar").mkdir(parents=True)
    (root / "tf").mkdir()
    per = -(-samples // shards)
    for s in range(shards):
        numbers = range(s * per, min(samples, (s + 1) * per))
        with (
            tarfile.open(
                root / "tar" / f"train-{s:05d}.tar", "w", format=tarfile.USTAR_FORMAT
            ) as tar,
            TFRecordWriter(root / "tf" / f"train-{s:05d}.tfrecord") as tf,
        ):
            for n in numbers:
                key, image, label = f"s{n:07d}", rng.randbytes(image_bytes), n % 100
                for ext, data in (("jpg", image), ("cls", str(label).encode())):
                    member = tarfile.TarInfo(f"{key}.{ext}")
                    member.size = len(data)
                    tar.addfile(member, io.BytesIO(data))
                tf.write(make_example({"key": key, "jpg": image, "cls": label}))


def drain(ds: Any) -> int:
    """Rows of ``ds``, read through ``iter_batches`` (nothing kept)."""
    return sum(
        len(batch["__key__" if "__key__" in batch else "key"]) for batch in ds.iter_batches()
    )


def contenders(root: Path, catalog: Path) -> tuple[dict[str, Callable[[], int]], list[str]]:
    import ray.data

    from shardcat.ray import read_dataset

    def is_seven(row: dict[str, Any]) -> bool:
        return bool(row["cls"] == b"7")

    runs: dict[str, Callable[[], int]] = {
        "shardcat tar": lambda: drain(read_dataset(catalog, "tar")),
        "ray webdataset": lambda: drain(ray.data.read_webdataset(str(root / "tar"), decoder=None)),
        "shardcat tfrecord": lambda: drain(read_dataset(catalog, "tfrecord")),
        "shardcat where 1%": lambda: drain(read_dataset(catalog, "tar", where="cls = 7")),
        "ray webdataset + filter": lambda: drain(
            ray.data.read_webdataset(str(root / "tar"), decoder=None).filter(is_seven)
        ),
    }
    notes = []
    try:
        import tensorflow  # noqa: F401 - what ray.data.read_tfrecords imports
    except ImportError:
        notes.append(
            "ray tfrecords: skipped, ray.data.read_tfrecords imports tensorflow, not installed "
            "here (tensorflow-cpu 2.21 needs protobuf 7; tfd-utils, the suite's peer, pins 5): "
            "make bench-ray-tf runs it in .venv-raytf"
        )
    else:
        runs["ray tfrecords"] = lambda: drain(ray.data.read_tfrecords(str(root / "tf")))
    return runs, notes


PAIRS = [
    ("shardcat tar", "ray webdataset"),
    ("shardcat tfrecord", "ray tfrecords"),
    ("shardcat where 1%", "ray webdataset + filter"),
]


def run_ingest(args: argparse.Namespace) -> None:
    """Ray ingest vs local ingest (2 workers) of the TFRecord shards, side by side."""
    from shardcat.testing.ray import ClusterSpec, local_cluster

    with tempfile.TemporaryDirectory(prefix="shardcat-ray-ingest-") as tmp:
        root = Path(tmp)
        write_data(root, args.samples, args.shards, args.image_bytes)
        pattern = str(root / "tf" / "*.tfrecord")
        made = iter(range(1_000_000))

        def ingest(**how: Any) -> int:
            catalog = root / f"cat-{next(made)}.sqlite"
            with Catalog(catalog) as cat:
                reader = cat.ingest(pattern, "train", **how)
                count = len(reader)
                reader.close()
            catalog.unlink()
            return count

        runs: dict[str, Callable[[], int]] = {
            "local workers=2": lambda: ingest(workers=2),
            f"ray {args.cpus} nodes": lambda: ingest(engine="ray"),
        }
        with local_cluster(ClusterSpec(workers=args.cpus, head_cpus=0)):
            rows = {name: fn() for name, fn in runs.items()}  # warm-up (Ray's workers start)
            times = round_robin_times(runs, args.repeats, rotate=True)
    medians = {name: statistics.median(t) for name, t in times.items()}
    local, ray_ = runs
    print(
        f"\ningest of {args.samples:,} TFRecord records ({args.image_bytes:,}-byte jpg) in "
        f"{args.shards} shards into SQLite, median of {args.repeats}\n"
    )
    print_table(
        ("local", "s", "records/s", "Ray", "s", "records/s", "time ratio Ray / local"),
        [
            (
                local,
                f"{medians[local]:.2f}",
                f"{rows[local] / medians[local]:,.0f}",
                ray_,
                f"{medians[ray_]:.2f}",
                f"{rows[ray_] / medians[ray_]:,.0f}",
                f"{medians[ray_] / medians[local]:.2f}",
            )
        ],
    )


def run(args: argparse.Namespace) -> None:
    import ray
    import ray.data

    with tempfile.TemporaryDirectory(prefix="shardcat-ray-bench-") as tmp:
        root = Path(tmp)
        write_data(root, args.samples, args.shards, args.image_bytes)
        catalog = root / "cat.sqlite"
        with Catalog(catalog) as cat:
            cat.ingest(str(root / "tar" / "*.tar"), "tar").close()
            cat.ingest(str(root / "tf" / "*.tfrecord"), "tfrecord").close()
        ray.init(
            address="local",  # a Ray of its own, even where a cluster runs on this host
            num_cpus=args.cpus,
            object_store_memory=200 * 2**20,
            include_dashboard=False,
            log_to_driver=False,
        )
        try:
            ray.data.DataContext.get_current().enable_progress_bars = False
            # Ray suggests filter(expr=...) for its own columns; a function is what users write
            warnings.filterwarnings("ignore", message="Use 'expr' instead of 'fn'")
            runs, notes = contenders(root, catalog)
            rows = {name: fn() for name, fn in runs.items()}  # warm-up, and the row counts
            times = round_robin_times(runs, args.repeats, rotate=True)
        finally:
            ray.shutdown()
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(
        f"\n{args.samples:,} samples ({args.image_bytes:,}-byte jpg + cls) in {args.shards} "
        f"shards, Ray on {args.cpus} CPUs, median of {args.repeats}\n"
    )
    table = []
    for ours, theirs in PAIRS:
        if theirs not in medians:
            continue
        table.append(
            (
                ours,
                f"{rows[ours] / medians[ours]:,.0f}",
                theirs,
                f"{rows[theirs] / medians[theirs]:,.0f}",
                f"{medians[ours] / medians[theirs]:.2f}",
            )
        )
    header = ("shardcat", "rows/s", "Ray", "rows/s", "time ratio shardcat / Ray")
    print_table(header, table)
    if "ray tfrecords" not in medians:
        name = "shardcat tfrecord"
        print(f"\n{name}: {rows[name] / medians[name]:,.0f} rows/s")
    for note in notes:
        print(note)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ray_bench", description=__doc__)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--image-bytes", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray instance")
    parser.add_argument("--only", choices=("read", "ingest"), help="one half (default: both)")
    parser.add_argument("--quick", action="store_true", help="4,000 samples, 2 repeats")
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.repeats = 4_000, 2
    start = time.perf_counter()
    if args.only != "ingest":
        run(args)
    if args.only != "read":
        run_ingest(args)
    print(f"({time.perf_counter() - start:.0f} s in all)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
