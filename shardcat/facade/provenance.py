"""What a run saw, as a table to query: :func:`write_seen` writes the keys
:meth:`RecordSampler.seen <shardcat.torch.RecordSampler.seen>` lists for a saved
sampler state into a small SQLite file (table ``seen``: ``key``, ``times``), which
``Catalog.query(..., attach={"run": path})`` / ``catalog query --attach
run=PATH`` joins with the dataset's view (``catalog seen`` writes it)."""

from __future__ import annotations

import json
import os
import sqlite3
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shardcat.errors import CatalogError
from shardcat.readers.reader import Reader
from shardcat.readers.sampler import RecordSampler
from shardcat.readers.torch import RecordDataset

__all__ = ["load_state", "write_seen"]


def load_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A sampler state saved as JSON (``json.dump(sampler.state_dict(), f)``), or the
    RecordSampler state inside a saved loader state."""
    try:
        saved = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CatalogError(f"cannot read a sampler state from {path}: {exc}") from None
    return RecordSampler.state_in(saved)


def write_seen(
    reader: Reader, state: Mapping[str, Any], path: str | os.PathLike[str], where: str | None = None
) -> int:
    """Write the keys of ``reader``'s dataset (its ``where`` subset: as the run's
    ``RecordDataset(reader, keys=reader.where(where))``) that the run of ``state``
    consumed to the SQLite file ``path`` (replaced), table ``seen(key, times)``;
    returns how many distinct keys. The sampler's seed, shuffle and block options
    come from the state."""
    dataset = RecordDataset(reader, keys=None if where is None else reader.where(where))
    options = {k: state[k] for k in ("block_size", "window", "drop_last") if k in state}
    sampler = RecordSampler(dataset, seed=state["seed"], shuffle=state["shuffle"], **options)
    counts = Counter(sampler.seen(state))
    target = Path(path)
    target.unlink(missing_ok=True)
    conn = sqlite3.connect(target)
    try:
        with conn:
            conn.execute("CREATE TABLE seen (key TEXT PRIMARY KEY, times INTEGER NOT NULL)")
            conn.executemany("INSERT INTO seen VALUES (?, ?)", counts.items())
    finally:
        conn.close()
    return len(counts)
