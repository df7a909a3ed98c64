"""Only regular files are shards: a FIFO, a socket or a device named directly is
refused at once with a clear error, never a hang (opening a FIFO for reading
blocks until a writer comes). Each case runs in a subprocess under a timeout, so
a regression fails instead of hanging the suite."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from shardcat import TFRecordWriter, make_example

TIMEOUT = 60


def _shards(tmp_path: Path) -> dict[str, Path]:
    """A regular TFRecord shard, a FIFO, a Unix socket and a device, all named ``*.tfrecord``."""
    with TFRecordWriter(tmp_path / "good.tfrecord") as w:
        w.write(make_example({"key": "k0"}).SerializeToString())
    os.mkfifo(tmp_path / "x.tfrecord")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "s.tfrecord"))
    server.close()  # the socket file stays
    os.symlink("/dev/zero", tmp_path / "z.tfrecord")  # a character device, through a link
    return {
        "FIFO": tmp_path / "x.tfrecord",
        "socket": tmp_path / "s.tfrecord",
        "character device": tmp_path / "z.tfrecord",
    }


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            args, capture_output=True, text=True, timeout=TIMEOUT, cwd=cwd, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{args[1:]} still running after {TIMEOUT} s (blocked opening the file?)")


@pytest.mark.parametrize("kind", ["FIFO", "socket", "character device"])
def test_catalog_ingest_refuses_a_file_that_is_not_regular(tmp_path: Path, kind: str) -> None:
    path = _shards(tmp_path)[kind]
    catalog = tmp_path / "c.sqlite"
    cli = [sys.executable, "-m", "shardcat", "ingest"]
    result = _run([*cli, str(path), "-c", str(catalog), "-d", "d"], tmp_path)
    assert result.returncode == 1, result
    assert result.stderr.strip() == (
        f"error: {path}: not a regular file (a {kind}): only regular files are shards"
    )
    assert "Traceback" not in result.stderr
    # with a good shard beside it: refused all the same, nothing indexed
    both = _run([*cli, str(tmp_path / "good.tfrecord"), str(path), "-c", str(catalog)], tmp_path)
    assert both.returncode == 1 and "not a regular file" in both.stderr


def test_the_library_refuses_a_fifo_at_once(tmp_path: Path) -> None:
    fifo = _shards(tmp_path)["FIFO"]
    script = textwrap.dedent(
        f"""
        from shardcat import Catalog, ShardIOError, TFRecordRandomAccess, TFRecordReader

        fifo = {str(fifo)!r}
        for name, call in [
            ("Catalog.ingest", lambda: Catalog({str(tmp_path / "c.sqlite")!r}).ingest(fifo)),
            ("TFRecordReader", lambda: TFRecordReader(fifo)),
            ("TFRecordRandomAccess", lambda: TFRecordRandomAccess(fifo)),
        ]:
            try:
                call()
            except ShardIOError as exc:
                assert isinstance(exc, OSError) and exc.path == fifo, exc
                print(name, exc)
        """
    )
    result = _run([sys.executable, "-c", script], tmp_path)
    assert result.returncode == 0, result.stderr
    message = f"{fifo}: not a regular file (a FIFO): only regular files are shards"
    assert result.stdout.splitlines() == [
        f"Catalog.ingest {message}",
        f"TFRecordReader {message}",
        f"TFRecordRandomAccess {message}",
    ]


def test_a_glob_or_directory_still_skips_them(tmp_path: Path) -> None:
    _shards(tmp_path)
    from shardcat.paths import resolve_paths

    good = [str(tmp_path / "good.tfrecord")]
    assert resolve_paths(str(tmp_path / "*.tfrecord")) == good
    assert resolve_paths(tmp_path) == good


def test_a_shard_replaced_by_a_fifo_is_not_opened_by_readers(tmp_path: Path) -> None:
    """A reader opens shards without blocking (``O_NONBLOCK``): a FIFO put in an
    indexed shard's place is a stale shard at once."""
    _shards(tmp_path)
    script = textwrap.dedent(
        f"""
        import os
        from shardcat import Catalog, StaleShardError

        good = {str(tmp_path / "good.tfrecord")!r}
        with Catalog({str(tmp_path / "c.sqlite")!r}) as cat:
            cat.ingest(good, dataset="d").close()
            os.unlink(good)
            os.mkfifo(good)
            with cat.dataset("d") as reader:
                try:
                    reader["k0"]
                except StaleShardError as exc:
                    print(type(exc).__name__, exc)
        """
    )
    result = _run([sys.executable, "-c", script], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("StaleShardError ")
    assert "changed after it was indexed" in result.stdout
