"""Every code block of README.md runs, in order, in one fresh directory, as a
reader following the README would run it; so the docs cannot drift from the code.

A block preceded by ``<!-- not run: REASON -->`` is left out (the set-up: ``make
demo``/``make test`` would run this test again; ``make lint``/``make bench``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from doc_blocks import Block, object_stores, page_blocks, run_blocks

README = Path(__file__).resolve().parents[1] / "README.md"
RUN, NOT_RUN_COUNT = 9, 4  # command line, Python, Parquet, torch, snapshot, TensorDB, server x2, S3


def test_markers_are_read() -> None:
    text = "a\n<!-- not run: set-up -->\n```bash\nmake x\n```\n\n```python\nprint(1)\n```\n"
    assert page_blocks(text) == [
        Block(3, "bash", "make x\n", "set-up"),
        Block(7, "python", "print(1)\n", None),
    ]


def test_every_readme_block_runs_in_order(tmp_path: Path) -> None:
    pytest.importorskip("tensordict", reason="the TensorDB block needs the torch extra")
    pytest.importorskip("psycopg", reason="the PostgreSQL blocks need the postgres extra")
    from shardcat.testing.postgres import postgres_server

    blocks = page_blocks(README.read_text(encoding="utf-8"))
    skipped = [b for b in blocks if b.not_run is not None]
    assert [b.body.split()[:2] for b in skipped] == [
        ["make", "demo"],
        ["shardcat/", "__init__.py"],
        ["#", "pyproject.toml:"],
        ["make", "lint"],
    ]
    assert (len(blocks) - len(skipped), len(skipped)) == (RUN, NOT_RUN_COUNT)
    with postgres_server() as server, object_stores(tmp_path / "stores") as stores:
        work = run_blocks("README.md", blocks, tmp_path, {"CATALOG_URL": server, **stores})
    # What the blocks promise: one catalog for the commands and the Python block, the
    # feature written by `catalog get`, the converted shards, the skill file.
    assert (work / "shardcat.sqlite").is_file()
    assert not (work / "data" / "train" / "shardcat.sqlite").exists()
    assert (work / "img.jpg").read_bytes()[:3] == b"\xff\xd8\xff"
    assert sorted(p.name for p in (work / "tfrecords").iterdir()) == [
        "train-00000-of-00002.tfrecord",
        "train-00001-of-00002.tfrecord",
    ]
    assert (tmp_path / "home" / ".claude" / "skills" / "shardcat" / "SKILL.md").is_file()
    assert (work / "remote.jpg").read_bytes()[:3] == b"\xff\xd8\xff"  # read from S3
