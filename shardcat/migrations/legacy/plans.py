"""Plans: which legacy index becomes which dataset, under which name and source.

**One legacy index = one dataset.** tfd-utils writes one index per reader
call (``TFRecordRandomAccess(glob)``, ``TarRandomAccess(path)``), so each of
its indexes becomes a dataset of its own, holding exactly its shards with its
keys, found again by that same call. MXNet/DALI/vahidk text indexes are
written one per shard by their tools (``im2rec``, ``rec2idx``,
``tfrecord2idx``); those of one shard set make one dataset: same directory,
same kind, and the same shard name once shard numbering is taken off
(``part-00000.rec``, ``part-00001.rec`` -> ``part``; ``train.rec`` and
``val.rec`` are two sets). When two indexes (or sets) cover exactly the same
shards, one dataset is made, from the keyed one (tfd-utils, MXNet) over an
offsets-only one, then the newest file; the other is skipped and listed.
Indexes whose shards merely overlap make a dataset each (a shard may serve
several datasets).

**Names.** A dataset is named after its index: the file name without its
extension and without what tfd-utils adds (``_unified``,
``_unified_tot<N>``; for those, also the first shard's numbering:
``train-00000-of-00004_unified_tot4.index`` -> ``train``), so
``a.tar_index`` -> ``a``, ``train.idx`` -> ``train``. ``all<N>.index`` names
a complete numbered set, so that dataset is named after its shards (their
common name, else their directory), as are sets of text indexes. A name the
catalog already gives another dataset gets ``_2``, ``_3``, ...

**Source.** The dataset's source pattern is the one a reader is most likely
to be opened with: a glob given to migrate that matches exactly the shards,
else ``<directory>/*<extension>`` when it does, else ``<directory>/<common
name prefix up to its last -_.>*<extension>`` (``train-*.tfrecord`` beside
``val-*.tfrecord``), else the list of shard files; so
``TFRecordRandomAccess("/data/shards/*.tfrecord")`` finds the migrated dataset
and opens without re-indexing. (A glob may also match empty files no index
lists: they join the dataset, indexed from their data.)
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from shardcat.catalog import schema
from shardcat.migrations.legacy.index import LegacyIndex, LegacyShard
from shardcat.paths import default_dataset_name, resolve_paths
from shardcat.sources.remote import is_url, listed_info

__all__ = ["Plan", "dataset_name", "make_plans", "source_of"]

# Shard numbering at the end of a name: "-00003", "_00003-of-00016", "7".
_NUMBERING = re.compile(r"[-_.]*\d+(?:[-_.]+of[-_.]+\d+)?$")
_TFD_ADDED = re.compile(r"_unified(?:_tot\d+)?$")
_ALL_N = re.compile(r"^all\d+$")


@dataclass
class Plan:
    """One dataset to make: its indexes (of one kind) and, per shard, the index
    and rows it is imported from."""

    indexes: list[LegacyIndex]
    shards: dict[str, tuple[LegacyIndex, LegacyShard]]
    name: str = ""  # the dataset's name unless the catalog or the caller says otherwise
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

    @property
    def newest(self) -> int:
        return max(i.mtime_ns for i in self.indexes)


def _shard_set(path: str) -> tuple[str, bool]:
    """(name of the shard set a shard belongs to, whether its name is numbered)."""
    stem = Path(path).name.split(".")[0]
    numbered = _NUMBERING.search(stem)
    return (stem, False) if numbered is None else (stem[: numbered.start()], True)


def _slug(base: str) -> str:
    """``base`` as a dataset name ("" when nothing of it is left)."""
    slug = re.sub(r"[^A-Za-z0-9_]+", "_", base).strip("_")
    return slug if not slug or schema.is_dataset_name(slug) else f"d_{slug}"


def dataset_name(plan: Plan) -> str:
    """The name of a plan's dataset, from its index (see the module docs)."""
    index = plan.indexes[0]
    if len(plan.indexes) > 1 or not index.tfd:
        return default_dataset_name(plan.files or index.missing or [index.path])
    base = os.path.basename(index.path)
    for suffix in (".tar_index", ".index"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    else:
        base = os.path.splitext(base)[0]
    if _ALL_N.match(base):
        return default_dataset_name(plan.files or index.missing)
    added = _TFD_ADDED.search(base)
    if added is not None:  # named after the first shard of the set: its numbering goes too
        base = base[: added.start()]
        base = base.removesuffix(".tar")
        numbered = _NUMBERING.search(base)
        if numbered is not None and numbered.start() > 0:
            base = base[: numbered.start()]
    return _slug(base.removesuffix(".tar")) or default_dataset_name(plan.files or [index.path])


def _units(indexes: list[LegacyIndex], skipped: list[tuple[str, str]]) -> list[Plan]:
    """One candidate plan per tfd-utils index and per set of per-shard text indexes."""
    units: list[list[LegacyIndex]] = []
    sets: dict[tuple[str, str, str, bool], list[LegacyIndex]] = {}
    for index in indexes:
        if index.tfd or len(index.shards) != 1 or index.missing:
            units.append([index])
            continue
        only = index.shards[0].path
        key = (os.path.dirname(only), index.kind, *_shard_set(only))
        if key not in sets:
            sets[key] = []
            units.append(sets[key])
        sets[key].append(index)
    plans = []
    for unit in units:
        # within a set, each shard goes to the newest index of it
        ranked = sorted(unit, key=lambda i: (-i.mtime_ns, i.path))
        owner: dict[str, LegacyIndex] = {}
        for index in ranked:
            for shard in index.shards:
                owner.setdefault(shard.path, index)
        plan = Plan([], {})
        for index in ranked:
            mine = [s for s in index.shards if owner[s.path] is index]
            if not mine and index.shards:
                others = sorted({owner[s.path].path for s in index.shards})
                skipped.append((index.path, f"its shards are covered by {', '.join(others)}"))
                continue
            if not mine and not index.missing:
                skipped.append((index.path, "it holds no records"))
                continue
            plan.indexes.append(index)
            plan.shards.update((s.path, (index, s)) for s in mine)
        if plan.indexes:
            plan.indexes.sort(key=lambda i: i.path)
            plans.append(plan)
    return plans


def make_plans(indexes: list[LegacyIndex], skipped: list[tuple[str, str]]) -> list[Plan]:
    """The datasets to make (see the module docs); indexes not used go to ``skipped``."""
    candidates = _units(indexes, skipped)
    # keyed before offsets-only, then the newest file
    ranked = sorted(candidates, key=lambda p: (not p.keyed, -p.newest, p.indexes[0].path))
    kept: set[int] = set()
    by_shards: dict[frozenset[str], Plan] = {}
    for plan in ranked:
        shard_set = frozenset(plan.shards)
        other = by_shards.get(shard_set) if shard_set else None
        if other is not None:
            covering = ", ".join(i.path for i in other.indexes)
            skipped.extend((i.path, f"its shards are covered by {covering}") for i in plan.indexes)
            continue
        if shard_set:
            by_shards[shard_set] = plan
        plan.name = dataset_name(plan)
        kept.add(id(plan))
    return [p for p in candidates if id(p) in kept]


def _size(path: str) -> int | None:
    """A file's size; a remote object's as its listing gave it (None: not listed)."""
    if not is_url(path):
        return os.path.getsize(path)
    info = listed_info(path)
    return None if info is None else info.size


def source_of(files: list[str], given: list[str]) -> tuple[list[str], list[str]]:
    """(source patterns, extra empty files they add) for a shard set; see the module docs."""
    wanted = set(files)
    candidates = [
        p if is_url(p) else os.path.abspath(os.path.expanduser(p))
        for p in given
        if glob.has_magic(p)
    ]
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
        if wanted <= matched and all(_size(f) == 0 for f in extra):
            return [candidate], sorted(extra)
    return sorted(files), []
