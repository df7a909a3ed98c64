"""A local ingest in a process where Ray runs, or ran (``ray.shutdown()`` leaves
gRPC's threads running): its workers start from a fork server, never forked from
a process holding Ray's threads and state, and the ingest gives exact keys and
bytes, bounded in time (a hang fails the test)."""

from __future__ import annotations

from pathlib import Path

from shardcat import Catalog
from shardcat.catalog.processes import fork_hazards, worker_start_method
from shardcat.testing.required import need

need("ray", why="shardcat[ray]")

from test_fork_safety import RECORDS, SHARDS, contents, write_shards  # noqa: E402

from shardcat.testing.ray import ClusterSpec, deadline, local_cluster  # noqa: E402

LIMIT = 120  # seconds the local ingest may take


def ingest_here(tmp_path: Path, name: str) -> None:
    """A local ingest with 2 workers of ``SHARDS`` shards: every key and byte."""
    truth = write_shards(tmp_path / name)
    catalog = tmp_path / f"{name}.sqlite"
    with deadline(LIMIT, "a local ingest beside Ray"), Catalog(catalog) as cat:
        reader = cat.ingest(str(tmp_path / name / "*.tfrecord"), "train", workers=2)
        assert len(reader) == SHARDS * RECORDS
        reader.close()
    assert contents(catalog) == truth


def test_a_local_ingest_while_ray_runs_and_after_it_shut_down(tmp_path: Path) -> None:
    with local_cluster(ClusterSpec(workers=0, head_cpus=1)):
        assert "Ray is initialized" in fork_hazards()
        assert worker_start_method() == "forkserver"
        ingest_here(tmp_path, "running")
    assert fork_hazards() and worker_start_method() == "forkserver", fork_hazards()
    ingest_here(tmp_path, "shut-down")
