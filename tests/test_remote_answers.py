"""A misbehaving HTTP server on loopback (every mode of
:data:`shardcat.testing.lies.LIES`: a 206 without Content-Range, a wrong or
unreadable Content-Range, a body shorter, longer or shifted, a 200 with the whole
object or with garbage, another 2xx, 416, a connection cut halfway) under
TFRecord and tar readers: every read, single or batched (coalesced ranges),
returns the record's exact bytes or a ShardcatError naming the URL, never other
bytes. The bytes to expect are read from the same shards on local disk."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shardcat import Catalog, CorruptRecordError, ShardIOError, StaleShardError
from shardcat.sources import remote
from shardcat.testing.lies import LIES
from shardcat.testing.required import need
from shardcat.testing.servers import RangeServer

need("aiohttp", why="shardcat[remote] (aiohttp)")

from remote_shards import sample_tar, write_shards  # noqa: E402 - after the extras are checked

# What each mode must give: the right bytes, an error, or either (the headers are
# true to the request but the bytes are not: only a check of the bytes themselves
# can tell; a batch checks the TFRecord frame / tar header its prefetched range
# holds, a single read relies on the stored per-record check of issue 26 item 1).
RIGHT = {"wider", "whole"}
UNTOLD = {"shifted", "garbage-200"}
ERROR = set(LIES) - RIGHT - UNTOLD

Read = Callable[[Any], Any]

TF_SINGLE: list[Read] = [
    lambda r: r.get_raw("r0_3"),
    lambda r: r.get_record("r0_11"),
    lambda r: r.get_feature("r0_20", "image"),
    lambda r: r.get_record_at(5, raw=True),
    lambda r: r["r0_30"],
]
TF_BATCH: list[Read] = [
    lambda r: r.get_many(["r0_9", "r0_2", "r0_35", "r0_36"], raw=True),
    lambda r: r.get_many(["r0_0", "r0_39", "r0_17"]),
    lambda r: r.get_many_at(slice(10, 16), raw=True),
]
TAR_SINGLE: list[Read] = [
    lambda r: r.get_feature("s007", "jpg"),
    lambda r: r.get_feature("s012", "cls"),
]
TAR_BATCH: list[Read] = [  # a sample's two members are one batch
    lambda r: r.get_raw("s003"),
    lambda r: r.get_record("s011"),
    lambda r: r.get_record_at(5, raw=True),
    lambda r: r["s000"],
    lambda r: r.get_many(["s009", "s002", "s019"], raw=True),
    lambda r: r.get_many_at(slice(10, 14)),
]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The server; per format, a reader of its shard over HTTP and one of its local copy."""
    root = tmp_path_factory.mktemp("www")
    write_shards(root, shards=1, records=40, payload=700, seed=3)
    sample_tar(root / "s.tar")
    server = RangeServer(str(root))
    server.start()
    cat = Catalog(tmp_path_factory.mktemp("cat") / "c.sqlite")
    try:
        yield {
            "server": server,
            "tfrecord": (
                cat.ingest(f"{server.url}/train-00000.tfrecord", "web_tf"),
                cat.ingest(str(root / "train-00000.tfrecord"), "local_tf"),
            ),
            "tar": (
                cat.ingest(f"{server.url}/s.tar", "web_tar"),
                cat.ingest(str(root / "s.tar"), "local_tar"),
            ),
        }
    finally:
        cat.close()
        server.stop()


def _outcomes(served: dict[str, Any], fmt: str, mode: str, reads: list[Read]) -> list[str]:
    """Each read under lie ``mode``: ``right``, ``error`` (a ShardcatError naming the
    shard's URL) or ``WRONG`` (other bytes)."""
    web, local = served[fmt]
    server = served["server"]
    expected = [read(local) for read in reads]
    found = []
    server.lie = mode
    try:
        for read, want in zip(reads, expected, strict=True):
            try:
                got = read(web)
            except (ShardIOError, StaleShardError, CorruptRecordError) as exc:
                assert server.url in str(exc), exc
                found.append("error")
            else:
                found.append("right" if got == want else "WRONG")
    finally:
        server.lie = ""
    assert [read(web) for read in reads] == expected  # honest again: all right
    return found


def _check(found: list[str], mode: str, untold: str) -> None:
    """Never other bytes; an honest answer is right; a lie the reader can tell is an
    error (or the right bytes, where it changed nothing: a range at the object's end
    served "long" is the range asked)."""
    assert "WRONG" not in found, found
    if mode in RIGHT:
        assert set(found) == {"right"}, found
    elif mode in ERROR or untold == "error":
        assert "error" in found, found


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote, "BACKOFF", 0.001)  # a cut connection is retried


@pytest.mark.parametrize("mode", list(LIES))
@pytest.mark.parametrize("fmt", ["tfrecord", "tar"])
def test_batched_reads_of_a_lying_server_are_right_or_errors(
    served: dict[str, Any], fmt: str, mode: str
) -> None:
    """Batches (coalesced ranges holding each record's frame / header): bytes the
    headers cannot tell apart are caught by the frame / tar header around them."""
    reads = TF_BATCH if fmt == "tfrecord" else TAR_BATCH
    _check(_outcomes(served, fmt, mode, reads), mode, untold="error")
    served["server"].counter.reset()
    reads[0](served[fmt][0])
    assert len(served["server"].counter.gets()) == 1  # the batch's ranges: one request


@pytest.mark.parametrize("mode", list(LIES))
@pytest.mark.parametrize("fmt", ["tfrecord", "tar"])
def test_single_reads_of_a_lying_server_are_right_or_errors(
    served: dict[str, Any], fmt: str, mode: str
) -> None:
    """Single reads ask for the payload only: what the headers tell is proven
    (Content-Range present, naming a range that holds the bytes asked, of the
    object's size; a 200 is the whole object); bytes the headers cannot tell
    apart (``shifted``, ``garbage-200``) are caught by the stored per-record check."""
    reads = TF_SINGLE if fmt == "tfrecord" else TAR_SINGLE
    _check(_outcomes(served, fmt, mode, reads), mode, untold="error")


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("no-content-range", "the store answered 206 Partial Content without a Content-Range"),
        ("status-203", "the store answered HTTP 203 Non-Authoritative Information, not 200 or 206"),
        (
            "partial-200",
            r"the store answered \d+ bytes without a Content-Range for bytes \d+-\d+, not the "
            "whole object of 30230 bytes",
        ),
        (
            "total-differs",
            r"the store answered Content-Range 'bytes \d+-\d+/30231' with \d+ bytes for bytes "
            r"\d+-\d+ of an object of 30230 bytes",
        ),
    ],
)
def test_a_refused_answer_says_what_the_store_did(
    served: dict[str, Any], mode: str, said: str
) -> None:
    web, _ = served["tfrecord"]
    served["server"].lie = mode
    try:
        with pytest.raises(
            ShardIOError, match=r"train-00000\.tfrecord: cannot read bytes \d+-\d+: " + said
        ):
            web.get_feature("r0_20", "image")
    finally:
        served["server"].lie = ""
