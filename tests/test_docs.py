"""The docs site (docs/, built by ``make docs``): every code block of every page
runs, page by page, each page in a fresh directory as a reader following it
would run it (blocks marked ``<!-- not run: REASON -->`` excepted, as in
README.md); the CLI reference is the typer app's help as it is now; the API
reference covers exactly the public names; every page is in the site's nav."""

from __future__ import annotations

import importlib.util
import re
from contextlib import ExitStack
from pathlib import Path
from types import ModuleType

import pytest
from doc_blocks import object_stores, page_blocks, run_blocks

import shardcat
from shardcat.testing.required import need

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(path.name for path in DOCS.glob("*.md"))
JPEG = b"\xff\xd8\xff"


def _getting_started(work: Path, home: Path) -> None:
    """One catalog for the commands and the Python block, the feature written by
    `catalog get`, the converted shards, the skill file."""
    assert (work / "shardcat.sqlite").is_file()
    assert not (work / "data" / "train" / "shardcat.sqlite").exists()
    assert (work / "img.jpg").read_bytes()[:3] == JPEG
    assert sorted(p.name for p in (work / "tfrecords").iterdir()) == [
        "train-00000-of-00002.tfrecord",
        "train-00001-of-00002.tfrecord",
    ]
    assert (home / ".claude" / "skills" / "shardcat" / "SKILL.md").is_file()


def _remote(work: Path, home: Path) -> None:
    assert (work / "remote.jpg").read_bytes()[:3] == JPEG  # read from S3


# What a page's blocks leave behind, beyond running without an error.
PROMISES = {"getting-started.md": _getting_started, "remote.md": _remote}


def _cli_reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "cli_reference", ROOT / "scripts" / "cli_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_is_current() -> None:
    reference = _cli_reference()
    assert (DOCS / "cli.md").read_text(encoding="utf-8") == reference.render(), (
        f"docs/cli.md is not the CLI's help: run {reference.COMMAND}"
    )


def test_the_cli_reference_has_every_command() -> None:
    from shardcat.cli import app

    page = (DOCS / "cli.md").read_text(encoding="utf-8")
    commands = [c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands]
    assert commands and all(f"\n## catalog {name}\n" in page for name in commands)
    assert "Usage: catalog ingest [OPTIONS]" in page


def test_the_api_reference_is_the_public_names() -> None:
    documented = re.findall(
        r"^::: shardcat\.(?:storage\.)?(\w+)$", (DOCS / "api.md").read_text(), re.M
    )
    assert sorted(documented) == sorted(set(shardcat.__all__) - {"__version__"})


def test_every_page_is_in_the_nav() -> None:
    nav = re.findall(r":\s*([\w-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert sorted(nav) == PAGES


@pytest.mark.parametrize("page", PAGES)
def test_every_block_of_the_page_runs(page: str, tmp_path: Path) -> None:
    text = (DOCS / page).read_text(encoding="utf-8")
    blocks = page_blocks(text)
    services: dict[str, str] = {}
    with ExitStack() as stack:
        if "CATALOG_URL" in text:
            need("psycopg", why="shardcat[postgres]")
            from shardcat.testing.postgres import postgres_server

            services["CATALOG_URL"] = stack.enter_context(postgres_server())
        if "S3_ENDPOINT" in text or "HTTP_ROOT" in text:
            services.update(stack.enter_context(object_stores(tmp_path / "stores")))
        ran = run_blocks(f"docs/{page}", blocks, tmp_path, services)
    if page in PROMISES:
        PROMISES[page](ran.work, tmp_path / "home")
