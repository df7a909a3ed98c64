"""Every code block of README.md runs, in order, in one fresh directory, as a
reader following the README would run it; so the docs cannot drift from the code.

A block preceded by ``<!-- not run: REASON -->`` is left out (the set-up: ``make
demo``/``make test`` would run this test again; ``make lint``/``make bench``).

What the Python blocks' comments say an expression gives is checked too: an
expression statement whose comment starts with a Python literal (``# [(3,)],
read-only``, ``# True; False once ...``, ``# [0, 2]: row positions``) runs as an
assertion that it gives that value (:func:`with_checks`).
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardcat.testing.required import need

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
NOT_RUN = re.compile(r"<!--\s*not run:\s*(?P<why>.*?)\s*-->\Z", re.DOTALL)
RUN, NOT_RUN_COUNT = 9, 4  # command line, Python, Parquet, torch, snapshot, TensorDB, server x2, S3
STATED = 5  # expressions whose comment states their value (query, create_index, ...)
# where a comment's stated value may end: "; ", ": ", ", ", " (" or the comment's end
_CUT = re.compile(r"[;:,] | \(|$")
_CHECK = """\
def __readme_check__(line, got, want):
    got = got.tolist() if hasattr(got, "tolist") else got
    if isinstance(want, list) and not isinstance(got, str):
        rows = [tuple(g) if isinstance(w, tuple) else g for g, w in zip(got, want)]
        got = rows + list(got)[len(want):]
    assert got == want, f"README.md:{line}: gives {got!r}, its comment says {want!r}"
"""
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


def readme_blocks(text: str) -> list[Block]:
    blocks = []
    end = 0
    for match in FENCE.finditer(text):
        marker = NOT_RUN.search(text[end : match.start()].rstrip())
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(Block(line, match["lang"], match["body"], marker["why"] if marker else None))
        end = match.end()
    return blocks


def stated(comment: str) -> tuple[bool, Any]:
    """(True, value) when ``comment`` (without its ``#``) starts with a Python literal."""
    text = comment.strip()
    for cut in _CUT.finditer(text):
        try:
            return True, ast.literal_eval(text[: cut.start()].strip())
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return False, None


def with_checks(body: str, first_line: int) -> tuple[str, int]:
    """``body`` with each expression statement whose comment states its value made an
    assertion of it (README line numbers in the message); and how many there are."""
    comments = {
        tok.start[0]: tok.string[1:]
        for tok in tokenize.generate_tokens(io.StringIO(body).readline)
        if tok.type == tokenize.COMMENT
    }
    checks = 0

    class Check(ast.NodeTransformer):
        def visit_Expr(self, node: ast.Expr) -> ast.AST:
            nonlocal checks
            found, value = stated(comments.get(node.end_lineno or node.lineno, ""))
            if not found:
                return node
            checks += 1
            call = ast.Call(
                ast.Name("__readme_check__", ast.Load()),
                [ast.Constant(first_line + node.lineno), node.value, ast.Constant(value)],
                [],
            )
            return ast.copy_location(ast.Expr(call), node)

    tree = ast.fix_missing_locations(Check().visit(ast.parse(body)))
    return _CHECK + ast.unparse(tree) + "\n", checks


def test_stated_values_are_read() -> None:
    assert stated(" [(2003,)]: 2,000 sampled above + 3; read-only") == (True, [(2003,)])
    assert stated(" True; False once it exists (drop_index removes it)") == (True, True)
    assert stated(" [0, 2]: row positions") == (True, [0, 2])
    assert stated(" 2: opens in O(1), the dataset ingested above") == (True, 2)
    assert stated(" first value of a feature (None if missing)") == (False, None)
    assert stated(" keys, in position order") == (False, None)
    script, checks = with_checks("x = [1]\nx  # [1]: all\nx  # [2]\nlen(x)  # one\n", 10)
    assert checks == 2
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert "README.md:13: gives [1], its comment says [2]" in done.stderr


def test_markers_are_read() -> None:
    text = "a\n<!-- not run: set-up -->\n```bash\nmake x\n```\n\n```python\nprint(1)\n```\n"
    assert readme_blocks(text) == [
        Block(3, "bash", "make x\n", "set-up"),
        Block(7, "python", "print(1)\n", None),
    ]


def test_every_readme_block_runs_in_order(tmp_path: Path) -> None:
    need("tensordict", why="shardcat[torch]")
    need("psycopg", why="shardcat[postgres]")
    from shardcat.testing.postgres import postgres_server

    with postgres_server() as server, _object_stores(tmp_path / "stores") as stores:
        _run_blocks(tmp_path, {"CATALOG_URL": server, **stores})


@contextlib.contextmanager
def _object_stores(root: Path) -> Iterator[dict[str, str]]:
    """What the remote-storage block reads: an S3 server (moto's, on loopback) holding
    ``s3://bucket/train/*.tfrecord`` and an HTTP server holding two tar shards."""
    boto3 = need("boto3", why="shardcat[dev]")
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


def _run_blocks(tmp_path: Path, services: dict[str, str]) -> None:
    blocks = readme_blocks(README.read_text(encoding="utf-8"))
    skipped = [b for b in blocks if b.not_run is not None]
    to_run = [b for b in blocks if b.not_run is None]
    assert [b.body.split()[:2] for b in skipped] == [
        ["make", "demo"],
        ["shardcat/", "__init__.py"],
        ["#", "pyproject.toml:"],
        ["make", "lint"],
    ]
    assert (len(to_run), len(skipped)) == (RUN, NOT_RUN_COUNT)
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
    checks = 0
    for block in to_run:
        assert block.lang in RUNNERS, f"README.md:{block.line}: no runner for {block.lang!r}"
        script = scripts / f"readme_{block.line}.{block.lang}"
        body = block.body
        if block.lang == "python":
            body, found = with_checks(body, block.line)
            checks += found
        script.write_text(body, encoding="utf-8")
        done = subprocess.run(
            RUNNERS[block.lang](script),
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, f"README.md:{block.line} failed:\n{done.stderr[-3000:]}"
        assert "Traceback" not in done.stderr, f"README.md:{block.line}:\n{done.stderr}"
    assert checks == STATED  # a comment that stops stating a value is noticed
    # What the blocks promise: one catalog for the commands and the Python block, the
    # feature written by `catalog get`, the converted shards, the skill file.
    assert (work / "shardcat.sqlite").is_file()
    assert not (work / "data" / "train" / "shardcat.sqlite").exists()
    assert (work / "img.jpg").read_bytes()[:3] == b"\xff\xd8\xff"
    assert sorted(p.name for p in (work / "tfrecords").iterdir()) == [
        "train-00000-of-00002.tfrecord",
        "train-00001-of-00002.tfrecord",
    ]
    assert (home / ".claude" / "skills" / "shardcat" / "SKILL.md").is_file()
    assert (work / "remote.jpg").read_bytes()[:3] == b"\xff\xd8\xff"  # read from S3
