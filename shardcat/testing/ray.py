"""A real local Ray cluster for tests and benchmarks: a head and worker nodes on this
machine (``ray.cluster_utils.Cluster``), small (one CPU and a ~128 MB object store
per node by default), bounded in time, always shut down; the node-kill helper
(SIGKILL a worker node's raylet and its workers, wait until the cluster has marked
it dead); and a slow TFRecord format (``slowtfrecord``, registered in each worker by
the cluster's ``setup_hook``) whose scan says on which node it runs, to kill that
node mid-scan.

Needs ``shardcat[ray]``. Every wait has a limit: a cluster that does not come up,
or a call that hangs, fails with :class:`TimeoutError` rather than hanging CI
(:func:`deadline` interrupts the main thread with ``SIGALRM``).
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

#: the GCS marks a node whose raylet stopped answering dead after about
#: period x threshold (the defaults take ~30 s; a test wants a few seconds)
FAST_HEALTH_CHECKS = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}


@dataclass(frozen=True)
class ClusterSpec:
    """The size of a local cluster: ``workers`` nodes besides the head, each with
    ``cpus`` CPUs and ``object_store`` bytes of object store (the head too:
    ``head_cpus``, 0 keeps tasks off the driver's node); ``setup_hook``: a
    ``"module.function"`` every worker process runs first (e.g.
    :func:`register_slow_format`)."""

    workers: int = 1
    cpus: int = 1
    head_cpus: int = 1
    object_store: int = 128 * 1024 * 1024
    start_timeout: float = 120.0
    system_config: dict[str, Any] = field(default_factory=lambda: dict(FAST_HEALTH_CHECKS))
    setup_hook: str | None = None


@contextlib.contextmanager
def deadline(seconds: float, what: str = "the Ray call") -> Iterator[None]:
    """Raise :class:`TimeoutError` in the main thread when the block takes longer than
    ``seconds`` (``SIGALRM``; the previous handler and timer are restored)."""

    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError(f"{what} took longer than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def local_cluster(spec: ClusterSpec | None = None) -> Iterator[Any]:
    """A started ``ray.cluster_utils.Cluster`` of ``spec`` with this process connected
    as its driver (``ray.init(address=...)``); shut down (driver, then every node's
    processes) when the block ends, whatever happened in it. The signal handlers
    ``ray.init`` installs in the driver (its SIGTERM handler exits with code 15) are
    put back as they were, so later code in the process sees its own."""
    import ray
    from ray.cluster_utils import Cluster

    spec = spec or ClusterSpec()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    node: dict[str, Any] = {"object_store_memory": spec.object_store, "include_dashboard": False}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            **node,
            "num_cpus": spec.head_cpus,
            "_system_config": spec.system_config,
        },
    )
    try:
        with deadline(spec.start_timeout, "starting the local Ray cluster"):
            for _ in range(spec.workers):
                cluster.add_node(**node, num_cpus=spec.cpus)
            cluster.wait_for_nodes(timeout=spec.start_timeout)
            hook = {} if spec.setup_hook is None else {"worker_process_setup_hook": spec.setup_hook}
            ray.init(address=cluster.address, log_to_driver=False, runtime_env=hook)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        # Ray's objects left in this process are finalized now, not in a child it forks
        # later (one segfaulted there in Ray's extension, in its turn of an ingest)
        gc.collect()


def alive_nodes() -> set[str]:
    """The node ids the cluster (its GCS) holds alive."""
    import ray

    return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


def raylet_pid(node: Any) -> int:
    """The pid of a ``ray._private.node.Node``'s raylet process."""
    from ray._private import ray_constants

    return int(node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid)


def descendants(pid: int) -> list[int]:
    """The pids of the processes below ``pid`` (children, theirs, ...), from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_raylet(cluster: Any, node: Any, *, timeout: float = 60.0) -> None:
    """SIGKILL the raylet of worker ``node`` (of ``cluster``: taken out of its list of
    workers) and the worker processes it started, and wait until the cluster marks
    the node dead, else :class:`TimeoutError`. What a lost host looks like to Ray:
    its tasks fail with a node-died error and are retried elsewhere."""
    if node is cluster.head_node:
        raise ValueError("kill_raylet kills a worker node; the head holds the driver")
    raylet = raylet_pid(node)
    # the raylet and the workers it started, at once: a lost host takes its task
    # processes with it (left alone, one may finish and hand its owner a result)
    for pid in [raylet, *descendants(raylet)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    end = time.monotonic() + timeout
    while node.node_id in alive_nodes():
        if time.monotonic() > end:
            raise TimeoutError(f"the cluster still holds node {node.node_id} alive")
        time.sleep(0.2)
    # what is left of the node (its object store, log monitor, ...)
    node.kill_all_processes(check_alive=False, allow_graceful=False, wait=True)
    cluster.worker_nodes.remove(node)


#: how long the ``slowtfrecord`` format takes to scan a shard
SLOW_SCAN_SECONDS = 2.0


def scanning_markers(directory: str | os.PathLike[str], node_id: str) -> dict[str, int]:
    """The shards ``slowtfrecord`` began to scan on node ``node_id`` and the pid of the
    process scanning each (the markers it leaves beside them:
    ``<shard>.<node id>.scanning``, holding the pid)."""
    suffix = f".{node_id}.scanning"
    found = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(suffix):
            with open(os.path.join(directory, name), encoding="ascii") as f:
                pid = f.read()
            if pid:  # (else being written)
                found[name[: -len(suffix)]] = int(pid)
    return found


def register_slow_format() -> None:
    """Register ``slowtfrecord`` (TFRecord, whose scan first leaves a marker beside the
    shard naming the Ray node it runs on and its pid, then takes :data:`SLOW_SCAN_SECONDS`; used
    by name only, never detected); a no-op when it is registered already. A cluster's
    ``setup_hook``."""
    from shardcat.formats.registry import known_formats, register_format
    from shardcat.formats.tfrecord import TFRecordFormat

    class SlowTFRecord(TFRecordFormat):
        NAME = "slowtfrecord"

        def sniff(self, head: bytes) -> bool:
            return False  # by name only: never a TFRecord file's detected format

        def scan_shard(self, path: str, options: Any) -> Any:
            import ray

            node = ray.get_runtime_context().get_node_id()
            with open(f"{path}.{node}.scanning~", "w", encoding="ascii") as f:
                f.write(str(os.getpid()))
            os.replace(f"{path}.{node}.scanning~", f"{path}.{node}.scanning")
            time.sleep(SLOW_SCAN_SECONDS)
            return super().scan_shard(path, options)

    if "slowtfrecord" not in known_formats():
        register_format("slowtfrecord", SlowTFRecord)


def register_test_formats() -> None:
    """Register ``slowtfrecord`` (:func:`register_slow_format`) and ``crashtfrecord``
    (:mod:`shardcat.testing.crashing`): a cluster's ``setup_hook``."""
    from shardcat.testing.crashing import register_crashing_format

    register_slow_format()
    register_crashing_format()
