"""The helper the Ray ingest's tests use (shardcat.testing.ray.kill_raylet) on a real
local cluster of its own (a head and one worker node): a SIGKILLed raylet is noticed
and its tasks are retried elsewhere. A module of its own, so the node it takes is no
other test's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardcat.testing.required import need

need("ray", why="shardcat[ray]")

import ray  # noqa: E402 - after the extra is checked

from shardcat.testing.ray import (  # noqa: E402
    ClusterSpec,
    alive_nodes,
    deadline,
    kill_raylet,
    local_cluster,
)

LIMIT = 300  # seconds any one Ray call may take before the test fails


@pytest.fixture
def cluster() -> Iterator[Any]:
    with local_cluster(ClusterSpec(workers=1)) as started:
        yield started


def test_a_killed_raylet_is_noticed_and_its_tasks_retried_elsewhere(
    cluster: Any, tmp_path: Path
) -> None:
    """The helper the Ray ingest's tests use: SIGKILL a worker node's raylet mid-task.
    The cluster marks the node dead, a task pinned to it fails, a retried one ends
    on the head. Its own cluster: it takes the worker node."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    (worker,) = cluster.worker_nodes
    started = tmp_path / "started"

    @ray.remote(num_cpus=1)
    def slow(marker: str) -> str:
        import time

        Path(marker).touch()
        time.sleep(5)
        return str(ray.get_runtime_context().get_node_id())

    pinned = slow.options(
        max_retries=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(worker.node_id, soft=False),
    ).remote(str(started))
    with deadline(LIMIT, "waiting for the task to start"):
        while not started.exists():
            ray.wait([pinned], timeout=0.1)
    # only now (submitted beside the pinned one, it could run first on the worker's
    # one CPU and end there before the kill): it waits for that CPU, or goes elsewhere
    retried = slow.options(
        max_retries=2,
        scheduling_strategy=NodeAffinitySchedulingStrategy(worker.node_id, soft=True),
    ).remote(str(tmp_path / "other"))
    kill_raylet(cluster, worker)
    assert worker.node_id not in alive_nodes() and len(alive_nodes()) == 1
    with deadline(LIMIT), pytest.raises(ray.exceptions.RayError):
        ray.get(pinned)
    with deadline(LIMIT):
        assert ray.get(retried) == cluster.head_node.node_id
