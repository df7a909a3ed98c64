"""The drop-ins for tfd-utils (and MXNet) users: readers opened on shard paths.

``TFRecordRandomAccess(paths)`` (= :class:`TFRecordReader`), :class:`TarReader`
(= ``TarRandomAccess``) and :class:`RecordIOReader` take what tfd-utils' readers
take: a path, a glob or a list of them. They find the catalog (``index_file``,
else ``$SHARDCAT_CATALOG``, else ``shardcat.sqlite`` beside the shards), index
new or changed shards unless ``readonly``, and read the dataset of those files
with their own rule (key feature, tar grouping), creating one when another
rule reads them already (:mod:`shardcat.catalog.reuse`). A tfd-utils pickle
given as ``index_file`` is imported once into a catalog beside it
(:mod:`shardcat.migrations.legacy`). They keep the last record of a duplicate key (in
shard path order, as tfd-utils' dict does when it indexes the files in sorted
order) and say so once: one warning when the open that indexed them dropped
some, and ``get_stats()["duplicates_dropped"]``.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from shardcat.catalog.engine import locate
from shardcat.catalog.handle import ReadHandle
from shardcat.errors import CatalogError, ShardcatWarning
from shardcat.facade.catalog import Catalog, discard_if_empty, rebuild
from shardcat.facade.legacy_index import catalog_for_legacy_index
from shardcat.facade.options import IngestOptions
from shardcat.formats.registry import get_format
from shardcat.paths import PathsLike, names_as_given, resolve_paths
from shardcat.readers.reader import Reader

__all__ = [
    "RecordIOReader",
    "TFRecordRandomAccess",
    "TFRecordReader",
    "TarRandomAccess",
    "TarReader",
    "catalog_beside",
    "index_shards",
]


def catalog_beside(files: Sequence[str], index_file: str | os.PathLike[str] | None = None) -> Path:
    """The catalog the readers opened on shard ``files`` use: ``index_file``, else
    ``$SHARDCAT_CATALOG``, else ``shardcat.sqlite`` beside the shards (in the
    per-user cache when their directory is not writable; remote shards: the
    working directory). See :func:`shardcat.catalog.engine.locate`."""
    shard_dir = (
        os.getcwd()
        if any("://" in f for f in files)
        else os.path.commonpath([str(Path(f).parent) for f in files])
    )
    return locate(index_file, shard_dir)


def index_shards(paths: PathsLike) -> tuple[Catalog, Reader] | None:
    """``catalog list/get/extract/stats`` on shard files (``tfd list FILE``): the
    files ``paths`` names indexed (only new or changed ones) into the catalog the
    readers opened on them use (:func:`catalog_beside`), as ``catalog ingest`` does
    (format and rule detected); the catalog and the dataset's reader, both for the
    caller to close. None when ``paths`` names no file."""
    files = resolve_paths(paths)
    if not files:
        return None
    with _catalog_at(catalog_beside(files), readonly=False) as catalog:
        return catalog, catalog.ingest_with(paths, None, IngestOptions())


@contextlib.contextmanager
def _catalog_at(where: Path, readonly: bool) -> Iterator[Catalog]:
    """The catalog at ``where``, closed when the block fails, and then removed when
    this open created it and no dataset went into it (a failed first ingest leaves
    no catalog beside the shards). Left open when the block succeeds."""
    new = not where.exists()
    catalog = Catalog(where, readonly=readonly)
    try:
        yield catalog
    except BaseException:
        catalog.close()
        if new:
            discard_if_empty(where)
        raise


class _PathReader(Reader):
    """A reader opened on shard paths (see the module docstring)."""

    files: list[str]

    def _open_paths(
        self,
        paths: PathsLike,
        opts: IngestOptions,
        *,
        index_file: str | os.PathLike[str] | None,
        dataset: str | None,
        readonly: bool,
        verify: bool,
        file_pool_size: int,
    ) -> None:
        """What every path-taking reader does: find the catalog (location rule),
        index new or changed shards unless ``readonly``, name the dataset, open it.
        ``opts.format`` names the reader's format."""
        format = str(opts.format)
        files = resolve_paths(paths)
        if not files:
            raise CatalogError(f"No {get_format(format).TITLE} files found for path: {paths}")
        if index_file is not None:  # a tfd-utils pickle: imported once into a catalog beside it
            index_file = catalog_for_legacy_index(index_file, paths, opts, readonly=readonly)
        dropped = 0
        with _catalog_at(catalog_beside(files, index_file), readonly) as catalog:
            if readonly:
                name = dataset or catalog.find_dataset(paths, format=format, options=opts.options)
            else:
                with catalog.ingest_with(paths, dataset, opts) as indexed:
                    name, dropped = indexed.dataset, indexed.indexed_duplicates
            if name is None:
                raise CatalogError(
                    f"{catalog.path} has no dataset for {paths!r}; index it first "
                    "(catalog ingest) or open without readonly=True"
                )
            Reader.__init__(
                self,
                ReadHandle(catalog.store, owned=True),
                name,
                verify=verify,
                file_pool_size=file_pool_size,
                reindex=rebuild,
            )
        self.files = files
        self.names_as_given = names_as_given(paths)
        if dropped:
            warnings.warn(
                f"{dropped} duplicate record{'s' if dropped > 1 else ''} in dataset "
                f"{self.dataset!r}: as tfd-utils, the reader keeps the last one of each key "
                "(in shard path order); get_stats()['duplicates_dropped'] counts them",
                ShardcatWarning,
                stacklevel=3,
            )


class TFRecordReader(_PathReader):
    """tfd-utils' ``TFRecordRandomAccess``, backed by the catalog.

    Takes a path, a glob or a list of them. The shards are indexed into the
    catalog on first use (``index_file`` is the catalog file; by default
    ``$SHARDCAT_CATALOG`` or ``shardcat.sqlite`` beside the shards) and only
    changed shards are re-indexed later. ``max_workers`` bounds the indexing
    processes. ``progress_interval``, ``use_pread`` and
    ``eager_open_workers`` are accepted for compatibility: reads always use
    ``os.pread``. ``index`` is tfd-utils' ``{key: {file, offset, length}}``
    as a read-only view of the catalog. Files indexed already under another
    key feature get a dataset of their own (``<name>_by_<feature>``). A key
    that several records share keeps the last one, as tfd-utils does (a
    warning says how many were dropped; ``get_stats()["duplicates_dropped"]``).
    New: ``dataset`` names the dataset, ``key_by_position`` keys records
    ``"0".."n-1"``, ``on_duplicate`` (``"last"``, ``"first"`` or ``"error"``),
    ``verify=False`` trusts the bytes (reads are checked by default; see
    :class:`~shardcat.readers.reader.Reader`; ``verify_crc`` is its older
    name), ``readonly`` never writes the catalog (it must be indexed already).
    """

    def __init__(
        self,
        tfrecord_path: PathsLike,
        key_feature_name: str = "key",
        index_file: str | os.PathLike[str] | None = None,
        progress_interval: int = 1024,
        max_workers: int | None = None,
        use_multiprocessing: bool = True,
        file_pool_size: int = 100,
        use_pread: bool = False,
        eager_open_workers: int = 64,
        *,
        dataset: str | None = None,
        key_by_position: bool = False,
        on_duplicate: str = "last",
        verify: bool = True,
        verify_crc: bool | None = None,
        readonly: bool = False,
    ) -> None:
        del progress_interval, use_pread, eager_open_workers  # tfd-utils knobs with no effect here
        self.key_feature_name = key_feature_name
        self._open_paths(
            tfrecord_path,
            IngestOptions(
                format="tfrecord",
                options={"key": None if key_by_position else key_feature_name},
                workers=max_workers if use_multiprocessing else 1,
                on_duplicate=on_duplicate,
            ),
            index_file=index_file,
            dataset=dataset,
            readonly=readonly,
            verify=verify if verify_crc is None else verify_crc,
            file_pool_size=file_pool_size,
        )

    @property
    def tfrecord_files(self) -> list[str]:
        return self.files

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.key_feature_name = self.options.get("key") or "key"


class RecordIOReader(_PathReader):
    """MXNet RecordIO shards (``.rec``), backed by the catalog.

    Takes a path, a glob or a list of them; shards are indexed on first use
    as :class:`TFRecordReader` does (``index_file`` is the catalog file).
    ``get_record(key)`` returns the payload exactly as MXNet's
    ``MXIndexedRecordIO.read_idx`` does. Keys come from the ``.idx`` beside
    each ``.rec`` when the first one has it, else they are positions
    ``"0".."n-1"`` (``key_by_position=True`` forces that). ``header``: whether
    payloads start with an ``IRHeader`` (None: detected from the first
    record); its label(s), id and id2 become SQL fields and features.
    """

    def __init__(
        self,
        rec_path: PathsLike,
        index_file: str | os.PathLike[str] | None = None,
        max_workers: int | None = None,
        file_pool_size: int = 100,
        *,
        dataset: str | None = None,
        key_by_position: bool = False,
        header: bool | None = None,
        on_duplicate: str = "error",
        verify: bool = True,
        readonly: bool = False,
    ) -> None:
        options: dict[str, Any] = {"key": None if key_by_position else "key"}
        if header is not None:
            options["header"] = header
        self._open_paths(
            rec_path,
            IngestOptions(
                format="recordio",
                options=options,
                workers=max_workers,
                on_duplicate=on_duplicate,
            ),
            index_file=index_file,
            dataset=dataset,
            readonly=readonly,
            verify=verify,
            file_pool_size=file_pool_size,
        )

    @property
    def rec_files(self) -> list[str]:
        return self.files


class TarReader(_PathReader):
    """tfd-utils' ``TarRandomAccess``, backed by the catalog.

    Takes a ``.tar`` (or ``.tar.gz``/``.tar.bz2``/``.tar.xz``, detected by
    content) path, a glob or a list of them; indexed into the catalog on first
    use as :class:`TFRecordReader` does (``index_file`` is the catalog file).
    Records are samples ``{feature: bytes}``; ``get_feature`` reads only that
    member. ``grouping`` is ``"tfd"`` by default, so keys are tfd-utils' (the
    member path without its last suffix); ``"webdataset"`` splits at the
    first dot of the basename, as WebDataset and ``catalog ingest`` do.
    Archives indexed already with the other grouping get a dataset of their
    own (``<name>_tfd``, ``<name>_webdataset``). ``index`` is tfd-utils'
    ``{key: {feature: {file, member_name, data_offset, size}}}`` as a
    read-only view of the catalog. A stem found in several archives keeps the
    last archive's sample, as tfd-utils does (a warning says how many were
    dropped; ``get_stats()["duplicates_dropped"]``). ``progress_interval``
    and ``use_multiprocessing=False`` (one indexing process) are accepted for
    compatibility. New: ``dataset``, ``key_by_position``, ``on_duplicate``
    (``"last"``, ``"first"`` or ``"error"``), ``verify=False`` (trust the
    bytes: reads are checked by default) and ``readonly``.
    """

    def __init__(
        self,
        tar_path: PathsLike,
        index_file: str | os.PathLike[str] | None = None,
        progress_interval: int = 1024,
        max_workers: int | None = None,
        use_multiprocessing: bool = True,
        file_pool_size: int = 20,
        *,
        dataset: str | None = None,
        grouping: str = "tfd",
        key_by_position: bool = False,
        on_duplicate: str = "last",
        verify: bool = True,
        readonly: bool = False,
    ) -> None:
        del progress_interval  # tfd-utils knob with no effect here
        self._open_paths(
            tar_path,
            IngestOptions(
                format="tar",
                options={"key": None if key_by_position else "key", "grouping": grouping},
                workers=max_workers if use_multiprocessing else 1,
                on_duplicate=on_duplicate,
            ),
            index_file=index_file,
            dataset=dataset,
            readonly=readonly,
            verify=verify,
            file_pool_size=file_pool_size,
        )

    @property
    def tar_files(self) -> list[str]:
        return self.files

    def get_feature_list(self, key: Any, feature_name: str) -> list[Any] | None:
        """``[bytes]`` of one member (only that member is read), or None."""
        value = self.get_feature(key, feature_name)
        return None if value is None else [value]


TFRecordRandomAccess = TFRecordReader
TarRandomAccess = TarReader
