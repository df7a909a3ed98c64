"""How the commands' help reads: ``catalog ingest [OPTIONS] PATHS...`` and
``--dataset DATASET``, as argparse and most tools write them, instead of typer's
Python types (``{paths}...``, ``<list[str]>``, ``<int range>``)."""

from __future__ import annotations

from typing import Any

from typer.core import TyperArgument, TyperCommand, TyperOption

__all__ = ["HelpCommand"]


def _argument_name(param: TyperArgument) -> str:
    name = (param.metavar or str(param.name)).upper()
    return name + ("..." if param.nargs != 1 else "")


class HelpCommand(TyperCommand):
    """A command whose help names each value by what it is: an option's value by its
    ``metavar``, else its name in capitals (``--workers WORKERS``); an argument by
    its name in capitals, ``[NAME]`` when optional, ``NAME...`` when repeated."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param, TyperOption) and not param.is_flag and param.metavar is None:
                param.metavar = str(param.name).upper()

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                name = _argument_name(param)
                pieces.append(name if param.required else f"[{name}]")
        return pieces

    def format_options(self, ctx: Any, formatter: Any) -> None:
        arguments: list[tuple[str, str]] = []
        options: list[tuple[str, str]] = []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if isinstance(param, TyperArgument):
                arguments.append((_argument_name(param), record[1]))
            else:
                options.append(record)
        for title, rows in (("Arguments", arguments), ("Options", options)):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)
