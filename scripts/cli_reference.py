"""Render docs/cli.md, the CLI reference: every ``catalog`` command's ``--help``,
taken from the typer app itself (typer's Click command tree), so the reference is
the help a user sees.

    python scripts/cli_reference.py          # rewrite docs/cli.md
    python scripts/cli_reference.py --check  # exit 1 when docs/cli.md is not current

tests/test_docs.py fails when the committed page is not what this renders.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from shardcat.cli import app

PAGE = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
COMMAND = "python scripts/cli_reference.py"
WIDTH = 100  # fixed, so the page does not depend on the terminal it is rendered in

HEADER = f"""\
# CLI reference

Every command of `catalog`, as `catalog COMMAND --help` prints it. Generated from the
typer app by `{COMMAND}`; a test fails when this page is not current.

"""


def _help(command: typer.core.TyperCommand | typer.core.TyperGroup, ctx: typer.Context) -> str:
    text = command.get_help(ctx).rstrip()
    return f"<!-- not run: help text -->\n```text\n{text}\n```\n"


def render() -> str:
    """The page: the root command's help, then each command's, in the app's order."""
    root = typer.main.get_command(app)
    ctx = typer.Context(root, info_name="catalog", terminal_width=WIDTH, max_content_width=WIDTH)
    parts = [HEADER, _help(root, ctx)]
    for name, command in getattr(root, "commands", {}).items():
        sub = typer.Context(command, parent=ctx, info_name=name)
        parts.append(f"\n## catalog {name}\n\n{_help(command, sub)}")
    return "".join(parts)


def main(argv: list[str]) -> int:
    page = render()
    if "--check" in argv:
        if PAGE.read_text(encoding="utf-8") != page:
            print(f"{PAGE.name} is not current: run {COMMAND}", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
