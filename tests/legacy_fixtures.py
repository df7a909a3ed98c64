"""Legacy index files for the migration tests: written by the real tfd-utils 1.3.0
code paths where possible, else by faithful writers of what older tools wrote.

tfd-utils releases and what their indexes look like (read off each wheel's
``random_access.py`` / ``tar_random_access.py``):

- 0.1.0-1.0.0: TFRecord ``<stem>.index`` for one file, ``<first stem>_unified.index``
  for several; 0.1.0-0.2.1 add files in path order, 0.2.2+ as worker processes
  finish (any order);
- 1.2.0-1.3.0: ``<stem>.index``, ``all<N>.index`` for a complete
  ``XXXXX_of_NNNNN.*`` set, else ``<first stem>_unified_tot<N>.index``;
- every release: ``{key: {"file", "offset", "length"}}``, ``file`` the path as
  given (relative when the glob was), ``pickle.dump`` with the running Python's
  default protocol (3 up to Python 3.7, 4 from 3.8, 5 from 3.14);
- tar, 0.4.0-1.3.0 (one unchanged module): ``<stem>.tar_index`` /
  ``<first stem>_unified.tar_index`` with ``{key: {ext: {"file", "member_name",
  "data_offset", "size"}}}``.
"""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import sqlite3
import struct
import tarfile
from pathlib import Path
from typing import Any

from shardcat import Catalog
from shardcat.formats.registry import get_format
from shardcat.formats.tfrecord import TFRecordWriter, make_example

# -- shards ----------------------------------------------------------------------------


def write_tfrecords(
    directory: Path,
    shards: int = 3,
    per_shard: int = 40,
    *,
    names: str = "train-{s:05d}-of-{n:05d}.tfrecord",
    key_feature: str = "key",
    prefix: str = "r",
    start: int = 0,
) -> list[Path]:
    """Shards of Examples with a key (``<prefix><shard>_<i>``), label, score and payload."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(shards):
        path = directory / names.format(s=s, n=shards, last=shards - 1)
        with TFRecordWriter(path) as w:
            for i in range(start, start + per_shard):
                key: Any = f"{prefix}{s}_{i}" if key_feature == "key" else s * 100_000 + i
                w.write(
                    make_example(
                        {
                            key_feature: key,
                            "label": i % 7,
                            "score": i / 8,
                            "payload": bytes([s, i % 256]) * (5 + i % 13),
                        }
                    )
                )
        paths.append(path)
    return paths


def write_tar(path: Path, samples: int = 12, *, tag: str = "s") -> None:
    """A GNU tar with WebDataset-style samples, a long (>100 bytes) member name,
    a directory entry, an extension-less member and a pax header."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for i in range(samples):
            base = f"{'deep/' * 25}{tag}{i}" if i == 3 else f"train/{tag}{i:03d}"
            if i == 5:
                info = tarfile.TarInfo("train/subdir")
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
                readme = b"not a sample"
                info = tarfile.TarInfo("train/README")
                info.size = len(readme)
                tf.addfile(info, io.BytesIO(readme))
            for ext, data in (
                ("jpg", bytes([i % 256]) * (300 + 7 * i)),
                ("cls", str(i % 4).encode()),
                ("json", json.dumps({"w": i, "name": f"n{i}"}).encode()),
            ):
                info = tarfile.TarInfo(f"{base}.{ext}")
                info.size = len(data)
                if i == 7 and ext == "cls":
                    info.pax_headers = {"comment": "pax header before this member"}
                tf.addfile(info, io.BytesIO(data))


# -- tfd-utils -------------------------------------------------------------------------


@contextlib.contextmanager
def quiet_stdout() -> Any:
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def tfd_tfrecord_index(paths: Any, **kwargs: Any) -> Path:
    """Build tfd-utils 1.3.0's index (its own naming, scan and ``_save_index``)."""
    from tfd_utils import TFRecordRandomAccess

    with quiet_stdout():
        reader = TFRecordRandomAccess(
            paths, use_multiprocessing=False, progress_interval=10**9, **kwargs
        )
        reader._build_index()  # what opening does, without the lock file's 1 s settle delay
        reader.close()
    return Path(reader.index_file)


def tfd_tar_index(paths: Any, **kwargs: Any) -> Path:
    """Build tfd-utils 1.3.0's tar index (``.tar_index``)."""
    from tfd_utils import TarRandomAccess

    with quiet_stdout():
        reader = TarRandomAccess(
            paths, use_multiprocessing=False, progress_interval=10**9, **kwargs
        )
        reader._build_index()
        reader.close()
    return Path(reader.index_file)


def old_tfd_tfrecord_index(
    files: list[str],
    *,
    key_feature: str = "key",
    protocol: int = pickle.DEFAULT_PROTOCOL,
    completion_order: bool = False,
) -> Path:
    """What tfd-utils 0.1.0-1.0.0 wrote for ``files`` (paths as given): ``<stem>.index``
    for one file, ``<first stem>_unified.index`` for several. Offsets and lengths
    are those of its scan (frame offset, payload length); ``completion_order``
    adds the files last-first, as 0.2.2+ may when workers finish out of order."""
    fmt = get_format("tfrecord")
    index: dict[str, dict[str, Any]] = {}
    order = list(reversed(files)) if completion_order else files
    for file in order:
        for entry in fmt.scan(file, {"key": key_feature, "fields": False}):
            index[str(entry.key)] = {"file": file, "offset": entry.offset, "length": entry.length}
    first = Path(files[0])
    name = (
        first.with_suffix(".index")
        if len(files) == 1
        else first.parent / (f"{first.stem}_unified.index")
    )
    with open(name, "wb") as f:
        pickle.dump(index, f, protocol=protocol)
    return name


# -- DALI / MXNet / vahidk ---------------------------------------------------------------


def tfrecord2idx(tfrecord: Path, index: Path) -> Path:
    """What DALI's ``tools/tfrecord2idx`` and vahidk/tfrecord's ``tfrecord2idx``
    write: ``<offset> <frame size>`` per record."""
    lines, pos = [], 0
    data = tfrecord.read_bytes()
    while pos < len(data):
        (length,) = struct.unpack_from("<q", data, pos)
        lines.append(f"{pos} {8 + 4 + length + 4}\n")
        pos += 8 + 4 + length + 4
    index.write_text("".join(lines))
    return index


# -- comparing catalogs --------------------------------------------------------------------


def dump(catalog: Path, dataset: str) -> dict[str, Any]:
    """Everything a dataset is in the catalog, but timestamps and claim owners."""
    conn = sqlite3.connect(f"{catalog.resolve().as_uri()}?mode=ro", uri=True)
    try:
        (dataset_id, fmt, key_rule, grouping, options) = conn.execute(
            "SELECT id, format, key_rule, grouping, options FROM shardcat_datasets WHERE name = ?",
            (dataset,),
        ).fetchone()
        shards = conn.execute(
            "SELECT id, path, size, mtime_ns, fingerprint, compression, num_records, "
            "first_position, state, error FROM shardcat_shards WHERE dataset_id = ? ORDER BY path",
            (dataset_id,),
        ).fetchall()
        records = conn.execute(
            'SELECT s.path, r.key, r.ordinal, r."offset", r.length '
            f'FROM "shardcat_records_{int(dataset_id)}" r '
            "JOIN shardcat_shards s ON s.id = r.shard_id ORDER BY s.path, r.ordinal",
        ).fetchall()
        members = conn.execute(
            'SELECT s.path, m.ordinal, m.name, m."offset", m.length FROM shardcat_members m '
            "JOIN shardcat_shards s ON s.id = m.shard_id WHERE s.dataset_id = ? "
            "ORDER BY s.path, m.ordinal, m.name",
            (dataset_id,),
        ).fetchall()
        view = conn.execute(f'SELECT * FROM "{dataset}" ORDER BY position').fetchall()
        fields = conn.execute(
            "SELECT name, column_name, sql_type, idx FROM shardcat_fields WHERE dataset_id "
            "= ? ORDER BY idx",
            (dataset_id,),
        ).fetchall()
        schema = conn.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' "
            "ORDER BY type, name"
        ).fetchall()
    finally:
        conn.close()
    return {
        "format": fmt,
        "key_rule": key_rule,
        "grouping": grouping,
        "fields_option": json.loads(options).get("fields", True),
        "shards": [s[1:] for s in shards],
        "records": records,
        "members": members,
        "view": view,
        "fields": fields,
        "schema": [
            (t, n, sql.replace(f'"{dataset}"', '"D"') if sql else sql) for t, n, sql in schema
        ],
    }


def scratch(paths: Any, catalog: Path, dataset: str, **ingest: Any) -> dict[str, Any]:
    """A fresh catalog with ``paths`` ingested from scratch, dumped."""
    with Catalog(catalog) as cat:
        cat.ingest(paths, dataset, workers=1, **ingest).close()
    return dump(catalog, dataset)


def indexed_at(catalog: Path) -> list[tuple[str, float]]:
    conn = sqlite3.connect(f"{catalog.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT path, indexed_at FROM shardcat_shards ORDER BY path").fetchall()
    finally:
        conn.close()
