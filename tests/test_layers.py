"""The house rules of the package's structure, checked over its import graph (every
import, function-level and ``TYPE_CHECKING`` ones included), so they stay true:

- no import cycle anywhere in the package;
- the package shows its rooms: formats, sources, catalog (the store), readers,
  storage, migrations, facade and cli are folders;
- ``shardcat.catalog`` (the store) imports no other shardcat package but ``errors``;
- ``shardcat.formats`` and ``shardcat.sources`` import nothing of the store nor of
  anything above them, and a source knows no format;
- the CLI holds no SQL and no globbing;
- no module over ~600 lines, and each module's first statement is its docstring.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "shardcat"
MAX_LINES = 620  # "~600": a module past this is doing more than one job

ROOMS = ("formats", "sources", "catalog", "readers", "storage", "migrations", "facade", "cli")
# what sits above formats and sources: none of it may be imported by them
ABOVE_FORMATS = tuple(
    f"shardcat.{room}" for room in ("catalog", "readers", "storage", "migrations", "facade", "cli")
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str) -> set[str]:
    """The shardcat modules ``name`` imports (a ``from package import module`` names
    the module; ``from module import names`` the module)."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target.startswith("shardcat") and target != name:
                found.add(target)
    # "from shardcat.catalog import lookup" names lookup: drop the package itself then
    return {t for t in found if not any(o.startswith(t + ".") for o in found) or t == "shardcat"}


GRAPH = {name: imports_of(name) for name in MODULES}


def test_the_graph_sees_the_package():
    assert "shardcat.catalog.store" in GRAPH["shardcat.facade.catalog"]
    assert "shardcat.catalog.lookup" in GRAPH["shardcat.readers.reader"]
    assert "shardcat.formats.base" in GRAPH["shardcat.formats.tfrecord"]


def test_the_rooms_are_folders():
    assert [room for room in ROOMS if not (PACKAGE / room / "__init__.py").is_file()] == []


def test_no_import_cycle():
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(GRAPH.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name)
    assert cycles == []


def test_the_store_imports_only_itself_and_errors():
    wrong = {
        (name, target)
        for name, targets in GRAPH.items()
        if name.startswith("shardcat.catalog")
        for target in targets
        if not target.startswith("shardcat.catalog") and target != "shardcat.errors"
    }
    assert wrong == set()


def test_formats_and_sources_know_nothing_of_the_store():
    wrong = {
        (name, target)
        for name, targets in GRAPH.items()
        if name.startswith(("shardcat.formats", "shardcat.sources"))
        for target in targets
        if target.startswith(ABOVE_FORMATS)
    }
    assert wrong == set()


def test_a_source_knows_no_format():
    wrong = {
        (name, target)
        for name, targets in GRAPH.items()
        if name.startswith("shardcat.sources")
        for target in targets
        if target.startswith("shardcat.formats")
    }
    assert wrong == set()


def test_the_legacy_importers_do_not_reach_up_to_the_facade():
    wrong = {
        (name, target)
        for name, targets in GRAPH.items()
        if name.startswith("shardcat.migrations")
        for target in targets
        if target.startswith(("shardcat.facade", "shardcat.cli"))
    }
    assert wrong == set()


_SQL = re.compile(r"\b(SELECT\s+\S.*\bFROM|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM)\b", re.I)


def _code_strings(tree: ast.AST) -> list[str]:
    """String literals that are not docstrings (docstrings may show SQL to users)."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in docstrings
    ]


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("shardcat.cli")))
def test_the_cli_holds_no_sql_and_no_globbing(name: str):
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    assert [s for s in _code_strings(tree) if _SQL.search(s)] == []
    calls = {
        ast.unparse(node.func)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    }
    assert calls & {"os.listdir", "os.walk", "os.scandir", "glob.glob", "glob.iglob"} == set()
    assert not {"glob", "fnmatch"} & {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_are_small_and_say_what_they_hold(name: str):
    source = MODULES[name].read_text(encoding="utf-8")
    assert len(source.splitlines()) <= MAX_LINES, f"{name} has {len(source.splitlines())} lines"
    tree = ast.parse(source)
    if name.startswith("shardcat.") or name == "shardcat":
        assert ast.get_docstring(tree), f"{name} has no docstring"


# The modules that know which database a catalog is on (issue 29): everything else asks
# the catalog's backend object what it can do, never which one it is.
BACKEND_MODULES = {
    "shardcat.catalog.backend",
    "shardcat.catalog.sqlite",
    "shardcat.catalog.postgres",
}
# what only a backend module may import (the PostgreSQL one: its URL test, its driver)
BACKEND_ONLY = {"shardcat.catalog.postgres"}


def backend_checks(tree: ast.AST) -> list[str]:
    """The places in ``tree`` that ask which database a catalog is on: a dialect's name,
    a server URL test, a ``server`` flag (a name, attribute, parameter or keyword), a
    test for a ``sqlite3`` connection."""
    found = []
    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.Attribute) and node.attr == "name":
            if isinstance(node.value, ast.Attribute) and node.value.attr == "dialect":
                what = "dialect.name"
        elif isinstance(node, ast.Attribute | ast.Name):
            ident = node.attr if isinstance(node, ast.Attribute) else node.id
            if ident in {"server", "is_server_url"}:
                what = ident
        elif isinstance(node, ast.keyword | ast.arg) and node.arg == "server":
            what = "server="
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) == "isinstance"
            and "sqlite3.Connection" in ast.unparse(node)
        ):
            what = "isinstance sqlite3.Connection"
        if what is not None:
            found.append(f"line {getattr(node, 'lineno', '?')}: {what}")
    return found


OUTSIDE_BACKENDS = sorted(
    n for n in MODULES if n not in BACKEND_MODULES and not n.startswith("shardcat.testing")
)


@pytest.mark.parametrize("name", OUTSIDE_BACKENDS)
def test_nothing_outside_the_backends_asks_which_database(name: str):
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    assert backend_checks(tree) == []
    assert GRAPH[name] & BACKEND_ONLY == set()


def test_the_backend_check_sees_each_kind():
    source = (
        "a = conn.dialect.name == 'sqlite'\nb = postgres.is_server_url(w)\n"
        "c = store.server\nd = f(x, server=True)\ndef g(server): ...\n"
        "e = isinstance(conn, sqlite3.Connection)\nf = backend.local_file is None\n"
    )
    assert len(backend_checks(ast.parse(source))) == 6
