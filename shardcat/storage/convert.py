"""Reading a directory written by the tensorblob package, and converting it into shardcat storage.

tensorblob keeps its metadata in JSON files beside the blocks: ``.conf``
(dtype, shape, block size; a TensorDB's ``schema`` of fields, each field a
sub-directory with its own ``.conf``/``.stat``) and ``.stat`` (the row count
``len`` and the block list ``bds``). :func:`read_tensorblob` reads them, writing
nothing (a read-only open keeps them in an in-memory SQLite database: the
directory stays as tensorblob wrote it); :func:`import_tensorblob` converts
the directory in place: the JSON files are replaced by a SQLite metadata file
(:mod:`shardcat.storage.meta`), the block files stay where they are, and the
tensorblob package can no longer open it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardcat.errors import StorageValueError
from shardcat.storage.meta import (
    BLOB_FIELD,
    KINDS,
    META_FILE,
    FieldSpec,
    Layout,
    Metadata,
    unlink,
    unlink_meta_files,
    write_schema,
)

__all__ = ["Found", "import_tensorblob", "read_tensorblob", "tensorblob_kind"]


def tensorblob_kind(conf: Mapping[str, Any]) -> str:
    """``"db"`` or ``"blob"``: which class wrote a tensorblob ``.conf``."""
    class_name = str(conf.get("__notes__", {}).get("class_name", ""))
    return "db" if class_name.endswith("TensorDB") or "schema" in conf else "blob"


@dataclass(frozen=True)
class Found:
    """What a tensorblob directory's JSON says: the layout, the committed row count,
    each field's block files (as many as those rows fill), and the files a
    conversion deletes (blocks past those rows, the JSON files)."""

    layout: Layout
    length: int
    blocks: dict[str, list[str]]
    stray: list[Path]
    json_files: list[Path]

    def fill(self, conn: sqlite3.Connection) -> None:
        """Write this metadata into an empty SQLite database (inside the caller's transaction)."""
        write_schema(conn, self.layout, length=self.length, extra={"imported_from": "tensorblob"})
        conn.executemany(
            "INSERT INTO storage_blocks (field, idx, file) VALUES (?, ?, ?)",
            [(f, i, n) for f, names in self.blocks.items() for i, n in enumerate(names)],
        )


def read_tensorblob(directory: Path, kind: str, check: Callable[[FieldSpec], FieldSpec]) -> Found:
    """Read a tensorblob directory's ``.conf``/``.stat`` JSON; nothing is written.

    ``check`` validates and normalizes each field (dtype, shape).
    """
    conf = _read_json(directory / ".conf")
    found = tensorblob_kind(conf)
    if found != kind:
        raise StorageValueError(
            f"{str(directory)!r} holds a tensorblob {KINDS[found]}, not a {KINDS[kind]}"
        )
    block_size = int(conf["block_size"])
    blocks: dict[str, list[str]] = {}
    fields: list[FieldSpec] = []
    json_files = [directory / ".conf", directory / ".stat"]
    stat = _read_json(directory / ".stat")
    length = int(stat["len"])
    if kind == "blob":
        fields.append(FieldSpec(BLOB_FIELD, conf["dtype"], tuple(conf["shape"]), "."))
        blocks[BLOB_FIELD] = list(stat["bds"])
    else:
        for name, (dtype, shape) in conf["schema"].items():
            sub = directory / name
            field_conf = _read_json(sub / ".conf")
            field_stat = _read_json(sub / ".stat")
            if int(field_conf["block_size"]) != block_size:
                raise StorageValueError(f"{sub}: block size differs from the database's")
            length = min(length, int(field_stat["len"]))  # tensorblob's own recovery rule
            fields.append(FieldSpec(name, dtype, tuple(shape), name))
            blocks[name] = list(field_stat["bds"])
            json_files += [sub / ".conf", sub / ".stat"]
    if block_size < 1:
        raise StorageValueError(f"{directory}: block size {block_size}")
    n_blocks = math.ceil(length / block_size)
    stray: list[Path] = []
    for spec in fields:
        names = blocks[spec.name]
        if len(names) < n_blocks:
            raise FileNotFoundError(
                f"{directory / spec.directory}: .stat lists {len(names)} blocks "
                f"for {length} rows of {block_size}"
            )
        for name in names[:n_blocks]:
            block = directory / spec.directory / name
            if not block.is_file():
                raise FileNotFoundError(f"block file missing: {block}")
        stray += [directory / spec.directory / n for n in names[n_blocks:]]
        blocks[spec.name] = names[:n_blocks]
    layout = Layout(kind, block_size, tuple(check(spec) for spec in fields))
    return Found(layout, length, blocks, stray, json_files)


def import_tensorblob(directory: Path, kind: str, check: Callable[[FieldSpec], FieldSpec]) -> None:
    """Convert a tensorblob directory's ``.conf``/``.stat`` JSON into SQLite, in place.

    Afterwards the tensorblob package can no longer open it (its JSON files
    are gone). Block files stay where they are. The metadata file is built
    under a temporary name and linked into place, so processes converting
    the same directory at once agree on one result; blocks past the
    committed length and the JSON files are deleted afterwards.
    """
    found = read_tensorblob(directory, kind, check)
    final = directory / META_FILE
    if final.exists():
        existing = Metadata.load(directory, writable=False)
        if existing is not None:  # another process has just converted it
            existing.close()
            return
        unlink_meta_files(directory)  # a killed earlier attempt
    temporary = directory / f"{META_FILE}.{uuid.uuid4().hex}.tmp"
    try:
        conn = sqlite3.connect(temporary, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            found.fill(conn)
            conn.execute("COMMIT")
        finally:
            conn.close()
        with contextlib.suppress(FileExistsError):  # another process converted it first
            os.link(temporary, final)
    finally:
        unlink(temporary)
    for path in found.stray + found.json_files:
        unlink(path)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            value = json.loads(f.read())
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"tensorblob metadata missing: {str(path)!r}") from exc
    if not isinstance(value, dict):
        raise StorageValueError(f"{path}: not a tensorblob metadata file")
    return value
