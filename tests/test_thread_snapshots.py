"""A thread's read connection (and its read snapshot) is its own: a new thread that
the OS gives an ended thread's id never inherits that thread's snapshot."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import shardcat.catalog.store as store
from shardcat import Catalog, TFRecordWriter, make_example


def _shard(path: Path, prefix: str) -> str:
    with TFRecordWriter(path) as writer:
        for i in range(4):
            writer.write(make_example({"key": f"{prefix}{i}", "label": i}).SerializeToString())
    return str(path)


def _run(target) -> int:
    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    assert thread.ident is not None
    return thread.ident


def test_a_new_thread_with_an_ended_threads_id_sees_the_catalog_as_it_is_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # snapshots kept long enough that the ended thread's would still be current
    monkeypatch.setattr(store, "SNAPSHOT_SECONDS", 120.0)
    with Catalog(tmp_path / "c.sqlite") as cat:
        cat.ingest(_shard(tmp_path / "a.tfrecord", "a"), "a").close()
        reader = cat.dataset("a")
        seen: list[object] = []

        # the first thread begins a read snapshot and ends with it open
        ended = _run(lambda: seen.append(reader.get_record("a1").features.feature["label"]))
        assert seen == [reader.get_record("a1").features.feature["label"]]
        with Catalog(tmp_path / "c.sqlite") as other:  # another writer (or process)
            other.ingest(_shard(tmp_path / "b.tfrecord", "b"), "b").close()

        b = cat.dataset("b")  # opened here: the catalog as it is now

        def read_b() -> None:
            try:
                seen.append((threading.get_ident(), b.key_at(2), len(b)))
            except Exception as exc:  # reported below, with the thread's id
                seen.append((threading.get_ident(), exc))

        # Linux hands an ended thread's id to the next thread most of the time: try
        # until one got it (the test is about that thread)
        for _ in range(200):
            seen.clear()
            if _run(read_b) == ended:
                break
        assert seen and seen[0][0] == ended, "no thread got the ended thread's id"
        assert seen == [(ended, "b2", 4)]
        reader.close()
        b.close()
