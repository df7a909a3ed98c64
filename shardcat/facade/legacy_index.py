"""``index_file=`` naming a tfd-utils index instead of a catalog.

Every tfd-utils script passes ``index_file=`` (the pickle tfd-utils keeps its
index in); a shardcat reader takes ``index_file`` for its catalog file. When
that file is a tfd-utils pickle, :func:`catalog_for_legacy_index` imports it
(verified, exactly as ``catalog migrate`` does) into a catalog beside it and
returns the catalog's path, which the reader then opens:

- detected by content: a file that starts like a pickled dict (protocol 2-5)
  and holds one of tfd-utils' layouts (loaded with the restricted unpickler; a
  pickle that asks for any class or function is refused with
  :class:`~shardcat.errors.LegacyIndexError` before anything is written). A
  SQLite file, a missing or empty file, or anything else is returned as it
  is (the reader creates or opens a catalog there, as before);
- the catalog is ``<index file>.shardcat.sqlite`` beside it (in the per-user
  cache directory when that directory is not writable and holds none yet);
- the dataset is made of the reader's shards (its glob is the source, so the
  reader finds it): the index's entries for the shards it covers, checked
  against their files, the other files indexed from their data. It records
  the index's size and mtime, so later opens with the same index re-use the
  catalog without reading the index; a rebuilt index is imported again (only
  shards that changed are re-read);
- one warning says what was done.

The index may be on object storage (``index_file="s3://bucket/train/train.index"``,
read through fsspec as the shards are): its first bytes tell whether it is a
tfd-utils pickle (one ranged read), it is downloaded once to be imported, and
its identity is the object's size, Last-Modified and ETag (one HEAD per later
open, nothing downloaded). Its catalog is in the per-user cache directory,
named after its URL (there is no "beside it" on object storage). A missing
object, or one that is no tfd-utils index, is a :class:`CatalogError` naming
the URL; a corrupt pickle a :class:`LegacyIndexError` naming it.

The reader's shards may be on object storage too, the index made over local
copies of them (or stored beside them): a shard it records is the reader's
file of the same name (see :class:`~shardcat.migrations.legacy.index.ReaderFiles`).
"""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path
from typing import Any

from shardcat.catalog.backend import backend_for
from shardcat.catalog.engine import user_cache_dir
from shardcat.errors import CatalogError, MissingShardError, ShardcatError, ShardcatWarning
from shardcat.facade.catalog import Catalog
from shardcat.facade.migrate import migrate_for_reader
from shardcat.facade.options import IngestOptions
from shardcat.migrations.legacy.index import FORMAT_OF, TFD_TAR, TFD_TFRECORD
from shardcat.migrations.legacy.pickles import pickled_dict
from shardcat.migrations.legacy.report import MigrationReport
from shardcat.paths import PathsLike
from shardcat.sources.remote import is_url, remote_info
from shardcat.sources.remote_file import downloaded

__all__ = ["CATALOG_SUFFIX", "catalog_for_legacy_index", "catalog_path_for"]

CATALOG_SUFFIX = ".shardcat.sqlite"
IDENTITY_OPTION = "legacy_index"  # dataset option: the index file it was imported from
_SQLITE_MAGIC = b"SQLite format 3\x00"
_KIND_OF = {FORMAT_OF[TFD_TFRECORD]: TFD_TFRECORD, FORMAT_OF[TFD_TAR]: TFD_TAR}


def catalog_path_for(index_file: str | os.PathLike[str]) -> Path:
    """The catalog a legacy index is imported into: ``<index file>.shardcat.sqlite``
    beside it; in the per-user cache directory (named after the index's path) when
    its directory is not writable and holds none yet."""
    index = Path(index_file).expanduser().absolute()
    beside = index.with_name(index.name + CATALOG_SUFFIX)
    if beside.exists() or os.access(index.parent, os.W_OK | os.X_OK):
        return beside
    digest = hashlib.sha1(str(index).encode()).hexdigest()[:16]
    return user_cache_dir() / f"{index.name}-{digest}{CATALOG_SUFFIX}"


def _remote_catalog_path(url: str) -> Path:
    """The catalog a legacy index at ``url`` is imported into (per-user cache)."""
    digest = hashlib.sha1(url.encode()).hexdigest()[:16]
    return user_cache_dir() / f"{url.rsplit('/', 1)[-1]}-{digest}{CATALOG_SUFFIX}"


def _remote_identity(url: str) -> dict[str, Any]:
    """The identity of the object at ``url`` (one HEAD); :class:`CatalogError` if missing."""
    try:
        info = remote_info(url)
    except MissingShardError:
        raise CatalogError(f"index_file {url} does not exist") from None
    return {"path": url, "size": info.size, "mtime_ns": info.mtime_ns, "etag": info.fingerprint}


def _is_remote_tfd_pickle(url: str, size: int) -> bool:
    """Whether the object at ``url`` starts like a tfd-utils pickle (one ranged read)."""
    with downloaded(url, limit=min(size, 16)) as (head, _):
        return pickled_dict(head)


def _is_tfd_pickle(path: Path) -> bool:
    """Whether the file looks like a tfd-utils pickle (the layout is checked on loading)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_SQLITE_MAGIC))
    except OSError:  # missing, a directory, unreadable: the catalog open says why
        return False
    return head != _SQLITE_MAGIC and pickled_dict(str(path))


def _dataset_options(catalog: Path, shard_paths: PathsLike) -> dict[str, Any] | None:
    """The options of the catalog's dataset for these shards; None when there is none."""
    if not catalog.is_file():
        return None
    try:
        with Catalog(catalog, readonly=True) as cat:
            name = cat.find_dataset(shard_paths)
            return None if name is None else cat.store.stored_options(name)
    except ShardcatError:  # too old to open read-only, or not a catalog: import again
        return None


def _summary(report: MigrationReport) -> str:
    """``"3 shards imported"``, ``"1 shard imported, 3 unchanged"``..."""
    counts = [(k, n) for k, n in report.totals().items() if n and k != "verified"]
    if not counts:
        return "it holds none of the reader's shards"
    (action, n), rest = counts[0], counts[1:]
    return ", ".join([f"{n} shard{'' if n == 1 else 's'} {action}", *(f"{m} {a}" for a, m in rest)])


def catalog_for_legacy_index(
    index_file: str | os.PathLike[str],
    shard_paths: PathsLike,
    opts: IngestOptions,
    *,
    readonly: bool = False,
) -> Path:
    """The catalog file a reader given ``index_file`` should open.

    When ``index_file`` is a tfd-utils pickle, its entries for the reader's
    shards (``shard_paths``: the reader's paths or globs, of ``opts.format``) are
    imported, verified, into ``<index file>.shardcat.sqlite`` (once: while
    the index does not change, later calls only look the dataset up) and that
    path is returned, with one warning saying so. ``opts``: the reader's ingest
    options (``opts.options``: its dataset options, ``key`` the key feature, None
    for position keys, ``grouping`` for tar).
    Anything else (a catalog, a missing file...) comes back unchanged.

    Raises :class:`LegacyIndexError` for a refused or corrupt pickle and
    :class:`CatalogError` when the index holds another format than ``opts.format``
    or, with ``readonly=True``, is not imported yet (nothing is written then).
    """
    named = os.fspath(index_file)
    # on object storage (a URL that names no catalog database)
    remote = is_url(named) and backend_for(named).local_file is not None
    index: Path | str
    if remote:
        index, identity = named, _remote_identity(named)
        catalog = _remote_catalog_path(named)
    else:
        given = Path(index_file).expanduser()
        if not _is_tfd_pickle(given):
            return given
        index = given.absolute()
        st = os.stat(index)
        identity = {"path": str(index), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        catalog = catalog_path_for(index)
    stored = _dataset_options(catalog, shard_paths)
    if stored is not None and (readonly or stored.get(IDENTITY_OPTION) == identity):
        return catalog  # imported already: known by its identity, nothing read
    if remote and not _is_remote_tfd_pickle(named, identity["size"]):
        raise CatalogError(
            f"index_file {named} is not a tfd-utils index; a shardcat catalog is a "
            "local file or a database server URL"
        )
    if readonly:
        raise CatalogError(
            f"index_file {index} is a tfd-utils index, not a shardcat catalog, and a "
            f"read-only reader cannot import it: run `catalog migrate {index} --catalog "
            f"{catalog}` once (or open without readonly=True)"
        )
    format, wanted = str(opts.format), dict(opts.options)
    # tfd-utils' tar keys are its grouping's: other groupings are read from the data
    reindex = format == "tar" and wanted.get("grouping", "tfd") != "tfd"
    report = migrate_for_reader(
        index,
        shard_paths,
        opts.with_(options={**wanted, IDENTITY_OPTION: identity}, fields=True if reindex else None),
        open_catalog=Catalog,
        catalog=catalog,
    )
    how = (
        "indexed from the data: tfd-utils' tar keys are not those of grouping "
        f"{wanted.get('grouping')!r}"
        if reindex
        else "each shard checked against its file"
    )
    failed = (
        "; the reader indexes the failed ones from their data" if report.totals()["failed"] else ""
    )
    warnings.warn(
        f"index_file {index} is a {_KIND_OF[format]}, not a shardcat catalog: imported it "
        f"into {catalog} ({_summary(report)}; {how}{failed}); readers given this index_file "
        "use that catalog from now on",
        ShardcatWarning,
        stacklevel=2,
    )
    return catalog
