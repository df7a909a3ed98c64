"""MXNet ``.idx`` files: ``key<TAB>offset`` lines beside a ``.rec`` (as
``MXIndexedRecordIO``, ``im2rec`` and DALI's ``rec2idx`` write them), read for
:mod:`shardcat.formats.recordio`: keys by record offset, and whether the keys
of several files collide (each file numbered from 0), which makes a RecordIO
dataset keyed by position with the ``.idx`` key in the SQL column ``idx_key``."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from shardcat.errors import CorruptRecordError
from shardcat.sources.rawio import index_lines

__all__ = [
    "IDX_AS_COLUMN",
    "IDX_KEY",
    "find_collision",
    "idx_keys",
    "idx_path_for",
    "position_keys_note",
    "read_idx",
]

IDX_AS_COLUMN = "column"  # option idx: keyed by position, each .idx key in column IDX_KEY
IDX_KEY = "idx_key"


def idx_path_for(path: str | os.PathLike[str]) -> str:
    """The MXNet index beside a ``.rec``: same stem, ``.idx`` (``train.rec`` -> ``train.idx``)."""
    return os.path.splitext(os.fspath(path))[0] + ".idx"


def read_idx(idx_path: str) -> dict[int, tuple[str, int]]:
    """record offset -> (key, byte offset of its line) of an MXNet ``.idx``."""
    out: dict[int, tuple[str, int]] = {}
    for line_at, text in index_lines(idx_path):
        key, _, offset_text = text.partition("\t")
        try:
            offset = int(offset_text)
        except ValueError:
            raise CorruptRecordError(
                idx_path, line_at, f"expected 'key<TAB>offset', found {text[:80]!r}"
            ) from None
        if offset in out:
            raise CorruptRecordError(
                idx_path,
                line_at,
                f"keys {out[offset][0]!r} and {key!r} both point at byte {offset}",
            )
        out[offset] = (key, line_at)
    return out


def find_collision(keys_by_file: Iterable[tuple[str, Iterable[str]]]) -> str | None:
    """What collides among the keys of ``.idx`` files given as ``(name, keys)``
    pairs, e.g. ``"'0' is in a.idx and in b.idx (and 41 more keys)"``; None when
    no key appears twice."""
    first_in: dict[str, str] = {}
    clash: str | None = None
    more = 0
    for name, keys in keys_by_file:
        for key in keys:
            where = first_in.get(key)
            if where is None:
                first_in[key] = name
                continue
            if clash is None:
                clash = (
                    f"{key!r} is twice in {name}"
                    if where == name
                    else f"{key!r} is in {where} and in {name}"
                )
            else:
                more += 1
    if clash is None:
        return None
    return clash + (f" (and {more:,} more keys)" if more else "")


def position_keys_note(clash: str) -> str:
    """What a dataset whose ``.idx`` keys collide (``clash``: :func:`find_collision`) does."""
    return (
        f"the .idx keys collide ({clash}): records are keyed by position ('0'..'n-1' "
        f"over the dataset, shards in path order), nothing is dropped, and each record's "
        f".idx key is kept in SQL column {IDX_KEY} (options={{'idx': True}} keys by the "
        ".idx anyway; duplicates then follow on_duplicate)"
    )


def idx_keys(idx_path: str) -> Iterator[str]:
    """The keys of an MXNet ``.idx`` in line order, as :func:`read_idx` spells them."""
    for _, text in index_lines(idx_path):
        yield text.partition("\t")[0]
