"""Running the code blocks of a Markdown page (README.md, docs/*.md) as a reader
following it would: in order, in one fresh directory, each block a script.

A block preceded by ``<!-- not run: REASON -->`` is left out. What the Python
blocks' comments say an expression gives is checked too: an expression statement
whose comment starts with a Python literal (``# [(3,)], read-only``, ``# True; False
once ...``, ``# [0, 2]: row positions``) runs as an assertion that it gives that
value (:func:`with_checks`). tests/test_readme.py and tests/test_docs.py use this.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import tokenize
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardcat.testing.required import need

FENCE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
NOT_RUN = re.compile(r"<!--\s*not run:\s*(?P<why>.*?)\s*-->\Z", re.DOTALL)
# where a comment's stated value may end: "; ", ": ", ", ", " (" or the comment's end
_CUT = re.compile(r"[;:,] | \(|$")
_CHECK = """\
def __readme_check__(where, got, want):
    got = got.tolist() if hasattr(got, "tolist") else got
    if isinstance(want, list) and not isinstance(got, str):
        rows = [tuple(g) if isinstance(w, tuple) else g for g, w in zip(got, want)]
        got = rows + list(got)[len(want):]
    assert got == want, f"{where}: gives {got!r}, its comment says {want!r}"
"""
RUNNERS = {
    # -x: each command on stderr, so a block that fails or hangs shows where
    "bash": lambda path: ["bash", "-e", "-u", "-x", "-o", "pipefail", str(path)],
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


def stated(comment: str) -> tuple[bool, Any]:
    """(True, value) when ``comment`` (without its ``#``) starts with a Python literal."""
    text = comment.strip()
    for cut in _CUT.finditer(text):
        try:
            with warnings.catch_warnings():  # prose such as "tfd-utils 1.3.0" is no literal
                warnings.simplefilter("ignore", SyntaxWarning)
                return True, ast.literal_eval(text[: cut.start()].strip())
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return False, None


def with_checks(body: str, first_line: int, page: str = "README.md") -> tuple[str, int]:
    """``body`` with each expression statement whose comment states its value made an
    assertion of it (``page:line`` in the message); and how many there are."""
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
            where = ast.Constant(f"{page}:{first_line + node.lineno}")
            args = [where, node.value, ast.Constant(value)]
            call = ast.Call(ast.Name("__readme_check__", ast.Load()), args, [])
            return ast.copy_location(ast.Expr(call), node)

    tree = ast.fix_missing_locations(Check().visit(ast.parse(body)))
    return _CHECK + ast.unparse(tree) + "\n", checks


@contextlib.contextmanager
def object_stores(root: Path) -> Iterator[dict[str, str]]:
    """What the remote-storage blocks read: an S3 server (moto's, on loopback) holding
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


@dataclass(frozen=True)
class Ran:
    work: Path  # where the blocks ran
    checks: int  # expressions whose comment states their value, checked


def run_blocks(page: str, blocks: list[Block], tmp_path: Path, services: dict[str, str]) -> Ran:
    """Run ``blocks`` (those not marked) in order in ``tmp_path/work``, with a private
    ``HOME`` and cache, and ``services`` in the environment."""
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
    for block in blocks:
        if block.not_run is not None:
            continue
        where = f"{page}:{block.line}"
        assert block.lang in RUNNERS, f"{where}: no runner for {block.lang!r}"
        script = scripts / f"block_{block.line}.{block.lang}"
        body = block.body
        if block.lang == "python":
            body, found = with_checks(body, block.line, page)
            checks += found
        script.write_text(body, encoding="utf-8")
        done = _run(RUNNERS[block.lang](script), work, env, where)
        assert done.returncode == 0, f"{where} failed:\n{done.stderr[-3000:]}"
        assert "Traceback" not in done.stderr, f"{where}:\n{done.stderr}"
    return Ran(work, checks)


def _run(
    argv: list[str], cwd: Path, env: dict[str, str], where: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run one block in a session of its own; past ``timeout`` fail with the processes
    it left running and the end of what it said, then end them all."""
    with subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            running = subprocess.run(
                ["ps", "-s", str(proc.pid), "-o", "pid,stat,etime,args"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(
                f"{where} still ran after {timeout:g} s:\n{running}\n{err[-3000:]}"
            ) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)
