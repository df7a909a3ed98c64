"""Members of any size: one ``pread`` returns at most 2,147,479,552 bytes on Linux,
so reads loop until they have the length, and ``catalog get`` streams a member
instead of holding it. The archives are sparse files (a tar header, then a
member whose data is holes but for a few marks), so they cost no disk; each
test runs its reader in a subprocess (its memory is given back at once, and its
peak RSS is measured)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import textwrap
import tracemalloc
from pathlib import Path

import pytest

from shardcat import Catalog

MAX_PREAD = 2_147_479_552  # Linux's MAX_RW_COUNT: the most one read(2)/pread(2) returns
BLOCK = 512

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux's pread limit")


def sparse_tar(path: Path, size: int) -> dict[int, bytes]:
    """A tar archive of one sample ``big`` with a ``bin`` member of ``size`` bytes,
    all zeros but the marks returned (content offset -> bytes)."""
    info = tarfile.TarInfo("big.bin")
    info.size = size
    header = info.tobuf(format=tarfile.GNU_FORMAT)
    assert len(header) == BLOCK
    end = BLOCK + -(-size // BLOCK) * BLOCK + 2 * BLOCK
    marks = {
        0: b"HEAD",
        MAX_PREAD - 2: b"<2GiB>",  # across the end of the first pread
        size // 2: b"MIDDLE",
        size - 4: b"TAIL",
    }
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(end)
        for at, mark in marks.items():
            os.pwrite(f.fileno(), mark, BLOCK + at)
    return marks


def expected(marks: dict[int, bytes], start: int, n: int) -> bytes:
    """The member's bytes ``start ... start + n``."""
    out = bytearray(n)
    for at, mark in marks.items():
        lo, hi = max(at, start), min(at + len(mark), start + n)
        if lo < hi:
            out[lo - start : hi - start] = mark[lo - at : hi - at]
    return bytes(out)


def ingest(tmp_path: Path, size: int) -> tuple[Path, dict[int, bytes]]:
    """The archive, ingested in this process, which must not hold the member's bytes
    (its check is hashed as it is read; the pages of the mapped file are the page
    cache's, not the process's: Python's own allocations are what is measured)."""
    marks = sparse_tar(tmp_path / "big.tar", size)
    catalog = tmp_path / "c.sqlite"
    tracemalloc.start()
    try:
        with Catalog(catalog) as cat:
            cat.ingest(tmp_path / "big.tar", dataset="big", workers=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"ingest of a {size:,}-byte member allocated {peak:,} bytes"
    return catalog, marks


def test_a_member_over_2_gib_reads_exactly(tmp_path: Path) -> None:
    """``get_feature`` of a member one pread cannot return whole (the library API
    returns bytes: the member is held once it is read)."""
    size = MAX_PREAD + 8192 + 7
    catalog, marks = ingest(tmp_path, size)
    script = textwrap.dedent(
        f"""
        import resource
        from shardcat import Catalog

        with Catalog({str(catalog)!r}) as cat, cat.dataset("big") as reader:
            data = reader.get_feature("big", "bin")
            print(len(data))
            for at, mark in {marks!r}.items():
                print(at, data[at : at + len(mark)] == mark)
            print(data[4 : 1 << 20].count(0), data[MAX - 4096 : MAX + 4096].count(0))
        print("peak", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
        """
    ).replace("MAX", str(MAX_PREAD))
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == str(size)
    assert lines[1:5] == [f"{at} True" for at in marks]
    assert lines[5] == f"{(1 << 20) - 4} {8192 - 6}"  # zeros around the marks
    print(lines[6], "KiB")


def test_catalog_get_streams_a_5_gib_member(tmp_path: Path) -> None:
    """``catalog get`` writes a member as it reads it (1 MiB at a time), so its peak
    memory stays far below the member's size; the bytes are compared as they come."""
    size = 5 * (1 << 30) + 123
    catalog, marks = ingest(tmp_path, size)
    # the catalog process is the only child of this wrapper: its peak RSS is the wrapper's
    # RUSAGE_CHILDREN
    wrapper = textwrap.dedent(
        """
        import resource, subprocess, sys
        rc = subprocess.run(sys.argv[1:]).returncode
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        print(f"peak {peak}", file=sys.stderr)
        sys.exit(rc)
        """
    )
    cli = [sys.executable, "-m", "shardcat", "get", "big", "big", "bin", "-c", str(catalog)]
    with subprocess.Popen(
        [sys.executable, "-c", wrapper, *cli], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        done = 0
        while chunk := proc.stdout.read(1 << 20):
            assert chunk == expected(marks, done, len(chunk)), f"bytes differ near {done}"
            done += len(chunk)
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=300) == 0, err
    assert done == size
    peak_kib = int(err.split("peak ")[1])
    assert peak_kib < 1 << 20, f"catalog get peaked at {peak_kib} KiB for a 5 GiB member"
    print(f"catalog get of a 5 GiB member: peak RSS {peak_kib} KiB")


def test_catalog_get_output_file(tmp_path: Path) -> None:
    """``-o FILE``: the same streaming write into a file (a small member: the content
    compared whole)."""
    from typer.testing import CliRunner

    from shardcat.cli import app

    size = 3 * (1 << 20) + 5  # several chunks
    catalog, marks = ingest(tmp_path, size)
    out = tmp_path / "out.bin"
    result = CliRunner().invoke(
        app, ["get", "big", "big", "bin", "-c", str(catalog), "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == expected(marks, 0, size)
    assert f"wrote {size:,} bytes to {out}" in result.output
