"""Every code block of README.md runs, in order, in one fresh directory, as a
reader following the README would run it; so the README cannot drift from the
code (tests/doc_blocks.py runs them; tests/test_docs.py does the same for the
docs pages the README links to).

A block preceded by ``<!-- not run: REASON -->`` is left out (the set-up: ``make
demo``/``make test`` would run this test again; ``make lint``/``make docs``/``make
bench``). What the Python block's comments say an expression gives is checked too.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from doc_blocks import Block, page_blocks, run_blocks, stated, with_checks

README = Path(__file__).resolve().parents[1] / "README.md"
RUN, NOT_RUN_COUNT = 2, 3  # the command line, Python
STATED = 3  # expressions whose comment states their value (query, get_feature, len)


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
    assert page_blocks(text) == [
        Block(3, "bash", "make x\n", "set-up"),
        Block(7, "python", "print(1)\n", None),
    ]


def test_every_readme_block_runs_in_order(tmp_path: Path) -> None:
    blocks = page_blocks(README.read_text(encoding="utf-8"))
    skipped = [b for b in blocks if b.not_run is not None]
    assert [b.body.split()[:2] for b in skipped] == [
        ["make", "demo"],
        ["catalog", "serve"],  # (a server, until Ctrl-C: tests/test_serve.py runs it)
        ["make", "lint"],
    ]
    assert (len(blocks) - len(skipped), len(skipped)) == (RUN, NOT_RUN_COUNT)
    ran = run_blocks("README.md", blocks, tmp_path, {})
    assert ran.checks == STATED  # a comment that stops stating a value is noticed
    # What the blocks promise: one catalog for the commands and the Python block, the
    # feature written by `catalog get`, the snapshot.
    assert (ran.work / "shardcat.sqlite").is_file()
    assert (ran.work / "img.jpg").read_bytes()[:3] == b"\xff\xd8\xff"
    assert (ran.work / "published" / "train.sqlite").is_file()


def test_the_readme_links_every_docs_page() -> None:
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", README.read_text(encoding="utf-8")))
    pages = {p.name for p in (README.parent / "docs").glob("*.md")} - {"index.md"}
    assert linked == pages
