"""Ingest on a Ray cluster (``Catalog.ingest(..., engine="ray")``): each pending shard
becomes a Ray task, spread over the cluster's nodes, that claims, scans and commits
its shard where it runs through the same ingest session as local workers
(:class:`~shardcat.catalog.session.IngestSession`); the driver notes the outcomes as
they come (``ray.wait``) and does no scanning (remote shards are read by the tasks).

- **Claims across retries.** A task attempt claims as ``host:pid:start-time:tag``
  with the tag ``ray-<ingest>-<shard id>-<attempt>``: when Ray retries a task (its
  node or worker died), the new attempt takes over the earlier attempt's claim at
  once (``retry_of``: no lease to wait out), and an earlier attempt that still runs
  finds at commit that the claim is no longer its own: nothing is committed twice.
  A shard whose task failed past Ray's retries is an outcome of this ingest (the
  shard is given back, pending, for the next one).
- **Where the catalog is.** A SQLite catalog needs every node on the driver's host
  (one probe task per alive node, pinned to it, answers its host name and boot id);
  otherwise the ingest is refused, naming the hosts: use a ``postgresql://`` catalog.
- **Stopping.** Ctrl-C, SIGTERM or SIGHUP on the driver cancels the tasks (forced)
  and gives their claims back.
- **Connecting.** Without a connected Ray, ``ray.init(address=ray_address)`` (None:
  Ray's usual discovery) for the ingest and ``ray.shutdown()`` after it; the
  driver's own signal handlers are kept. Formats must be importable in the tasks
  (shardcat's own, or entry points; a format registered only in the driver is not).
"""

from __future__ import annotations

import contextlib
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from shardcat.catalog.backend import backend_for
from shardcat.catalog.commit import IngestJob
from shardcat.catalog.processes import Stopped, interruption
from shardcat.catalog.session import IngestSession
from shardcat.errors import CatalogError
from shardcat.facade.ingest import POLL_SECONDS, ShardOutcome, Work, index_claimed

__all__ = ["HostId", "RayEngine", "host_id", "node_hosts", "refuse_other_hosts"]

#: how long the probe of each node's host may take
PROBE_SECONDS = 60.0
#: how often Ray retries a shard's task whose worker or node died
TASK_RETRIES = 3


def _ray() -> Any:
    try:
        import ray
    except ImportError as missing:
        raise ImportError(
            f"engine='ray' needs Ray: pip install 'shardcat[ray]' ({missing})"
        ) from None
    return ray


@dataclass(frozen=True)
class HostId:
    """Which machine a process runs on: its host name and the kernel's boot id."""

    hostname: str
    boot_id: str

    def __str__(self) -> str:
        return self.hostname


def host_id() -> HostId:
    """This process's :class:`HostId`."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return HostId(socket.gethostname(), boot)


def node_hosts(timeout: float = PROBE_SECONDS) -> dict[str, HostId]:
    """The :class:`HostId` of every alive node of the connected cluster (node id ->
    host), from one zero-CPU probe task pinned to each node."""
    ray = _ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0, max_retries=0)(host_id)
    ids = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    refs = [
        probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(i, soft=False)).remote()
        for i in ids
    ]
    return dict(zip(ids, ray.get(refs, timeout=timeout), strict=True))


def refuse_other_hosts(catalog: str, here: HostId, nodes: Mapping[str, HostId]) -> None:
    """Refuse (:class:`CatalogError`) a SQLite ``catalog`` when a node is on another
    host than ``here`` (the driver's): SQLite's locks hold on one host only."""
    others = sorted({str(h) for h in nodes.values() if h != here})
    if others:
        raise CatalogError(
            f"{catalog} is a SQLite catalog, which only processes of one host may write, "
            f"but Ray nodes run on {', '.join(others)} besides this host ({here}): ingest "
            "into a postgresql:// catalog, or on nodes of this host only"
        )


@contextlib.contextmanager
def connected(address: str | None) -> Iterator[Any]:
    """Ray, connected: as it is when already initialized, else ``ray.init(address)``
    for the block and ``ray.shutdown()`` after it. The handlers of SIGTERM and
    SIGINT are kept as they were (``ray.init`` installs its own)."""
    ray = _ray()
    if ray.is_initialized():
        yield ray
        return
    signums = (signal.SIGTERM, signal.SIGINT)
    handlers = {s: signal.getsignal(s) for s in signums}
    try:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
        for s, h in handlers.items():
            signal.signal(s, h)
        yield ray
    finally:
        ray.shutdown()
        for s, h in handlers.items():
            signal.signal(s, h)


def index_one(job: IngestJob, stored: str, retry_of: str) -> ShardOutcome | None:
    """A Ray task: claim the shard stored as ``stored`` (taking over an earlier
    attempt's claim), scan it and commit it where this runs; None when another
    process holds it or it is no longer open."""
    tag = f"{retry_of}{uuid.uuid4().hex[:8]}"
    with IngestSession(job, tag=tag) as session:
        claimed = session.claim(only={stored}, retry_of=retry_of)
        return None if claimed is None else index_claimed(session, claimed)


@dataclass(frozen=True)
class RayEngine:
    """The :data:`~shardcat.facade.ingest.ShareWork` of ``engine="ray"``: the pending
    shards as tasks on the Ray cluster at ``address`` (None: Ray's discovery)."""

    address: str | None = None

    def __call__(
        self,
        session: IngestSession,
        work: Work,
        note: Callable[[ShardOutcome | None], None],
        outcomes: list[ShardOutcome],
    ) -> None:
        job = session.job
        with connected(self.address) as ray:
            if backend_for(job.catalog).local_file is not None:
                refuse_other_hosts(backend_for(job.catalog).display, host_id(), node_hosts())
            run = f"ray-{uuid.uuid4().hex[:12]}-"
            task = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(index_one)
            running: dict[Any, str] = {}
            try:
                _fan_out(session, work, note, _Tasks(task, run, running))
            finally:
                for ref in running:
                    with contextlib.suppress(Exception):
                        ray.cancel(ref, force=True)
                if running:
                    session.give_back(tagged=run)


@dataclass(frozen=True)
class _Tasks:
    """The tasks of one Ray ingest: the remote function, the ingest's tag (``run``)
    and the tasks still running (object ref -> stored shard path)."""

    task: Any
    run: str
    running: dict[Any, str]

    def submit(self, job: IngestJob, shard_id: int, stored: str) -> None:
        ref = self.task.options(scheduling_strategy="SPREAD").remote(
            job, stored, f"{self.run}{shard_id}-"
        )
        self.running[ref] = stored


def _fan_out(
    session: IngestSession,
    work: Work,
    note: Callable[[ShardOutcome | None], None],
    tasks: _Tasks,
) -> None:
    """Submit a task per open shard and note the outcomes as they come, in rounds
    until no shard is open (a round where none was claimable waits for the other
    processes holding them). A shard whose task failed past Ray's retries is noted
    failed and not tried again in this ingest."""
    ray = _ray()
    lost: set[str] = set()
    waiting = session.waiting(work.wait_timeout)
    while True:
        shards = [(i, p) for i, p in session.pending_shards() if p not in lost]
        session.close()  # no connection held while the tasks run
        if not shards:
            return
        for shard_id, stored in shards:
            tasks.submit(session.job, shard_id, stored)
        running = tasks.running
        noted = False
        while running:
            try:
                ready, _ = ray.wait(list(running), num_returns=1)
            except KeyboardInterrupt as exc:  # Ray turns what a handler raised into a plain one
                raise exc if isinstance(exc, Stopped) else interruption() from None
            stored = running.pop(ready[0])
            try:
                outcome = ray.get(ready[0])
            except ray.exceptions.RayTaskError as exc:  # the scan raised past its shard
                raise exc.cause if isinstance(exc.cause, BaseException) else exc from None
            except ray.exceptions.RayError as exc:  # worker or node lost past the retries
                lost.add(stored)
                outcome = ShardOutcome(stored, 0, _lost(stored, exc))
            noted = noted or outcome is not None
            note(outcome)
        if lost:
            session.give_back(tagged=tasks.run)
        if noted:
            waiting.started = None
        else:
            waiting.still()
            time.sleep(POLL_SECONDS)


def _lost(stored: str, exc: BaseException) -> str:
    """What a shard whose task failed past Ray's retries says: how often, and how
    (a crashed worker: Ray does not say by which signal, nor whether the OOM killer
    sent it)."""
    return (
        f"{stored}: its Ray task failed in each of its {TASK_RETRIES + 1} attempts "
        f"({type(exc).__name__}: {exc})"
    )
