"""install-skill: the bundled skill file for AI coding assistants."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Annotated

import typer

from shardcat.cli.common import handle_errors

DEFAULT_DEST = Path.home() / ".claude" / "skills" / "shardcat"


def skill_text() -> str:
    """SKILL.md with this library's version stamped in."""
    from shardcat import __version__

    text = files("shardcat").joinpath("skill/SKILL.md").read_text(encoding="utf-8")
    return text.replace("{{VERSION}}", __version__)


@handle_errors
def install_skill(
    dest: Annotated[
        Path,
        typer.Option(
            "--dest",
            help="Directory to install SKILL.md into.",
            show_default="~/.claude/skills/shardcat",
        ),
    ] = DEFAULT_DEST,
) -> None:
    """Install SKILL.md (how to use shardcat) for AI coding assistants.

    Re-run after upgrading shardcat: the file carries the library version.
    """
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / "SKILL.md"
    target.write_text(skill_text(), encoding="utf-8")
    typer.echo(f"installed {target}")


def register(app: typer.Typer) -> None:
    app.command("install-skill")(install_skill)
