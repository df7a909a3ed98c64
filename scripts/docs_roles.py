"""A griffe extension for the docs' API reference (mkdocs.yml loads it): shardcat's
docstrings name code with Sphinx roles (``:class:`~shardcat.Catalog```), which
mkdocstrings would print as they are; this turns each into inline code
(``Catalog``; without ``~``, the whole dotted name)."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):`(?P<tilde>~?)(?P<name>[^`]+)`")


def plain(text: str) -> str:
    """``text`` with every Sphinx role made inline code."""

    def code(match: re.Match[str]) -> str:
        name = match["name"]
        return f"`{name.rsplit('.', 1)[-1] if match['tilde'] else name}`"

    return ROLE.sub(code, text)


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
