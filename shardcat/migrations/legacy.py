"""Importing legacy index files into the catalog (``catalog migrate``).

**What is imported.**

- tfd-utils pickles, every release that wrote them (0.1.0 to 1.3.0; read off
  their sources): TFRecord indexes ``{key: {"file", "offset", "length"}}``
  named ``<stem>.index`` (one shard), ``<first stem>_unified.index`` (several
  shards, 0.1.0-1.0.0), ``all<N>.index`` (a complete ``XXXXX_of_NNNNN.*`` set,
  1.2.0+) or ``<first stem>_unified_tot<N>.index`` (1.2.0+); tar indexes
  ``{key: {ext: {"file", "member_name", "data_offset", "size"}}}`` named
  ``<stem>.tar_index`` or ``<first stem>_unified.tar_index`` (0.4.0+), or any
  name given with ``index_file=``. ``file`` is the shard path as tfd-utils was
  given it (absolute, or relative to the directory it ran in). Keys are
  tfd-utils' keys: the key feature of TFRecords (spelled as shardcat spells
  them), the member path without its last suffix for tar (shardcat's ``tfd``
  grouping).
- MXNet ``.idx`` files (``key<TAB>offset`` lines, also what DALI's
  ``rec2idx`` writes) beside their ``.rec`` (same stem): keys as ``catalog
  ingest`` takes them from the ``.idx``.
- TFRecord offset indexes, ``<offset> <frame size>`` lines, as DALI's
  ``tfrecord2idx`` and vahidk/tfrecord's ``tfrecord2idx`` write them (named
  ``<stem>.idx``, ``<name>.idx``, ``<stem>.tfindex``, ``<name>.tfindex`` or a
  text ``<stem>.index``): records are keyed by position, as those tools do.

**Pickles are untrusted.** They are loaded by :class:`_RestrictedUnpickler`,
which refuses every global (so no class is built and nothing is called) and
every persistent id; what it returns is then checked to be exactly the
layout above (dicts, strings, non-negative ints). A refused or corrupt pickle
raises :class:`~shardcat.errors.LegacyIndexError` naming the file, before
anything is written.

**Discovery.** ``migrate(paths)`` takes directories (their index files by the
names above: ``*.index``, ``*.tar_index``, ``*.idx``, ``*.tfindex``), index
files given explicitly (any name; the content tells the kind), and shard files
or globs (the index files beside them, restricted to those shards). A file
named like an index whose content is none of the kinds above is skipped and
listed in the report. Each index covering several shards becomes one
dataset; indexes of one shard each (per-shard DALI/MXNet/vahidk files, a
tfd-utils ``<stem>.index`` per file) in one directory, of one kind, become one
dataset together. When two indexes cover the same shard, the keyed one
(tfd-utils, MXNet) wins over an offsets-only one, then the newest file.

**Moved datasets.** A shard path recorded in a tfd-utils index is resolved by
the first rule that applies: a ``--remap OLD=NEW`` whose ``OLD`` prefixes it
(explicit: used even when the new path is missing); a file with the same name
beside the index file (re-rooting; used only when the index's file names are
unique); the path as recorded (relative paths: from the index's directory,
then from the current one). A shard found by none is reported missing.

**Trust but verify.** Before a shard's entries are committed they are checked
against the file; any mismatch re-indexes that shard from its data instead
(the report says why):

- compressed shards are always re-indexed (seek points come from the data);
- a shard modified after the index file was written (its mtime is newer) is
  re-indexed: a copy that keeps mtimes (``mv``, ``cp -a``, ``rsync -a``)
  keeps the import fast;
- TFRecord: the entries must tile the file exactly (each frame starts where
  the previous one ends, the last one ends at the end of the file), so a
  record missing from the index cannot go unnoticed;
- tar: members must follow each other header by header; where they do not,
  the headers in between are read, and a regular member with a key that the
  index lacks is a mismatch; so are members after the last indexed one;
- RecordIO: offsets must be unique and start at byte 0; the last record must
  end at the end of the file;
- a sample of ``sample`` entries per shard (default 64: the first, the last
  and evenly spaced ones; 0 = all) is re-read: TFRecord frames with their
  length and both CRCs and the key feature's value, tar headers (checksum,
  regular file, name, size, data offset), RecordIO magic and framing spanning
  exactly the record.

Verified entries go through the ingest's own claim and commit
(:meth:`Catalog.ingest` with ``provided=``): same transaction, duplicate
rules and positions, so the dataset equals one ingested from scratch with
``fields=False`` (keys, offsets, lengths, members, positions, view).

**SQL fields.** Legacy indexes never held them, and filling them means parsing
every record, which is what a fresh ingest costs. So a new dataset is imported
without them (recorded with ``fields=False``; later runs and readers keep
that) and the report gives the command that fills them: the same migration
with ``fields=True`` (``--fields``), which re-indexes every shard from its
data (CRC-checked, in parallel, shards imported without fields included) and
records ``fields=True``. A dataset that already has fields keeps getting
them.

**Where it goes.** The catalog is ``catalog`` if given, else the one a reader
would use (``$SHARDCAT_CATALOG``, else ``shardcat.sqlite`` beside the shards).
The dataset's source pattern is the one a reader is most likely to be opened
with: a glob given in ``paths`` that matches exactly the shards, else
``<directory>/*<extension>`` when it does, else ``<directory>/<common name
prefix up to its last -_.>*<extension>`` (``train-*.tfrecord`` beside
``val-*.tfrecord``), else the list of shard files; so
``TFRecordRandomAccess("/data/shards/*.tfrecord")`` finds the migrated dataset
and opens without re-indexing. (A glob may also match empty files no index
lists: they join the dataset, indexed from their data.)
"""

from __future__ import annotations

import contextlib
import functools
import gc
import glob
import itertools
import json
import operator
import os
import pickle
import re
import shlex
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from shardcat.catalog.catalog import (
    Catalog,
    PathsLike,
    as_patterns,
    default_dataset_name,
    resolve_paths,
)
from shardcat.catalog.engine import locate
from shardcat.catalog.ingest import (
    CLAIM_LOST,
    ProvideEntries,
    ShardOutcome,
    absolute_path,
    stored_path,
)
from shardcat.errors import CatalogError, CorruptRecordError, IngestError, LegacyIndexError
from shardcat.readers import recordio as recordio_format
from shardcat.readers import tar as tar_format
from shardcat.readers import tfrecord as tfrecord_format
from shardcat.readers.compressed import ShardScan, detect_compression
from shardcat.readers.formats import Entry, Format, detect_format, get_format, index_lines
from shardcat.readers.source import FileSource

__all__ = [
    "DEFAULT_SAMPLE",
    "DatasetReport",
    "LegacyIndex",
    "LegacyShard",
    "MigrationReport",
    "ShardReport",
    "discover",
    "load_pickle",
    "migrate",
    "read_legacy_index",
]

DEFAULT_SAMPLE = 64
INDEX_SUFFIXES = (".index", ".tar_index", ".idx", ".tfindex")
TFD_TFRECORD = "tfd-utils TFRecord index"
TFD_TAR = "tfd-utils tar index"
MXNET_IDX = "MXNet/DALI RecordIO index"
OFFSETS = "TFRecord offset index (DALI/vahidk tfrecord2idx)"
_FORMAT_OF = {TFD_TFRECORD: "tfrecord", TFD_TAR: "tar", MXNET_IDX: "recordio", OFFSETS: "tfrecord"}
_TFRECORD_FRAME = tfrecord_format.HEADER + tfrecord_format.FOOTER  # framing around a record
_OFFSETS_LINE = re.compile(rb"^\d+ \d+$")
_MXNET_LINE = re.compile(rb"^[^\t]+\t\d+$")
_DALI_TAR_LINE = re.compile(rb"^v\d+\.\d+ \d+$")
Progress = Callable[[str, int, int], None]


# -- reading pickles safely ------------------------------------------------------


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


# -- the legacy index model --------------------------------------------------------


@dataclass
class LegacyShard:
    """One shard of a legacy index.

    ``rows`` are the index's entries for it: for TFRecord :class:`Entry`
    objects as recorded (key None in offset indexes), ``(key, offset)`` for
    RecordIO, ``(key, ext, member name, data offset, size)`` for tar.
    """

    path: str
    recorded: str
    resolved_by: str
    rows: list[Any] = field(repr=False)


@dataclass
class LegacyIndex:
    """A legacy index file: its kind, and the shards (found on disk) it covers."""

    path: str
    kind: str
    mtime_ns: int
    shards: list[LegacyShard]
    missing: list[str] = field(default_factory=list)  # recorded paths with no file

    @property
    def format(self) -> str:
        return _FORMAT_OF[self.kind]

    @property
    def keyed(self) -> bool:
        return self.kind != OFFSETS


# Shared by every imported entry (the ingest only reads them): a million fresh
# dicts and lists would cost half of building the entries.
_NO_FIELDS: dict[str, Any] = {}
_NO_MEMBERS: list[tuple[str, int, int]] = []


_by_offset = operator.attrgetter("offset")
_by_length = operator.attrgetter("length")


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
                itertools.repeat(_NO_FIELDS),
                itertools.repeat(_NO_MEMBERS),
            )
        )
        start = stop
    return by_file


_FILE_OFFSET_LENGTH = operator.itemgetter("file", "offset", "length")


def _tfd_rows(obj: Any, path: str) -> tuple[str, dict[str, list[Any]]]:
    """(kind, recorded shard path -> rows) of an unpickled tfd-utils index, checked
    to be exactly one of its two layouts."""
    if not isinstance(obj, dict):
        raise _bad(path, f"the pickle holds a {type(obj).__name__}, not a dict")
    by_file: dict[str, list[Any]] = {}
    if not obj:
        return TFD_TFRECORD, by_file
    first = next(iter(obj.values()))
    if isinstance(first, dict) and isinstance(first.get("file"), str):
        return TFD_TFRECORD, _tfd_tfrecord_rows(obj, path)
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
    return TFD_TAR, by_file


def _has_prefix(path: str, prefix: str) -> bool:
    prefix = prefix.rstrip("/") or "/"
    return path == prefix or path.startswith(prefix if prefix.endswith("/") else prefix + "/")


def _resolve(
    recorded: str, index_dir: str, remap: Sequence[tuple[str, str]], reroot: bool
) -> tuple[str | None, str]:
    """(absolute shard path or None when missing, how it was found)."""
    for old, new in sorted(remap, key=lambda r: len(r[0]), reverse=True):
        if _has_prefix(recorded, old):
            target = new.rstrip("/") + recorded[len(old.rstrip("/")) :]
            target = os.path.abspath(os.path.expanduser(target))
            return (target if os.path.isfile(target) else None), f"remapped {old}={new}"
    as_recorded = [
        os.path.abspath(p)
        for p in (
            [recorded] if os.path.isabs(recorded) else [os.path.join(index_dir, recorded), recorded]
        )
    ]
    if reroot:
        beside = os.path.join(index_dir, os.path.basename(recorded))
        if os.path.isfile(beside):
            return beside, "as recorded" if beside in as_recorded else "re-rooted beside the index"
    for candidate in as_recorded:
        if os.path.isfile(candidate):
            return candidate, "as recorded"
    return None, "missing"


def _sniff(path: str) -> str | None:
    """The kind of legacy index at ``path`` from its first bytes, or None."""
    with open(path, "rb") as f:
        head = f.read(4096)
    if head.startswith(b"\x80"):  # pickle protocol 2 and later (every tfd-utils index)
        return "pickle"
    for line in head.splitlines():
        line = line.strip()
        if not line:
            continue
        if _OFFSETS_LINE.match(line):
            return OFFSETS
        if _MXNET_LINE.match(line):
            return MXNET_IDX
        return None
    return None


def _pickled_dict(path: str) -> bool:
    """Whether the file starts like a pickled dict (protocol 2-5), as every tfd-utils
    index does; for files given by other names (``index_file=``). Stricter than
    :func:`_sniff`: a TFRecord whose first record is 128 bytes long starts with 0x80."""
    with open(path, "rb") as f:
        head = f.read(12)
    if len(head) < 3 or head[0] != 0x80 or head[1] not in (2, 3, 4, 5):
        return False
    return head[2:3] == b"}" or (head[2:3] == b"\x95" and head[11:12] == b"}")


def _not_known_reason(path: str) -> str:
    with open(path, "rb") as f:
        head = f.read(64).strip()
    if not head:
        return "empty file"
    if _DALI_TAR_LINE.match(head.split(b"\n", 1)[0].strip()):
        return "a DALI wds2idx (tar) index: not imported; ingest the tar shards instead"
    return "not a legacy index shardcat knows (tfd-utils pickle, MXNet/DALI or vahidk index)"


def _is_index_name(name: str) -> bool:
    return name.endswith(INDEX_SUFFIXES)


def _by_stem(directory: str) -> dict[str, list[str]]:
    """The names in ``directory`` (sorted), by stem."""
    stems: dict[str, list[str]] = {}
    for name in sorted(os.listdir(directory)):
        stems.setdefault(os.path.splitext(name)[0], []).append(name)
    return stems


Listing = Callable[[str], dict[str, list[str]]]


def _shard_beside(index_path: str, kind: str, listing: Listing) -> str | None:
    """The shard a per-shard text index belongs to: ``<name>.idx`` -> ``<name>``,
    else the one file beside it with the same stem and the right format
    (RecordIO: the ``.rec`` whose MXNet index it is, ``<stem>.idx``)."""
    directory, name = os.path.split(index_path)
    base = os.path.splitext(name)[0]
    stems = listing(directory)
    if kind == MXNET_IDX:  # the .rec whose index (recordio.idx_path_for) this is
        candidates = stems.get(base, []) if name == base + ".idx" else []
    elif base in stems.get(os.path.splitext(base)[0], []) and not _is_index_name(base):
        candidates = [base]
    else:
        candidates = stems.get(base, [])
    matches = []
    for candidate in candidates:
        path = os.path.join(directory, candidate)
        if path == index_path or _is_index_name(candidate) or ".sqlite" in candidate:
            continue
        if not os.path.isfile(path):
            continue
        try:  # an empty file has no format to detect: its name decides
            if os.path.getsize(path) == 0 or detect_format(path) == _FORMAT_OF[kind]:
                matches.append(path)
        except CatalogError:
            continue
    return matches[0] if len(matches) == 1 else None


def _text_rows(path: str, kind: str) -> list[Any]:
    rows: list[Any] = []
    for line_at, text in index_lines(path):
        if kind == MXNET_IDX:  # as readers/recordio.py reads .idx files
            key, _, offset_text = text.partition("\t")
            if not offset_text.isdigit():
                raise LegacyIndexError(
                    path, line_at, f"expected 'key<TAB>offset', found {text[:80]!r}"
                )
            rows.append((key, int(offset_text)))
            continue
        parts = text.split()
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise LegacyIndexError(
                path, line_at, f"expected '<offset> <size>', found {text[:80]!r}"
            )
        offset, size = int(parts[0]), int(parts[1])
        if size < _TFRECORD_FRAME:
            raise LegacyIndexError(path, line_at, f"a TFRecord frame cannot be {size} bytes long")
        rows.append(Entry(None, offset, size - _TFRECORD_FRAME, _NO_FIELDS, _NO_MEMBERS))
    return rows


def read_legacy_index(
    path: str | os.PathLike[str], remap: Sequence[tuple[str, str]] = ()
) -> LegacyIndex | None:
    """Read one legacy index file; None when it is no kind this module knows.

    Raises :class:`LegacyIndexError` for a refused or corrupt pickle, or a
    malformed text index; :class:`CatalogError` when a per-shard text index
    has no shard beside it.
    """
    return _read_legacy_index(path, remap, _by_stem)


def _read_legacy_index(
    path: str | os.PathLike[str], remap: Sequence[tuple[str, str]], listing: Listing
) -> LegacyIndex | None:
    where = os.path.abspath(os.fspath(path))
    sniffed = _sniff(where)
    if sniffed is None:
        return None
    mtime_ns = os.stat(where).st_mtime_ns
    index_dir = os.path.dirname(where)
    if sniffed != "pickle":
        shard = _shard_beside(where, sniffed, listing)
        if shard is None:
            raise CatalogError(
                f"{where}: cannot tell which shard this {sniffed} belongs to: expected its "
                "shard beside it, named like it without the index extension"
            )
        rows = _text_rows(where, sniffed)
        return LegacyIndex(where, sniffed, mtime_ns, [LegacyShard(shard, shard, "beside", rows)])
    kind, by_file = _tfd_rows(load_pickle(where), where)
    names = [os.path.basename(f) for f in by_file]
    reroot = len(set(names)) == len(names)
    index = LegacyIndex(where, kind, mtime_ns, [])
    for recorded, rows in by_file.items():
        found, how = _resolve(recorded, index_dir, remap, reroot)
        if found is None:
            index.missing.append(recorded)
        else:
            index.shards.append(LegacyShard(found, recorded, how, rows))
    index.shards.sort(key=lambda s: s.path)
    return index


# -- discovery -----------------------------------------------------------------------


def discover(
    paths: PathsLike, remap: Sequence[tuple[str, str]] = ()
) -> tuple[list[LegacyIndex], list[tuple[str, str]]]:
    """Legacy index files for ``paths`` (directories, index files, shard files or
    globs of them; see the module docs): the indexes read, and ``(file, reason)``
    for files named like indexes that were not imported."""
    explicit: list[str] = []
    directories: list[str] = []
    shard_filter: set[str] = set()
    for pattern in as_patterns(paths):
        pattern = os.path.expanduser(pattern)
        matches = [pattern] if os.path.exists(pattern) else sorted(glob.glob(pattern))
        if not matches:
            raise CatalogError(f"no files match {pattern!r}")
        for match in matches:
            match = os.path.abspath(match)
            if os.path.isdir(match):
                directories.append(match)
            elif _is_index_name(match) or _pickled_dict(match):
                explicit.append(match)
            elif ".sqlite" not in os.path.basename(match):
                shard_filter.add(match)
                directories.append(os.path.dirname(match))
    listing = functools.cache(_by_stem)  # each directory listed once per discovery
    found = dict.fromkeys(explicit)
    for directory in dict.fromkeys(directories):
        for name in sorted(itertools.chain.from_iterable(listing(directory).values())):
            candidate = os.path.join(directory, name)
            if _is_index_name(name) and os.path.isfile(candidate):
                found.setdefault(candidate)
    indexes: list[LegacyIndex] = []
    skipped: list[tuple[str, str]] = []
    for candidate in found:
        try:
            index = _read_legacy_index(candidate, remap, listing)
        except CatalogError as exc:
            if candidate in explicit or isinstance(exc, LegacyIndexError):
                raise
            skipped.append((candidate, str(exc)))
            continue
        if index is None:
            if candidate in explicit:
                raise CatalogError(f"{candidate}: {_not_known_reason(candidate)}")
            skipped.append((candidate, _not_known_reason(candidate)))
            continue
        if shard_filter:
            index.shards = [s for s in index.shards if s.path in shard_filter]
            if not index.shards and candidate not in explicit:
                continue  # an index of other shards in the same directory
        indexes.append(index)
    return indexes, skipped


# -- plans: which dataset, which shards, from which index --------------------------------


@dataclass
class _Plan:
    indexes: list[LegacyIndex]  # of one kind (see _plans)
    shards: dict[str, tuple[LegacyIndex, LegacyShard]]
    extra: list[str] = field(default_factory=list)  # files of the source set no index covers
    source: list[str] = field(default_factory=list)

    @property
    def format(self) -> str:
        return self.indexes[0].format

    @property
    def keyed(self) -> bool:
        return self.indexes[0].keyed

    @property
    def files(self) -> list[str]:
        return sorted([*self.shards, *self.extra])


def _plans(indexes: list[LegacyIndex], skipped: list[tuple[str, str]]) -> list[_Plan]:
    # each shard goes to its best index: keyed before offsets-only, then the newest file
    ranked = sorted(indexes, key=lambda i: (not i.keyed, -i.mtime_ns, i.path))
    owner: dict[str, LegacyIndex] = {}
    for index in ranked:
        for shard in index.shards:
            owner.setdefault(shard.path, index)
    plans: list[_Plan] = []
    grouped: dict[tuple[str, str, str], _Plan] = {}
    for index in ranked:
        mine = [s for s in index.shards if owner[s.path] is index]
        if not mine and index.shards:
            others = sorted({owner[s.path].path for s in index.shards})
            skipped.append((index.path, f"its shards are covered by {', '.join(others)}"))
            continue
        if not mine and not index.missing:
            skipped.append((index.path, "it holds no records"))
            continue
        if len(index.shards) == 1 and not index.missing:
            group_key = (os.path.dirname(mine[0].path), index.kind, index.format)
            plan = grouped.get(group_key)
            if plan is None:
                plan = grouped[group_key] = _Plan([], {})
                plans.append(plan)
        else:
            plan = _Plan([], {})
            plans.append(plan)
        plan.indexes.append(index)
        for shard in mine:
            plan.shards[shard.path] = (index, shard)
    return plans


def _source(files: list[str], given: list[str]) -> tuple[list[str], list[str]]:
    """(source patterns, extra empty files they add) for a shard set; see the module docs."""
    wanted = set(files)
    candidates = [os.path.abspath(os.path.expanduser(p)) for p in given if glob.has_magic(p)]
    directories = {os.path.dirname(f) for f in files}
    suffixes = {Path(f).suffix for f in files}
    if len(directories) == 1 and len(suffixes) == 1 and next(iter(suffixes)):
        directory, suffix = glob.escape(next(iter(directories))), next(iter(suffixes))
        candidates.append(os.path.join(directory, "*" + suffix))
        # "train-*.tfrecord" for train-00000-of-00004.tfrecord ... beside val-*.tfrecord
        names = [Path(f).name for f in files]
        # character-wise on purpose: the file names' common start
        common = re.match(r"^(.*[-_.])", os.path.commonprefix(names))  # noqa: RUF071
        if common:
            candidates.append(os.path.join(directory, glob.escape(common.group(1)) + "*" + suffix))
    for candidate in candidates:
        matched = set(resolve_paths(candidate))
        extra = matched - wanted
        if wanted <= matched and all(os.path.getsize(f) == 0 for f in extra):
            return [candidate], sorted(extra)
    return sorted(files), []


# -- verification --------------------------------------------------------------------------


class _Mismatch(Exception):
    """The legacy entries of a shard do not match the file (the message says how)."""


def _sample(n: int, k: int) -> list[int]:
    """Indexes of the entries to re-read: the first, the last and evenly spaced ones."""
    if k <= 0 or n <= k:
        return list(range(n))
    k = max(k, 2)
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def _spell(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _key_candidates(fmt: Format, raw: bytes, options: Mapping[str, Any], key: str) -> list[str]:
    record = fmt.decode(raw, options)
    out = []
    for name, values in fmt.features(record).items():
        try:
            if values and _spell(values[0]) == key:
                out.append(name)
        except UnicodeDecodeError:
            continue
    return sorted(out, key=lambda n: (n != "key", n))


def _infer_key(plan: _Plan, options: Mapping[str, Any]) -> str:
    """The feature holding tfd-utils' keys: read off the first record found,
    ``key`` preferred when several features hold the key."""
    fmt = get_format("tfrecord")
    for path, (_, shard) in sorted(plan.shards.items()):
        if not shard.rows or detect_compression(path) is not None:
            continue
        first = min(shard.rows, key=lambda e: e.offset)
        key, offset, length = first.key, first.offset, first.length
        fd = os.open(path, os.O_RDONLY)
        try:
            raw = fmt.read(FileSource(fd), path, offset, length, False)
            candidates = _key_candidates(fmt, raw, options, key)
        except (CorruptRecordError, OSError):
            continue
        finally:
            os.close(fd)
        if candidates:
            return candidates[0]
    return "key"


def _tfrecord_entries(size: int, entries: list[Entry]) -> list[Entry]:
    """The entries in file order, checked to tile the file frame after frame."""
    entries.sort(key=_by_offset)
    starts = [*map(_by_offset, entries)]
    ends = [o + _TFRECORD_FRAME + n for o, n in zip(starts, map(_by_length, entries), strict=True)]
    if [0, *ends[:-1]] != starts:  # find the first gap or overlap
        pos = 0
        for offset, end in zip(starts, ends, strict=True):
            if offset != pos:
                raise _Mismatch(
                    f"the index has no record starting at byte {pos} (its next one is at "
                    f"byte {offset})"
                    if offset > pos
                    else f"records at byte {offset} overlap the one before"
                )
            pos = end
    end = ends[-1] if ends else 0
    if end != size:
        raise _Mismatch(f"the index ends at byte {end}, the file at byte {size}")
    return entries


def _recordio_entries(size: int, rows: list[Any]) -> list[Entry]:
    rows.sort(key=lambda r: r[1])
    if not rows:
        if size:
            raise _Mismatch("the index is empty, the file is not")
        return []
    if rows[0][1] != 0:
        raise _Mismatch("the record at byte 0 has no line in the index")
    entries = []
    for (key, offset), nxt in zip(rows, [*(r[1] for r in rows[1:]), size], strict=True):
        if nxt - offset < recordio_format.HEADER:
            raise _Mismatch(
                f"no record fits between bytes {offset} and {nxt} (duplicate offset, or the "
                "index runs past the end of the file)"
            )
        entries.append(Entry(key, offset, nxt - offset, _NO_FIELDS, _NO_MEMBERS))
    return entries


class _PreadCursor:
    """What :func:`shardcat.readers.tar.iter_members` walks, from any offset of a file."""

    def __init__(self, fd: int, size: int, pos: int) -> None:
        self.fd, self.size, self.pos = fd, size, pos

    def read(self, size: int) -> bytes:
        data = os.pread(self.fd, size, self.pos)
        self.pos += len(data)
        return data

    def skip(self, size: int) -> int:
        done = max(0, min(size, self.size - self.pos))
        self.pos += done
        return done


def _members(fd: int, size: int, path: str, start: int) -> Iterator[tar_format.Member]:
    return tar_format.iter_members(_PreadCursor(fd, size, start), path)


def _unindexed(member: tar_format.Member) -> _Mismatch | None:
    if member.is_file and tar_format.split_key(member.name, "tfd") is not None:
        return _Mismatch(
            f"member {member.name!r} (header at byte {member.header_offset}) is not in the index"
        )
    return None


def _walk_to(fd: int, size: int, path: str, start: int, target: int) -> tar_format.Member:
    """The member whose data starts at ``target``, reading every header from
    ``start``; a keyed regular member on the way is one the index lacks."""
    for member in _members(fd, size, path, start):
        if member.data_offset == target:
            return member
        problem = _unindexed(member)
        if problem is not None:
            raise problem
        if member.data_offset > target:
            break
    raise _Mismatch(f"no member header right before byte {target}, where the index has data")


def _check_member(member: tar_format.Member, name: str, size: int, offset: int) -> None:
    if member.extents is not None:  # a legacy index holds one range: the stored bytes
        raise _Mismatch(f"{member.name!r} is a sparse member (re-indexed from the data)")
    if (
        not member.is_file
        or member.name != name
        or member.size != size
        or member.data_offset != offset
    ):
        raise _Mismatch(
            f"the header at byte {member.header_offset} is {member.name!r} ({member.size} "
            f"bytes from byte {member.data_offset}), the index says {name!r} ({size} bytes "
            f"from byte {offset})"
        )


def _tar_entries(path: str, size: int, rows: list[Any], sample: int) -> tuple[list[Entry], int]:
    """Samples from tfd-utils' members (runs of one key, as the tar scan groups
    them), checked header by header where members do not follow each other."""
    rows.sort(key=lambda r: r[3])
    headers: list[int] = []
    checked: set[int] = set()
    fd = os.open(path, os.O_RDONLY)
    try:
        end = 0
        for i, (key, ext, name, offset, length) in enumerate(rows):
            if tar_format.split_key(name, "tfd") != (key, ext):
                raise _Mismatch(f"entry {key!r}/{ext!r} does not match its member name {name!r}")
            if offset - tar_format.BLOCK == end:  # right after the member before: one header
                headers.append(end)
            elif offset - tar_format.BLOCK > end:  # other headers in between: read them
                member = _walk_to(fd, size, path, end, offset)
                _check_member(member, name, length, offset)
                headers.append(member.header_offset)
                checked.add(i)
            else:
                raise _Mismatch(f"member data at byte {offset} overlaps the member before")
            end = offset + tar_format.padded(length)
        for member in _members(fd, size, path, end):  # nothing keyed after the last one
            problem = _unindexed(member)
            if problem is not None:
                raise problem
        for i in _sample(len(rows), sample):
            if i in checked:
                continue
            found = next(_members(fd, size, path, headers[i]), None)
            if found is None:
                raise _Mismatch(f"the archive ends at byte {headers[i]}, before {rows[i][2]!r}")
            _check_member(found, rows[i][2], rows[i][4], rows[i][3])
            checked.add(i)
    finally:
        os.close(fd)
    entries: list[Entry] = []
    seen: set[str] = set()
    for (key, ext, _, offset, length), header in zip(rows, headers, strict=True):
        last = entries[-1] if entries else None
        if last is None or key != last.key or ext in seen:  # a new sample
            last = Entry(key, header, 0)
            entries.append(last)
            seen = set()
        seen.add(ext)
        last.members.append((ext, offset, length))
        last.length = offset + length - last.offset
    return entries, len(checked)


def _verify(
    plan: _Plan,
    index: LegacyIndex,
    shard: LegacyShard,
    st: os.stat_result,
    options: Mapping[str, Any],
    sample: int,
) -> tuple[list[Entry], int]:
    """The shard's entries from its legacy rows, checked against the file (raises
    :class:`_Mismatch`); also how many entries were re-read."""
    path = shard.path
    if detect_compression(path) is not None:
        raise _Mismatch("compressed shard: its seek points are built from the data")
    if st.st_mtime_ns > index.mtime_ns:
        raise _Mismatch("the shard was modified after the legacy index was written")
    fmt = get_format(plan.format)
    try:
        if plan.format == "tar":
            return _tar_entries(path, st.st_size, shard.rows, sample)
        if plan.format == "tfrecord":
            entries = _tfrecord_entries(st.st_size, shard.rows)
        else:
            entries = _recordio_entries(st.st_size, shard.rows)
        picks = _sample(len(entries), sample)
        key_feature = options.get("key") if plan.format == "tfrecord" else None
        fd = os.open(path, os.O_RDONLY)
        try:
            source = FileSource(fd)
            for i in picks:
                e = entries[i]
                raw = fmt.read(source, path, e.offset, e.length, True)
                if key_feature is not None and e.key is not None:
                    values = fmt.feature_list(fmt.decode(raw, options), key_feature)
                    found = _spell(values[0]) if values else None
                    if found != e.key:
                        raise _Mismatch(
                            f"the record at byte {e.offset} has {key_feature}={found!r}, the "
                            f"index says {e.key!r}"
                        )
        finally:
            os.close(fd)
        return entries, len(picks)
    except CorruptRecordError as exc:
        raise _Mismatch(f"{exc.problem} (at byte {exc.offset})") from None
    except UnicodeDecodeError as exc:
        raise _Mismatch(f"a key is not UTF-8: {exc}") from None


# -- the report ------------------------------------------------------------------------------


def _totals(shards: list[ShardReport], dry_run: bool) -> dict[str, int]:
    imported = "import" if dry_run else "imported"
    reindexed = "re-index" if dry_run else "re-indexed"
    return {
        "imported": sum(s.action == imported for s in shards),
        "verified": sum(s.verified for s in shards),
        "re-indexed": sum(s.action == reindexed for s in shards),
        "unchanged": sum(s.action == "unchanged" for s in shards),
        "failed": sum(s.action == "failed" for s in shards),
    }


@dataclass
class ShardReport:
    """What happened to one shard.

    ``action``: ``imported`` (legacy entries verified and committed),
    ``re-indexed`` (scanned from its data; ``reason`` says why), ``unchanged``
    (already in the catalog), ``failed`` (``reason`` holds the error), or with
    ``dry_run`` ``import``/``re-index``. ``checked``: entries re-read while
    verifying; ``verified``: whether the legacy entries passed.
    """

    path: str
    legacy: str | None
    action: str
    records: int = 0
    verified: bool = False
    checked: int = 0
    resolved_by: str = ""
    reason: str | None = None


@dataclass
class DatasetReport:
    dataset: str
    catalog: str
    format: str
    key_rule: str
    legacy: list[str]
    source: list[str]
    fields: bool
    shards: list[ShardReport]
    fill_fields: str | None = None  # the command that fills the SQL fields later

    def count(self, action: str) -> int:
        return sum(1 for s in self.shards if s.action == action)

    def totals(self, dry_run: bool) -> dict[str, int]:
        """Shards per outcome (``imported`` and ``re-indexed`` count the dry run's
        ``import``/``re-index`` too; ``verified``: legacy entries that passed)."""
        return _totals(self.shards, dry_run)

    @property
    def records(self) -> int:
        return sum(s.records for s in self.shards)


@dataclass
class MigrationReport:
    """The outcome of :func:`migrate`: one :class:`DatasetReport` per dataset,
    and the index-like files that were not imported, with the reason."""

    dry_run: bool
    datasets: list[DatasetReport]
    skipped: list[tuple[str, str]]

    def totals(self) -> dict[str, int]:
        """Shards per outcome, over every dataset (see :meth:`DatasetReport.totals`)."""
        return _totals([s for d in self.datasets for s in d.shards], self.dry_run)

    @property
    def failed(self) -> bool:
        return any(s.action == "failed" for d in self.datasets for s in d.shards)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "totals": self.totals(),
            "datasets": [asdict(d) for d in self.datasets],
            "skipped": [{"path": p, "reason": r} for p, r in self.skipped],
        }


# -- migrate -------------------------------------------------------------------------------------


def _parse_remap(
    remap: Mapping[str, str] | Iterable[tuple[str, str] | str] | None,
) -> list[tuple[str, str]]:
    if remap is None:
        return []
    items = remap.items() if isinstance(remap, Mapping) else remap
    out = []
    for item in items:
        if isinstance(item, str):
            old, eq, new = item.partition("=")
            if not eq or not old:
                raise CatalogError(f"--remap takes OLD_PREFIX=NEW_PREFIX, not {item!r}")
            item = (old, new)
        out.append((str(item[0]), str(item[1])))
    return out


def _options(plan: _Plan, fields: bool, key: str | None) -> dict[str, Any]:
    """The dataset options a fresh ingest of these shards would record."""
    first = min(plan.shards)
    opts: dict[str, Any] = {**get_format(plan.format).detect_options(first), "fields": fields}
    if plan.format == "tfrecord":
        opts["key"] = (key or _infer_key(plan, opts)) if plan.keyed else None
    elif plan.format == "tar":
        opts.update(key="key", grouping="tfd")
    else:
        opts.update(key="key", idx=True)
    return opts


@contextlib.contextmanager
def _opened(
    catalog: Catalog | str | os.PathLike[str] | None, where: Path, dry_run: bool
) -> Iterator[Catalog | None]:
    """The catalog to migrate into (None: a dry run where no catalog exists yet)."""
    if isinstance(catalog, Catalog):
        yield catalog
        return
    if dry_run and not where.is_file():
        yield None
        return
    cat = Catalog(where, readonly=dry_run)
    try:
        yield cat
    finally:
        cat.close()


def _known_shards(cat: Catalog | None, name: str | None) -> dict[str, tuple[int, int, str, int]]:
    """Stored shard path -> (size, mtime_ns, state, records) of dataset ``name``."""
    if cat is None or name is None:
        return {}
    rows = cat.reader_connection().execute(
        "SELECT s.path, s.size, s.mtime_ns, s.state, s.num_records FROM shards s "
        "JOIN datasets d ON d.id = s.dataset_id WHERE d.name = ?",
        (name,),
    )
    return {r[0]: (r[1], r[2], r[3], r[4]) for r in rows}


def _stored_options(cat: Catalog | None, name: str | None) -> dict[str, Any] | None:
    """The options dataset ``name`` was ingested with; None when there is no such dataset."""
    if cat is None or name is None:
        return None
    row = (
        cat.reader_connection()
        .execute("SELECT options FROM datasets WHERE name = ?", (name,))
        .fetchone()
    )
    return None if row is None else dict(json.loads(row[0]))


def _provider(st: os.stat_result, entries: list[Entry], report: ShardReport) -> ProvideEntries:
    """The verified entries, handed to the ingest once it claimed the shard, unless
    the file changed since it was verified (then the ingest scans it)."""

    def provide(path: str, now: os.stat_result) -> ShardScan | None:
        if (now.st_size, now.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
            report.reason = "the shard changed while it was being migrated"
            return None
        report.action = "imported"
        return ShardScan(entries)

    return provide


class _Ticker:
    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total, self.progress, self.done = total, progress, {"verify": 0, "commit": 0}

    def __call__(self, step: str) -> None:
        self.done[step] += 1
        if self.progress is not None:
            self.progress(step, self.done[step], self.total)


def _fill_command(report: DatasetReport) -> str:
    parts = ["catalog", "migrate", *report.legacy, "--dataset", report.dataset]
    return " ".join(shlex.quote(p) for p in [*parts, "--catalog", report.catalog, "--fields"])


def _migrate_plan(
    plan: _Plan,
    *,
    catalog: Catalog | str | os.PathLike[str] | None,
    dataset: str | None,
    dry_run: bool,
    fields: bool | None,
    key: str | None,
    sample: int,
    workers: int | None,
    on_duplicate: str,
    tick: _Ticker,
) -> DatasetReport:
    missing = [
        ShardReport(m, i.path, "failed", reason="shard not found (is it moved? see --remap)")
        for i in plan.indexes
        for m in i.missing
    ]
    if not plan.shards:
        return DatasetReport(
            dataset or "-",
            "-",
            plan.format,
            "-",
            [i.path for i in plan.indexes],
            [],
            bool(fields),
            missing,
        )
    if isinstance(catalog, Catalog):
        where = catalog.path
    else:
        where = locate(catalog, os.path.commonpath([os.path.dirname(f) for f in plan.files]))
        where = where.absolute()
    with _opened(catalog, where, dry_run) as cat:
        name = dataset or (None if cat is None else cat.find_dataset(plan.source))
        known = _known_shards(cat, name)
        stored = _stored_options(cat, name) or {}
        if fields is None:  # as the dataset was migrated or ingested before, else without
            fields = bool(stored.get("fields", False))
        # shards migrated without fields are re-read when fields are asked for now
        rescan = fields and stored.get("fields") is False
        options = _options(plan, fields, key or stored.get("key"))
        reports: dict[str, ShardReport] = {}
        provided: dict[str, ProvideEntries] = {}
        for path in plan.files:
            index, shard = plan.shards.get(path, (None, None))
            report = reports[path] = ShardReport(
                path,
                None if index is None else index.path,
                "re-index",
                resolved_by="" if shard is None else shard.resolved_by,
            )
            st = os.stat(path)
            before = known.get(stored_path(path, str(where.parent)))
            if (
                not rescan
                and before is not None
                and before[:3] == (st.st_size, st.st_mtime_ns, "ready")
            ):
                report.action, report.records = "unchanged", before[3]
            elif index is None or shard is None:
                report.reason = "not in any legacy index"
            elif fields:
                report.reason = "--fields: SQL fields are read from the data"
            else:
                try:
                    entries, report.checked = _verify(plan, index, shard, st, options, sample)
                except _Mismatch as exc:
                    report.reason = f"legacy index does not match the file: {exc}"
                else:
                    report.action, report.verified, report.records = "import", True, len(entries)
                    provided[path] = _provider(st, entries, report)
                shard.rows = []  # the entries (or the re-index) replace them
            tick("verify")
        result = DatasetReport(
            dataset=name or default_dataset_name(plan.files),
            catalog=str(where),
            format=plan.format,
            key_rule=get_format(plan.format).key_rule(options),
            legacy=[i.path for i in plan.indexes],
            source=plan.source,
            fields=fields,
            shards=[*reports.values(), *missing],
        )
        if cat is not None and not dry_run:
            result.dataset = _commit(
                cat, plan, name, options, provided, reports, rescan, workers, on_duplicate, tick
            )
    if not fields:
        result.fill_fields = _fill_command(result)
    return result


def _commit(
    cat: Catalog,
    plan: _Plan,
    name: str | None,
    options: dict[str, Any],
    provided: dict[str, ProvideEntries],
    reports: dict[str, ShardReport],
    rescan: bool,
    workers: int | None,
    on_duplicate: str,
    tick: _Ticker,
) -> str:
    """Run the ingest with the verified entries; returns the dataset's name."""

    def on_outcome(outcome: ShardOutcome, total: int) -> None:
        report = reports.get(absolute_path(outcome.path, cat.directory))
        if report is not None and outcome.error != CLAIM_LOST:
            report.records = outcome.records
            if outcome.error is not None:
                why = f"{report.reason}; re-indexing failed too: " if report.reason else ""
                report.action, report.reason = "failed", why + outcome.error
            elif report.action != "imported":
                report.action = "re-indexed"
        tick("commit")

    try:
        with cat.ingest(
            plan.source,
            name,
            format=plan.format,
            options=options,
            workers=workers,
            on_duplicate=on_duplicate,
            rescan=rescan,
            progress=on_outcome,
            provided=provided,
        ) as reader:
            name = reader.dataset
    except IngestError:
        name = name or cat.find_dataset(plan.source)  # failures are in the reports already
    if name is None:  # every shard failed before the dataset existed
        raise CatalogError(f"nothing of {plan.source} could be imported into {cat.path}")
    # shards indexed by another process at the same time, and the final counts
    for path, (_, _, state, records) in _known_shards(cat, name).items():
        report = reports.get(absolute_path(path, cat.directory))
        if report is not None and report.action in ("import", "re-index"):
            report.action = "re-indexed" if state == "ready" else "failed"
        if report is not None and state == "ready":
            report.records = records
    return name


def migrate(
    paths: PathsLike,
    *,
    catalog: Catalog | str | os.PathLike[str] | None = None,
    dataset: str | None = None,
    dry_run: bool = False,
    remap: Mapping[str, str] | Iterable[tuple[str, str] | str] | None = None,
    fields: bool | None = None,
    key: str | None = None,
    sample: int = DEFAULT_SAMPLE,
    workers: int | None = None,
    on_duplicate: str = "error",
    progress: Progress | None = None,
) -> MigrationReport:
    """Import the legacy index files found for ``paths`` into the catalog.

    ``paths``: directories, legacy index files, shard files or globs (see the
    module docs for discovery, re-rooting and verification). ``catalog``: a
    :class:`Catalog` or a catalog path (default: the one readers of the shards
    use, ``shardcat.sqlite`` beside them). ``dataset``: the dataset name (only
    when the indexes make one dataset; default: the dataset already holding
    these shards, else named after the files). ``dry_run``: verify and report,
    write nothing. ``remap``: ``{OLD_PREFIX: NEW_PREFIX}`` (or ``"OLD=NEW"``
    strings) for shard paths recorded in tfd-utils indexes. ``fields``: True
    fills the SQL fields, re-indexing every shard from its data (as slow as a
    fresh ingest); False imports without them; None (default): as the dataset
    was ingested before, else False. ``key``: the key feature of tfd-utils
    TFRecord indexes (default: as the dataset was ingested before, else read
    off the records). ``sample``:
    entries re-read per shard (0: all). ``workers``: processes re-indexing
    shards. ``on_duplicate``: as for :meth:`Catalog.ingest`.
    ``progress(step, done, total)``: ``step`` is ``verify`` (per shard) or
    ``commit`` (per shard committed or re-indexed).

    Raises :class:`LegacyIndexError` for a refused or corrupt pickle, before
    anything is written. Shards that fail are in the report, not raised.
    """
    with _gc_paused():
        return _migrate(
            paths,
            catalog=catalog,
            dataset=dataset,
            dry_run=dry_run,
            remap=_parse_remap(remap),
            fields=fields,
            key=key,
            sample=sample,
            workers=workers,
            on_duplicate=on_duplicate,
            progress=progress,
        )


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection meanwhile: a migration holds millions of
    entries, and every full collection would walk them all (it doubled the time
    of building them). Nothing here makes reference cycles."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _migrate(
    paths: PathsLike,
    *,
    catalog: Catalog | str | os.PathLike[str] | None,
    dataset: str | None,
    dry_run: bool,
    remap: list[tuple[str, str]],
    fields: bool | None,
    key: str | None,
    sample: int,
    workers: int | None,
    on_duplicate: str,
    progress: Progress | None,
) -> MigrationReport:
    indexes, skipped = discover(paths, remap)
    plans = _plans(indexes, skipped)
    if dataset is not None and len(plans) > 1:
        raise CatalogError(
            f"--dataset names one dataset, but the legacy indexes make {len(plans)}: "
            + "; ".join(", ".join(i.path for i in p.indexes) for p in plans)
            + " (migrate them one at a time)"
        )
    for plan in plans:  # the source set (and its files no index covers) before counting
        if plan.shards:
            plan.source, plan.extra = _source(sorted(plan.shards), as_patterns(paths))
    tick = _Ticker(sum(len(p.files) for p in plans), progress)
    reports = [
        _migrate_plan(
            plan,
            catalog=catalog,
            dataset=dataset,
            dry_run=dry_run,
            fields=fields,
            key=key,
            sample=sample,
            workers=workers,
            on_duplicate=on_duplicate,
            tick=tick,
        )
        for plan in plans
    ]
    return MigrationReport(dry_run, reports, skipped)
