"""Reading tfd-utils pickles safely: the restricted unpickler and tfd-utils' two layouts.

Pickles are untrusted input. :class:`_RestrictedUnpickler` refuses every global
(so no class is built and nothing is called) and every persistent id; what it
returns is then checked to be exactly one of tfd-utils' layouts (dicts, strings,
non-negative ints): TFRecord ``{key: {"file", "offset", "length"}}`` or tar
``{key: {ext: {"file", "member_name", "data_offset", "size"}}}``. A refused or
corrupt pickle raises :class:`~shardcat.errors.LegacyIndexError` naming the
file, before anything is written.
"""

from __future__ import annotations

import itertools
import operator
import os
import pickle
from typing import Any

from shardcat.errors import LegacyIndexError
from shardcat.formats.base import Entry

__all__ = ["NO_FIELDS", "NO_MEMBERS", "load_pickle", "pickled_dict", "tfd_rows"]

# Shared by every imported entry (the ingest only reads them): a million fresh
# dicts and lists would cost half of building the entries.
NO_FIELDS: dict[str, Any] = {}
NO_MEMBERS: list[tuple[str, int, int]] = []


class _Refused(pickle.UnpicklingError):
    pass


class _RestrictedUnpickler(pickle.Unpickler):
    """Plain data only: every global (class, function: the only way a pickle can
    build an object or call anything) and every persistent id is refused, so
    dicts, lists, tuples, strings, bytes, numbers, booleans and None are all a
    pickle can hold."""

    def find_class(self, module: str, name: str) -> Any:
        raise _Refused(f"it asks for {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("it holds a persistent id")


def load_pickle(path: str | os.PathLike[str]) -> Any:
    """The plain data in the pickle at ``path``, loaded with the restricted unpickler.

    Raises :class:`LegacyIndexError` (naming the file and the byte offset
    reached) for a pickle that asks for any class or function, and for a
    corrupt or truncated one.
    """
    where = os.fspath(path)
    with open(where, "rb") as f:
        try:
            return _RestrictedUnpickler(f).load()
        except _Refused as exc:
            raise LegacyIndexError(
                where,
                f.tell(),
                f"refused to load this pickle: {exc}; legacy indexes hold plain data only "
                "(dicts, lists, strings, numbers), so it is not a legacy index, or it was "
                "tampered with",
            ) from None
        except (pickle.UnpicklingError, EOFError) as exc:
            raise LegacyIndexError(
                where, f.tell(), f"corrupt or truncated pickle: {exc or 'unexpected end'}"
            ) from None
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError) as exc:
            raise LegacyIndexError(where, f.tell(), f"corrupt pickle: {exc}") from None
        except MemoryError:
            raise LegacyIndexError(where, f.tell(), "corrupt pickle: out of memory") from None


def pickled_dict(path: str) -> bool:
    """Whether the file starts like a pickled dict (protocol 2-5), as every tfd-utils
    index does; for files given by other names (``index_file=``). Stricter than a
    first byte of 0x80: a TFRecord whose first record is 128 bytes long starts with it."""
    with open(path, "rb") as f:
        head = f.read(12)
    if len(head) < 3 or head[0] != 0x80 or head[1] not in (2, 3, 4, 5):
        return False
    return head[2:3] == b"}" or (head[2:3] == b"\x95" and head[11:12] == b"}")


# -- tfd-utils' layouts ----------------------------------------------------------------


def _int(value: Any) -> bool:
    return type(value) is int and value >= 0


def _bad(path: str, problem: str) -> LegacyIndexError:
    return LegacyIndexError(path, 0, f"not a tfd-utils index: {problem}")


def _tfd_tfrecord_rows(obj: dict[Any, Any], path: str) -> dict[str, list[Entry]]:
    """Recorded shard path -> entries of a tfd-utils TFRecord index. The hot path
    of a migration: the layout is checked column by column at C speed, and only
    a failed check walks the entries to say which one is wrong."""
    keys, infos = list(obj), list(obj.values())
    try:
        if set(map(type, infos)) != {dict} or set(map(len, infos)) != {3}:
            raise KeyError
        files, offsets, lengths = zip(*map(_FILE_OFFSET_LENGTH, infos), strict=True)
    except KeyError:
        files = offsets = lengths = ()
    if not (
        keys
        and set(map(type, keys)) == {str}
        and set(map(type, files)) == {str}
        and set(map(type, offsets)) == set(map(type, lengths)) == {int}
        and min(offsets) >= 0
        and min(lengths) >= 0
    ):
        for key, info in obj.items():
            if type(info) is not dict or len(info) != 3:  # exactly file, offset, length
                raise _bad(path, f"entry {key!r} is not a key with a file/offset/length dict")
            file, offset, length = info.get("file"), info.get("offset"), info.get("length")
            if not (type(key) is type(file) is str and _int(offset) and _int(length)):
                raise _bad(path, f"entry {key!r} lacks a file/offset/length: {info!r:.200}")
    by_file: dict[str, list[Entry]] = {}
    start = 0
    for file, run in itertools.groupby(files):  # tfd-utils adds one shard's keys after another
        stop = start + sum(1 for _ in run)
        by_file.setdefault(file, []).extend(
            map(
                Entry,
                keys[start:stop],
                offsets[start:stop],
                lengths[start:stop],
                itertools.repeat(NO_FIELDS),
                itertools.repeat(NO_MEMBERS),
            )
        )
        start = stop
    return by_file


_FILE_OFFSET_LENGTH = operator.itemgetter("file", "offset", "length")


def tfd_rows(obj: Any, path: str) -> tuple[str, dict[str, list[Any]]]:
    """(``"tfrecord"`` or ``"tar"``, recorded shard path -> rows) of an unpickled
    tfd-utils index, checked to be exactly one of its two layouts."""
    if not isinstance(obj, dict):
        raise _bad(path, f"the pickle holds a {type(obj).__name__}, not a dict")
    by_file: dict[str, list[Any]] = {}
    if not obj:
        return "tfrecord", by_file
    first = next(iter(obj.values()))
    if isinstance(first, dict) and isinstance(first.get("file"), str):
        return "tfrecord", _tfd_tfrecord_rows(obj, path)
    for key, parts in obj.items():
        if type(key) is not str or type(parts) is not dict or not parts:
            raise _bad(path, f"entry {key!r} is not a key with a dict of members")
        for ext, info in parts.items():
            if type(ext) is not str or type(info) is not dict or len(info) != 4:
                raise _bad(path, f"member {ext!r} of {key!r} is not an extension with a dict")
            file, name = info.get("file"), info.get("member_name")
            offset, size = info.get("data_offset"), info.get("size")
            if type(file) is not str or type(name) is not str or not _int(offset) or not _int(size):
                raise _bad(
                    path,
                    f"member {ext!r} of {key!r} lacks file/member_name/data_offset/size: "
                    f"{info!r:.200}",
                )
            by_file.setdefault(file, []).append((key, ext, name, offset, size))
    return "tar", by_file
