"""Running the code blocks of a Markdown page (README.md, docs/*.md) as a reader
following it would: in order, in one fresh directory, each block a script.

A block preceded by ``<!-- not run: REASON -->`` is left out. tests/test_readme.py
and tests/test_docs.py use this.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

FENCE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
NOT_RUN = re.compile(r"<!--\s*not run:\s*(?P<why>.*?)\s*-->\Z", re.DOTALL)
RUNNERS = {
    "bash": lambda path: ["bash", "-e", "-u", "-o", "pipefail", str(path)],
    "python": lambda path: [sys.executable, str(path)],
}


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    body: str
    not_run: str | None  # the reason, for a block marked <!-- not run: ... -->


def page_blocks(text: str) -> list[Block]:
    blocks = []
    end = 0
    for match in FENCE.finditer(text):
        marker = NOT_RUN.search(text[end : match.start()].rstrip())
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(Block(line, match["lang"], match["body"], marker["why"] if marker else None))
        end = match.end()
    return blocks


@contextlib.contextmanager
def object_stores(root: Path) -> Iterator[dict[str, str]]:
    """What the remote-storage blocks read: an S3 server (moto's, on loopback) holding
    ``s3://bucket/train/*.tfrecord`` and an HTTP server holding two tar shards."""
    boto3 = pytest.importorskip("boto3", reason="the remote block needs the dev extra")
    from shardcat.sample import make_sample
    from shardcat.testing.servers import RangeServer, S3Server

    keys = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    s3 = S3Server()
    s3.start()
    web = root / "web"
    for i, path in enumerate(make_sample(web, shards=2, records=100, format="tar")):
        os.rename(path, web / f"shard-{i:03d}.tar")
    http = RangeServer(str(web))
    http.start()
    try:
        client = boto3.client(
            "s3", endpoint_url=s3.endpoint, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )  # fmt: skip
        client.create_bucket(Bucket="bucket")
        for path in make_sample(root / "train", shards=2, records=200):
            client.upload_file(path, "bucket", f"train/{os.path.basename(path)}")
        yield {**keys, "AWS_DEFAULT_REGION": "us-east-1", "S3_ENDPOINT": s3.endpoint,
               "HTTP_ROOT": http.url}  # fmt: skip
    finally:
        http.stop()
        s3.stop()


def run_blocks(page: str, blocks: list[Block], tmp_path: Path, services: dict[str, str]) -> Path:
    """Run ``blocks`` (those not marked) in order in ``tmp_path/work``, with a private
    ``HOME`` and cache, and ``services`` in the environment; the work directory."""
    work, scripts, home = tmp_path / "work", tmp_path / "scripts", tmp_path / "home"
    for directory in (work, scripts, home):
        directory.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDCAT_")}
    env.update(
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        HOME=str(home),  # catalog install-skill writes below it
        XDG_CACHE_HOME=str(tmp_path / "cache"),
        COLUMNS="100",
        **services,
    )
    for block in blocks:
        if block.not_run is not None:
            continue
        where = f"{page}:{block.line}"
        assert block.lang in RUNNERS, f"{where}: no runner for {block.lang!r}"
        script = scripts / f"block_{block.line}.{block.lang}"
        script.write_text(block.body, encoding="utf-8")
        done = subprocess.run(
            RUNNERS[block.lang](script),
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, f"{where} failed:\n{done.stderr[-3000:]}"
        assert "Traceback" not in done.stderr, f"{where}:\n{done.stderr}"
    return work
