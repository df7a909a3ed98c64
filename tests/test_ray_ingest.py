"""``Catalog.ingest(..., engine="ray")`` on a real local Ray cluster (a head without
CPUs and two worker nodes of one CPU each): fanned out over both nodes it gives
exactly what a local ingest gives; a worker node's raylet SIGKILLed mid-scan loses
nothing (SQLite and the private PostgreSQL server): every shard committed once;
bad records, failures and remote shards as locally; a SQLite catalog with a node
on another host is refused; a stopped driver gives the claims back; the CLI."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from damage import flip_keeping_mtime
from sqlalchemy import select

from shardcat import Catalog, IngestError
from shardcat.catalog import schema
from shardcat.catalog.backend import make_engine
from shardcat.errors import CatalogError
from shardcat.formats import registry
from shardcat.formats.tfrecord import TFRecordWriter, make_example
from shardcat.testing.required import need

need("ray.data", why="shardcat[ray]")


from shardcat.facade.ray_ingest import HostId, host_id, node_hosts, refuse_other_hosts  # noqa: E402
from shardcat.testing.ray import (  # noqa: E402
    ClusterSpec,
    alive_nodes,
    deadline,
    kill_raylet,
    local_cluster,
    register_slow_format,
    register_test_formats,
    scanning_markers,
)
from shardcat.testing.servers import RangeServer  # noqa: E402

RECORDS = 50  # per shard
LIMIT = 300  # seconds any one ingest may take before the test fails
NODE = {"object_store_memory": 128 * 1024 * 1024, "num_cpus": 1}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    spec = ClusterSpec(
        workers=2,
        head_cpus=0,
        setup_hook=register_test_formats.__module__ + ".register_test_formats",
    )
    with pytest.MonkeyPatch.context() as patch, local_cluster(spec) as started:
        registry.known_formats()  # (entry points read into the real registry first)
        patch.setattr(registry, "_registry", dict(registry._registry))  # this module's own
        register_test_formats()  # the driver reads what the workers scanned with them
        yield started


def ensure_two_workers(cluster: Any) -> None:
    """Two alive worker nodes again (a test may have killed one)."""
    while len(cluster.worker_nodes) < 2:
        cluster.add_node(**NODE)
    cluster.wait_for_nodes(timeout=120)
    assert len(alive_nodes()) == 3


def write_shards(root: Path, shards: int) -> dict[str, bytes]:
    """``shards`` TFRecord shards of ``RECORDS`` records; the truth: key -> payload."""
    root.mkdir(parents=True, exist_ok=True)
    truth = {}
    for s in range(shards):
        with TFRecordWriter(root / f"part-{s:03d}.tfrecord") as w:
            for i in range(RECORDS):
                key = f"s{s}r{i:03d}"
                truth[key] = key.encode() * (1 + i % 7)
                w.write(make_example({"key": key, "data": truth[key], "label": i % 5}))
    return truth


def contents(catalog: Any, dataset: str = "train") -> dict[str, bytes]:
    """Every record of the dataset: key -> its ``data`` feature (each key once)."""
    with Catalog(catalog) as cat, cat.dataset(dataset) as reader:
        keys = reader.get_keys()
        found = {k: reader.get_feature(k, "data") for k in keys}
    assert len(found) == len(keys)
    return found


def shard_states(catalog: Any) -> list[tuple[str, str, int | None, str | None]]:
    """Each shard's (name, state, record count, claim owner), as the catalog holds them."""
    engine = make_engine(str(catalog))
    try:
        with engine.connect() as conn:
            s = schema.shards
            rows = conn.execute(
                select(s.c.path, s.c.state, s.c.num_records, s.c.claim_owner).order_by(s.c.path)
            ).all()
    finally:
        engine.dispose()
    return [(Path(r.path).name, r.state, r.num_records, r.claim_owner) for r in rows]


def ingest_ray(catalog: Any, pattern: str, **options: Any) -> tuple[Any, list[Any]]:
    """A Ray ingest, with the outcomes its progress saw."""
    seen: list[Any] = []
    with deadline(LIMIT, "the Ray ingest"), Catalog(catalog) as cat:
        reader = cat.ingest(
            pattern, "train", engine="ray", progress=lambda o, n: seen.append(o), **options
        )
        count = len(reader)
        reader.close()
    return count, seen


def test_fanned_out_over_both_nodes_as_a_local_ingest(cluster: Any, tmp_path: Path) -> None:
    ensure_two_workers(cluster)
    truth = write_shards(tmp_path / "data", 6)
    pattern = str(tmp_path / "data" / "*.tfrecord")
    count, seen = ingest_ray(tmp_path / "ray.sqlite", pattern, format="slowtfrecord")
    assert count == len(truth) == 6 * RECORDS
    # progress on the driver: each shard once, with its records
    assert sorted((Path(o.path).name, o.records, o.error) for o in seen) == [
        (f"part-{s:03d}.tfrecord", RECORDS, None) for s in range(6)
    ]
    ran_on = {
        node.node_id: scanning_markers(tmp_path / "data", node.node_id)
        for node in cluster.worker_nodes
    }
    assert all(ran_on.values()), ran_on  # both worker nodes scanned shards
    assert sorted(n for on in ran_on.values() for n in on) == sorted(
        p.name for p in (tmp_path / "data").glob("*.tfrecord")
    )
    with Catalog(tmp_path / "local.sqlite") as cat:
        cat.ingest(pattern, "train", workers=2).close()
    assert contents(tmp_path / "ray.sqlite") == contents(tmp_path / "local.sqlite") == truth
    assert {st for _, st, _, _ in shard_states(tmp_path / "ray.sqlite")} == {"ready"}
    # nothing to do the second time: no task claims anything
    count, seen = ingest_ray(tmp_path / "ray.sqlite", pattern, format="slowtfrecord")
    assert (count, seen) == (len(truth), [])


def test_the_slow_format_is_used_by_name_only(cluster: Any, tmp_path: Path) -> None:
    """``slowtfrecord`` (registered in this process for the whole module) never claims
    a TFRecord file by its bytes: a later ingest in this process that detects the
    format scans with ``tfrecord``, in this process and in its workers (with
    ``slowtfrecord`` the workers started Ray in the fork and hung in gRPC)."""
    from shardcat.formats.registry import detect_format

    truth = write_shards(tmp_path / "data", 2)
    assert detect_format(str(tmp_path / "data" / "part-000.tfrecord")) == "tfrecord"
    with deadline(LIMIT, "a local ingest"), Catalog(tmp_path / "cat.sqlite") as cat:
        cat.ingest(str(tmp_path / "data" / "*.tfrecord"), "train", workers=2).close()
        assert cat.info("train").format == "tfrecord"
    assert contents(tmp_path / "cat.sqlite") == truth
    assert not list((tmp_path / "data").glob("*.scanning"))


def test_tasks_that_crash_end_with_an_ingest_error(cluster: Any, tmp_path: Path) -> None:
    """Every attempt of every task segfaults in its scan: Ray's retries are bounded
    (TASK_RETRIES), then the ingest ends with an IngestError naming each shard and
    the crash; nothing is left claimed."""
    from shardcat.facade.ray_ingest import TASK_RETRIES

    ensure_two_workers(cluster)
    write_shards(tmp_path / "data", 2)
    catalog = tmp_path / "cat.sqlite"
    with pytest.raises(IngestError) as caught:
        ingest_ray(catalog, str(tmp_path / "data" / "*.tfrecord"), format="crashtfrecord")
    failures = sorted((f.path, f.error) for f in caught.value.failures)
    assert [p for p, _ in failures] == ["data/part-000.tfrecord", "data/part-001.tfrecord"]
    for path, error in failures:
        assert error.startswith(
            f"{path}: its Ray task failed in each of its {TASK_RETRIES + 1} attempts "
            "(WorkerCrashedError: The worker died unexpectedly while executing this task."
        )
    assert str(caught.value).endswith("(and 1 more failed shards)")
    assert shard_states(catalog) == []  # a first ingest that indexed nothing leaves no dataset


def kill_when_scanning(cluster: Any, directory: Path) -> tuple[threading.Thread, dict[str, Any]]:
    """A thread that, as soon as a task on the first worker node has claimed a shard
    and begun to scan it (its marker), SIGKILLs the node's raylet and workers, that
    task's process among them (a host lost: nothing of it runs on); what it saw."""
    victim = min(cluster.worker_nodes, key=lambda n: n.node_id)
    seen: dict[str, Any] = {"node": victim.node_id}

    def kill() -> None:
        end = time.monotonic() + LIMIT
        while not scanning_markers(directory, victim.node_id):
            if time.monotonic() > end:
                seen["error"] = "no task began to scan on the victim node"
                return
            time.sleep(0.05)
        seen["scanning"] = scanning_markers(directory, victim.node_id)
        kill_raylet(cluster, victim)
        seen["killed"] = True

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread, seen


def ingest_through_a_node_kill(cluster: Any, catalog: Any, tmp_path: Path) -> None:
    """Kill a worker node mid-ingest: the ingest completes, every shard ready and
    committed once (one outcome each), the exact records, nothing left claimed."""
    ensure_two_workers(cluster)
    truth = write_shards(tmp_path / "data", 8)
    thread, seen = kill_when_scanning(cluster, tmp_path / "data")
    count, outcomes = ingest_ray(
        catalog, str(tmp_path / "data" / "*.tfrecord"), format="slowtfrecord"
    )
    thread.join(LIMIT)
    assert seen.get("killed"), seen
    assert seen["node"] not in alive_nodes()
    assert count == len(truth)
    names = sorted(Path(o.path).name for o in outcomes)
    assert names == [f"part-{s:03d}.tfrecord" for s in range(8)]  # each shard once
    assert all(o.error is None and o.records == RECORDS for o in outcomes)
    assert shard_states(catalog) == [
        (f"part-{s:03d}.tfrecord", "ready", RECORDS, None) for s in range(8)
    ]
    assert contents(catalog) == truth
    # the shard the killed node was scanning was scanned again on the other node
    (survivor,) = cluster.worker_nodes
    assert set(seen["scanning"]) <= set(scanning_markers(tmp_path / "data", survivor.node_id))


def test_a_node_killed_mid_ingest_loses_nothing(cluster: Any, tmp_path: Path) -> None:
    ingest_through_a_node_kill(cluster, tmp_path / "cat.sqlite", tmp_path)


def test_a_node_killed_mid_ingest_into_postgresql(cluster: Any, tmp_path: Path) -> None:
    need("psycopg", why="shardcat[postgres]")
    from shardcat.testing.postgres import find_binaries, fresh_database, postgres_server
    from shardcat.testing.required import missing

    if find_binaries() is None:
        missing("the PostgreSQL server binaries (initdb, postgres)")
    with postgres_server() as server, fresh_database(server) as url:
        ingest_through_a_node_kill(cluster, url, tmp_path)


def test_a_sqlite_catalog_with_a_node_on_another_host_is_refused(cluster: Any) -> None:
    """The check runs on real probe answers (one task pinned to each node): every node
    of this cluster is this host, so SQLite is allowed; the same answers plus a node
    on another host (a real HostId value: a second host cannot be had here) are
    refused, naming the hosts and pointing to PostgreSQL."""
    ensure_two_workers(cluster)
    here = host_id()
    nodes = node_hosts()
    assert set(nodes) == alive_nodes() and set(nodes.values()) == {here}
    refuse_other_hosts("cat.sqlite", here, nodes)  # allowed
    elsewhere = {**nodes, "n2": HostId("gpu-07", "another-boot")}
    with pytest.raises(CatalogError) as caught:
        refuse_other_hosts("cat.sqlite", here, elsewhere)
    assert str(caught.value) == (
        "cat.sqlite is a SQLite catalog, which only processes of one host may write, but "
        f"Ray nodes run on gpu-07 besides this host ({here.hostname}): ingest into a "
        "postgresql:// catalog, or on nodes of this host only"
    )
    # the same name after a reboot is another machine for SQLite's locks too
    rebooted = {**nodes, "n3": HostId(here.hostname, "not-this-boot")}
    with pytest.raises(CatalogError, match=f"run on {here.hostname} besides"):
        refuse_other_hosts("cat.sqlite", here, rebooted)


def test_bad_records_and_failures_as_locally(cluster: Any, tmp_path: Path) -> None:
    ensure_two_workers(cluster)
    truth = write_shards(tmp_path / "data", 3)
    shard = tmp_path / "data" / "part-001.tfrecord"
    flip_keeping_mtime(shard, shard.read_bytes().index(b"s1r010") + 2)
    pattern = str(tmp_path / "data" / "*.tfrecord")
    errors = {}
    for engine in ("local", "ray"):
        with deadline(LIMIT), Catalog(tmp_path / f"{engine}.sqlite") as cat:
            with pytest.raises(IngestError) as caught:
                cat.ingest(pattern, "train", engine=engine).close()
            errors[engine] = (str(caught.value), [o.path for o in caught.value.failures])
    assert errors["ray"] == errors["local"]
    assert "part-001.tfrecord" in errors["ray"][0] and "on_bad_record='skip'" in errors["ray"][0]
    assert shard_states(tmp_path / "ray.sqlite") == shard_states(tmp_path / "local.sqlite")
    for engine in ("local", "ray"):  # skip: one bad record costs only itself
        with deadline(LIMIT), Catalog(tmp_path / f"{engine}.sqlite") as cat:
            cat.ingest(pattern, "train", engine=engine, on_bad_record="skip").close()
            errors[engine] = [(b.key, b.offset) for b in cat.bad_records("train")]
    assert errors["ray"] == errors["local"] and len(errors["ray"]) == 1
    found = contents(tmp_path / "ray.sqlite")
    assert found == contents(tmp_path / "local.sqlite")
    assert set(truth) - set(found) == {"s1r010"}
    assert all(found[k] == truth[k] for k in found)


def test_remote_shards_are_read_by_the_tasks(cluster: Any, tmp_path: Path) -> None:
    ensure_two_workers(cluster)
    truth = write_shards(tmp_path / "data", 4)
    server = RangeServer(str(tmp_path / "data"))
    server.start()
    try:
        url = f"{server.url}/part-{{000..003}}.tfrecord"
        count, seen = ingest_ray(tmp_path / "web.sqlite", url)
        assert count == len(truth)
        assert sorted(o.path for o in seen) == [
            f"{server.url}/part-{s:03d}.tfrecord" for s in range(4)
        ]
        assert contents(tmp_path / "web.sqlite") == truth
    finally:
        server.stop()


def test_a_stopped_driver_cancels_its_tasks_and_gives_the_claims_back(
    cluster: Any, tmp_path: Path
) -> None:
    """SIGTERM to a driver process mid-ingest: it exits 143, no shard is left claimed,
    and the next ingest completes the rest."""
    ensure_two_workers(cluster)
    truth = write_shards(tmp_path / "data", 8)
    pattern = str(tmp_path / "data" / "*.tfrecord")
    hook = register_slow_format.__module__ + ".register_slow_format"
    script = (
        "import signal, sys, ray\n"
        "from shardcat import Catalog\n"
        "from shardcat.testing.ray import register_slow_format\n"
        "register_slow_format()\n"
        f"ray.init(address=sys.argv[3], runtime_env={{'worker_process_setup_hook': {hook!r}}})\n"
        "signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (ray.init takes it)\n"
        "with Catalog(sys.argv[1]) as cat:\n"
        "    cat.ingest(sys.argv[2], 'train', format='slowtfrecord', engine='ray')\n"
    )
    catalog = tmp_path / "cat.sqlite"
    driver = subprocess.Popen(
        [sys.executable, "-c", script, str(catalog), pattern, cluster.address],
        stderr=subprocess.PIPE,
    )
    try:
        with deadline(LIMIT, "waiting for the driver's tasks to scan"):
            while not any(
                scanning_markers(tmp_path / "data", n.node_id) for n in cluster.worker_nodes
            ):
                assert driver.poll() is None, driver.stderr and driver.stderr.read()
                time.sleep(0.05)
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(LIMIT) == 143, driver.stderr and driver.stderr.read()[-3000:]
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    states = shard_states(catalog)
    assert not [s for s in states if s[1] == "indexing" or s[3] is not None], states
    assert {s[1] for s in states} <= {"pending", "ready"} and "pending" in {s[1] for s in states}
    count, _ = ingest_ray(catalog, pattern, format="slowtfrecord")
    assert count == len(truth) and contents(catalog) == truth
    assert {s[1] for s in shard_states(catalog)} == {"ready"}


def test_the_cli_connects_ingests_and_disconnects(cluster: Any, tmp_path: Path) -> None:
    ensure_two_workers(cluster)
    truth = write_shards(tmp_path / "data", 4)
    catalog = tmp_path / "cat.sqlite"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardcat",
            "ingest",
            str(tmp_path / "data" / "*.tfrecord"),
            "-d",
            "train",
            "-c",
            str(catalog),
            "--engine",
            "ray",
            "--ray-address",
            cluster.address,
        ],
        capture_output=True,
        text=True,
        timeout=LIMIT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        f"dataset train: {len(truth)} records in 4 shards (200 indexed now)"
    )
    assert contents(catalog) == truth
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardcat",
            "ingest",
            str(tmp_path / "data" / "*.tfrecord"),
            "-c",
            str(catalog),
            "--engine",
            "spark",
        ],
        capture_output=True,
        text=True,
        timeout=LIMIT,
    )
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "engine must be one of local, ray, not 'spark'" in bad.stderr
