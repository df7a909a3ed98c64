"""Legacy index files: what kind a file is, the shards it covers, and finding them.

**Kinds** (the content tells, not the name):

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
  grouping). Loaded with the restricted unpickler (:mod:`.pickles`).
- MXNet ``.idx`` files (``key<TAB>offset`` lines, also what DALI's
  ``rec2idx`` writes) beside their ``.rec`` (same stem): keys as ``catalog
  ingest`` takes them from the ``.idx``.
- TFRecord offset indexes, ``<offset> <frame size>`` lines, as DALI's
  ``tfrecord2idx`` and vahidk/tfrecord's ``tfrecord2idx`` write them (named
  ``<stem>.idx``, ``<name>.idx``, ``<stem>.tfindex``, ``<name>.tfindex`` or a
  text ``<stem>.index``): records are keyed by position, as those tools do.

**Moved datasets.** A shard path recorded in a tfd-utils index is resolved by
the first rule that applies: a ``--remap OLD=NEW`` whose ``OLD`` prefixes it
(explicit: used even when the new path is missing); a file with the same name
beside the index file (re-rooting; used only when the index's file names are
unique); the path as recorded (relative paths: from the index's directory,
then from the current one). A shard found by none is reported missing.

**A reader's files.** Given the files a reader was opened on (``onto``: a
drop-in reader handed a tfd-utils ``index_file``), a recorded shard that is
not one of them is the one of them with its name, when the names of both are
unique: the index was made over copies elsewhere (local copies of shards on
object storage, say). Its entries are verified against that file like any.

**Discovery.** :func:`discover` takes directories, index files given
explicitly (any name; the content tells the kind), and shard files or globs
(the index files beside them, restricted to those shards). A directory is
walked: its index files and those of every subdirectory below it
(``max_depth`` levels: 0 = the directory alone, None = the whole tree; hidden
directories, ``.name``, are left out; a directory reached twice through links
is read once). Index files are found by their names, ``*.index``,
``*.tar_index``, ``*.idx``, ``*.tfindex``, or by ``pattern`` (shell patterns
of file names, e.g. ``*.pkl`` for indexes saved under another name). A file
found by name whose content is none of the kinds above is skipped and listed
with the reason.
"""

from __future__ import annotations

import fnmatch
import functools
import glob
import itertools
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardcat.errors import CatalogError, LegacyIndexError
from shardcat.formats import tfrecord as tfrecord_format
from shardcat.formats.base import Entry
from shardcat.formats.registry import detect_format
from shardcat.migrations.legacy.pickles import (
    NO_FIELDS,
    NO_MEMBERS,
    load_pickle,
    pickled_dict,
    tfd_rows,
)
from shardcat.paths import PathsLike, as_patterns
from shardcat.sources.rawio import index_lines
from shardcat.sources.remote import is_url

__all__ = [
    "INDEX_SUFFIXES",
    "MXNET_IDX",
    "OFFSETS",
    "TFD_TAR",
    "TFD_TFRECORD",
    "LegacyIndex",
    "LegacyShard",
    "ReaderFiles",
    "discover",
    "is_index_name",
    "read_legacy_index",
]

INDEX_SUFFIXES = (".index", ".tar_index", ".idx", ".tfindex")
TFD_TFRECORD = "tfd-utils TFRecord index"
TFD_TAR = "tfd-utils tar index"
MXNET_IDX = "MXNet/DALI RecordIO index"
OFFSETS = "TFRecord offset index (DALI/vahidk tfrecord2idx)"
FORMAT_OF = {TFD_TFRECORD: "tfrecord", TFD_TAR: "tar", MXNET_IDX: "recordio", OFFSETS: "tfrecord"}
TFRECORD_FRAME = tfrecord_format.HEADER + tfrecord_format.FOOTER  # framing around a record
_TFD_KINDS = {"tfrecord": TFD_TFRECORD, "tar": TFD_TAR}
_OFFSETS_LINE = re.compile(rb"^\d+ \d+$")
_MXNET_LINE = re.compile(rb"^[^\t]+\t\d+$")
_DALI_TAR_LINE = re.compile(rb"^v\d+\.\d+ \d+$")


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
        return FORMAT_OF[self.kind]

    @property
    def keyed(self) -> bool:
        return self.kind != OFFSETS

    @property
    def tfd(self) -> bool:
        """Whether it is a tfd-utils pickle (one per reader call), not a per-shard text index."""
        return self.kind in (TFD_TFRECORD, TFD_TAR)


# -- where the recorded shards are now ----------------------------------------------------


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
            if is_url(target):  # on object storage: checked when the shard is verified
                return target, f"remapped {old}={new}"
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


class ReaderFiles:
    """The files a reader was opened on, that a tfd-utils index's shards are placed
    onto (see the module docs: "A reader's files")."""

    def __init__(self, files: Iterable[str]) -> None:
        self.files = set(files)
        names: dict[str, list[str]] = {}
        for path in self.files:
            names.setdefault(path.rsplit("/", 1)[-1], []).append(path)
        self.by_name = {name: paths[0] for name, paths in names.items() if len(paths) == 1}

    def place(self, recorded: str, found: str | None, how: str) -> tuple[str | None, str]:
        """Where the shard recorded as ``recorded`` (found at ``found``, ``how``) is
        among the reader's files; ``(found, how)`` when it is one, or has no namesake."""
        if found in self.files:
            return found, how
        target = self.by_name.get(recorded.replace(os.sep, "/").rsplit("/", 1)[-1])
        return (found, how) if target is None else (target, "the reader's file of that name")


# -- what kind of file ------------------------------------------------------------------


def sniff(path: str) -> str | None:
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


def not_known_reason(path: str) -> str:
    with open(path, "rb") as f:
        head = f.read(64).strip()
    if not head:
        return "empty file"
    if _DALI_TAR_LINE.match(head.split(b"\n", 1)[0].strip()):
        return "a DALI wds2idx (tar) index: not imported; ingest the tar shards instead"
    return "not a legacy index shardcat knows (tfd-utils pickle, MXNet/DALI or vahidk index)"


def is_index_name(name: str) -> bool:
    """Whether a file name is one legacy indexes are found by (without a ``pattern``)."""
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
    matches = []
    for candidate in shard_names(name, kind, listing(directory)):
        path = os.path.join(directory, candidate)
        if not os.path.isfile(path):
            continue
        try:  # an empty file has no format to detect: its name decides
            if os.path.getsize(path) == 0 or detect_format(path) == FORMAT_OF[kind]:
                matches.append(path)
        except CatalogError:
            continue
    return matches[0] if len(matches) == 1 else None


def shard_names(name: str, kind: str, stems: Mapping[str, list[str]]) -> list[str]:
    """The names of the files, among those beside it (``stems``: by stem), that may be
    the shard of the per-shard text index ``name`` (see :func:`_shard_beside`)."""
    base = os.path.splitext(name)[0]
    if kind == MXNET_IDX:  # the .rec whose index (recordio.idx_path_for) this is
        candidates = stems.get(base, []) if name == base + ".idx" else []
    elif base in stems.get(os.path.splitext(base)[0], []) and not is_index_name(base):
        candidates = [base]
    else:
        candidates = stems.get(base, [])
    return [c for c in candidates if c != name and not is_index_name(c) and ".sqlite" not in c]


def text_rows(path: str, kind: str, name: str | None = None) -> list[Any]:
    """The rows of the text index at ``path`` (errors name it ``name``, else ``path``)."""
    path_named = name or path
    rows: list[Any] = []
    for line_at, text in index_lines(path):
        if kind == MXNET_IDX:  # as readers/recordio.py reads .idx files
            key, _, offset_text = text.partition("\t")
            if not offset_text.isdigit():
                raise LegacyIndexError(
                    path_named, line_at, f"expected 'key<TAB>offset', found {text[:80]!r}"
                )
            rows.append((key, int(offset_text)))
            continue
        parts = text.split()
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise LegacyIndexError(
                path_named, line_at, f"expected '<offset> <size>', found {text[:80]!r}"
            )
        offset, size = int(parts[0]), int(parts[1])
        if size < TFRECORD_FRAME:
            raise LegacyIndexError(
                path_named, line_at, f"a TFRecord frame cannot be {size} bytes long"
            )
        rows.append(Entry(None, offset, size - TFRECORD_FRAME, NO_FIELDS, NO_MEMBERS))
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
    path: str | os.PathLike[str],
    remap: Sequence[tuple[str, str]],
    listing: Listing,
    onto: ReaderFiles | None = None,
) -> LegacyIndex | None:
    where = os.path.abspath(os.fspath(path))
    sniffed = sniff(where)
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
        rows = text_rows(where, sniffed)
        return LegacyIndex(where, sniffed, mtime_ns, [LegacyShard(shard, shard, "beside", rows)])
    layout, by_file = tfd_rows(load_pickle(where), where)
    kind = _TFD_KINDS[layout]
    names = [os.path.basename(f) for f in by_file]
    reroot = len(set(names)) == len(names)
    index = LegacyIndex(where, kind, mtime_ns, [])
    for recorded, rows in by_file.items():
        found, how = _resolve(recorded, index_dir, remap, reroot)
        if onto is not None and reroot:
            found, how = onto.place(recorded, found, how)
        if found is None:
            index.missing.append(recorded)
        else:
            index.shards.append(LegacyShard(found, recorded, how, rows))
    index.shards.sort(key=lambda s: s.path)
    return index


# -- discovery -----------------------------------------------------------------------


def _walk(root: str, max_depth: int | None, skipped: list[tuple[str, str]]) -> Iterator[str]:
    """``root`` and the directories below it, ``max_depth`` levels down (None: all),
    in sorted order; hidden ones (``.name``) left out, each real directory once."""
    seen: set[tuple[int, int]] = set()
    stack = [(root, 0)]
    while stack:
        directory, depth = stack.pop()
        try:
            st = os.stat(directory)
        except OSError as exc:
            skipped.append((directory, f"cannot read the directory: {exc.strerror or exc}"))
            continue
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        yield directory
        if max_depth is not None and depth >= max_depth:
            continue
        try:
            with os.scandir(directory) as it:
                below = sorted(e.path for e in it if not e.name.startswith(".") and e.is_dir())
        except OSError as exc:
            skipped.append((directory, f"cannot list the directory: {exc.strerror or exc}"))
            continue
        stack.extend((d, depth + 1) for d in reversed(below))


def _patterns(pattern: str | Sequence[str] | None) -> list[str] | None:
    if pattern is None:
        return None
    return [pattern] if isinstance(pattern, str) else list(pattern)


def discover(
    paths: PathsLike,
    remap: Sequence[tuple[str, str]] = (),
    *,
    max_depth: int | None = None,
    pattern: str | Sequence[str] | None = None,
    onto: ReaderFiles | None = None,
) -> tuple[list[LegacyIndex], list[tuple[str, str]]]:
    """Legacy index files for ``paths`` (directories, walked ``max_depth`` levels
    down; index files; shard files or globs of them; see the module docs): the
    indexes read, and ``(file, reason)`` for files found by name that were not
    imported. ``pattern``: shell patterns of the index file names to look for
    in directories (default: ``*.index``, ``*.tar_index``, ``*.idx``, ``*.tfindex``).
    ``onto``: a reader's files, that tfd-utils indexes' shards are placed onto."""
    if max_depth is not None and max_depth < 0:
        raise CatalogError(f"max_depth (--depth) must be 0 or more, not {max_depth}")
    names = _patterns(pattern)

    def wanted(name: str) -> bool:
        if names is None:
            return is_index_name(name)
        return any(fnmatch.fnmatchcase(name, p) for p in names)

    explicit: list[str] = []
    roots: list[str] = []
    shard_dirs: list[str] = []
    shard_filter: set[str] = set()
    for given in as_patterns(paths):
        given = os.path.expanduser(given)
        matches = [given] if os.path.exists(given) else sorted(glob.glob(given))
        if not matches:
            raise CatalogError(f"no files match {given!r}")
        for match in matches:
            match = os.path.abspath(match)
            if os.path.isdir(match):
                roots.append(match)
            elif is_index_name(match) or pickled_dict(match):
                explicit.append(match)
            elif ".sqlite" not in os.path.basename(match):
                shard_filter.add(match)
                shard_dirs.append(os.path.dirname(match))
    skipped: list[tuple[str, str]] = []
    directories = [d for root in dict.fromkeys(roots) for d in _walk(root, max_depth, skipped)]
    listing = functools.cache(_by_stem)  # each directory listed once per discovery
    found = dict.fromkeys(explicit)
    for directory in dict.fromkeys([*directories, *shard_dirs]):
        for name in sorted(itertools.chain.from_iterable(listing(directory).values())):
            candidate = os.path.join(directory, name)
            if wanted(name) and os.path.isfile(candidate):
                found.setdefault(candidate)
    indexes: list[LegacyIndex] = []
    for candidate in found:
        try:
            index = _read_legacy_index(candidate, remap, listing, onto)
        except CatalogError as exc:
            if candidate in explicit or isinstance(exc, LegacyIndexError):
                raise
            skipped.append((candidate, str(exc)))
            continue
        if index is None:
            if candidate in explicit:
                raise CatalogError(f"{candidate}: {not_known_reason(candidate)}")
            skipped.append((candidate, not_known_reason(candidate)))
            continue
        if shard_filter:
            index.shards = [s for s in index.shards if s.path in shard_filter]
            if not index.shards and candidate not in explicit:
                continue  # an index of other shards in the same directory
        indexes.append(index)
    return indexes, skipped
