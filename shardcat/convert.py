"""tar archives -> TFRecord files (``catalog convert``), as tfd-utils' ``tfd convert``.

One TFRecord per source archive, named after it (``shard-0001.tar`` or
``shard-0001.tar.gz`` -> ``shard-0001.tfrecord``), in ``output_dir`` or beside
the archive. Each sample becomes one ``tf.train.Example`` with a ``key``
bytes feature (the sample's key) and one bytes feature per member, named
after its feature (extension). Keys follow the tar grouping rule, ``tfd`` by
default as tfd-utils does. The files can be ingested at once
(``catalog ingest out/*.tfrecord``, key feature ``key``).

Differences from tfd-utils, on purpose: samples are streamed (tfd-utils
holds a whole archive in memory); a key that comes back later in the
archive, or a member whose feature is ``key``, is an error instead of a
silent merge or overwrite; the output is written to a temporary file, read
back and compared (every CRC, the keys in order, each payload's length)
before it is renamed into place, and only then is the source deleted when
``delete`` is asked for.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardcat.catalog.processes import (
    end_with_parent,
    stopping_on_signals,
    worker_start_method,
)
from shardcat.errors import CatalogError, CorruptRecordError, DuplicateKeyError, ShardcatError
from shardcat.formats import tar as tar_format
from shardcat.formats import tfrecord
from shardcat.formats.registry import detect_format
from shardcat.formats.tar import TarFormat
from shardcat.formats.tfrecord import TFRecordFormat
from shardcat.paths import PathsLike, resolve_paths
from shardcat.sources import remote, remote_file

__all__ = ["ConvertResult", "convert_tar", "convert_tars", "output_path", "tar_inputs"]


@dataclass(frozen=True)
class ConvertResult:
    """One archive's conversion: records written, whether the source was deleted,
    or the error that stopped it (nothing is left at ``output`` then)."""

    source: str
    output: str
    records: int = 0
    deleted: bool = False
    error: str | None = None


def tar_inputs(spec: PathsLike, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The archives named by a file, a directory (its tar archives, detected by
    content) or a glob, or a list of them; sorted and absolute. URLs
    (``s3://bucket/train/*.tar``) are listed through fsspec with
    ``storage_options``; remote archives are told by their name alone."""
    files = resolve_paths(spec, dict(storage_options or {}))
    return [
        p
        for p in files
        if _name(p).endswith(TarFormat.EXTENSIONS) or (not remote.is_url(p) and _is_tar(p))
    ]


def _name(source: str) -> str:
    """The file name of ``source``; of a URL, without its query (a presigned URL's)."""
    if remote.is_url(source):
        source = source.split("?", 1)[0]
    return source.rsplit("/", 1)[-1]


def _is_tar(path: str) -> bool:
    """Whether the content says tar (read only when the name does not)."""
    try:
        return detect_format(path) == "tar"
    except (CatalogError, OSError):
        return False


def output_path(source: str, output_dir: str | os.PathLike[str] | None = None) -> str:
    """``<archive name without its tar extension>.tfrecord`` in ``output_dir``
    (default: beside the archive)."""
    name = _name(source)
    for ext in sorted(TarFormat.EXTENSIONS, key=len, reverse=True):
        if name.endswith(ext) and len(name) > len(ext):
            name = name[: -len(ext)]
            break
    if output_dir is None and remote.is_url(source):
        raise CatalogError(f"{source} is remote: give a local --output-dir for its TFRecord")
    directory = os.fspath(output_dir) if output_dir is not None else os.path.dirname(source)
    return os.path.join(directory, name + ".tfrecord")


@contextlib.contextmanager
def _readable(source: str, storage_options: Mapping[str, Any] | None) -> Iterator[str]:
    """A local file holding ``source``: itself, or for a URL the object streamed
    once (large sequential reads) into a temporary file deleted on exit."""
    if not remote.is_url(source):
        yield source
        return
    with remote_file.downloaded(source, storage_options) as (tmp, _):
        yield tmp


def convert_tar(
    source: str,
    output: str,
    *,
    grouping: str = "tfd",
    storage_options: Mapping[str, Any] | None = None,
) -> int:
    """Write the samples of one archive to the TFRecord ``output``; returns their
    number. The file appears at ``output`` only once it has been read back and
    checked; on any error nothing is left there. A remote ``source`` (a URL) is
    read once, whole, with ``storage_options``."""
    with _readable(source, storage_options) as local:
        return _convert_local(local, source, output, grouping)


def _convert_local(local: str, source: str, output: str, grouping: str) -> int:
    partial = f"{output}.partial-{os.getpid()}"
    written: list[tuple[str, int]] = []
    seen: dict[str, int] = {}
    try:
        with tfrecord.TFRecordWriter(partial) as writer:
            for key, members in tar_format.iter_samples(local, grouping):
                if "key" in members:
                    raise CatalogError(
                        f"{source}: sample {key!r} has a member with feature 'key', which "
                        "would overwrite the key feature"
                    )
                if key in seen:
                    raise DuplicateKeyError(
                        f"{source}: key {key!r} comes back as sample {len(written)} after "
                        f"sample {seen[key]}: samples must be contiguous members"
                    )
                seen[key] = len(written)
                payload = tfrecord.make_example({"key": key, **members}).SerializeToString()
                writer.write(payload)
                written.append((key, len(payload)))
        _fsync(partial)
        _check_written(partial, written)
        os.replace(partial, output)
    except BaseException:
        if os.path.exists(partial):
            os.remove(partial)
        raise
    return len(written)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_written(path: str, written: Sequence[tuple[str, int]]) -> None:
    """Read the TFRecord back: every CRC, the keys in order and the payload lengths."""
    read_back = [
        (e.key, e.length) for e in TFRecordFormat().scan(path, {"key": "key", "fields": False})
    ]
    if read_back != list(written):
        first = next(
            (i for i, (a, b) in enumerate(zip(read_back, written, strict=False)) if a != b),
            min(len(read_back), len(written)),
        )
        raise CorruptRecordError(
            path,
            0,
            f"read back {len(read_back)} records, wrote {len(written)}; "
            f"they differ from record {first} on",
        )


_Job = tuple[str, str, bool, str, Mapping[str, Any] | None]


def _start_worker(parent: int, environment: dict[str, str]) -> None:
    """A pool worker's start: this process's environment as it is now (a worker a
    fork server started has the server's: credentials set since would be missing),
    and an end with its parent."""
    os.environ.clear()
    os.environ.update(environment)
    end_with_parent(parent)


def _convert_one(job: _Job) -> ConvertResult:
    source, output, delete, grouping, storage_options = job
    try:
        n = convert_tar(source, output, grouping=grouping, storage_options=storage_options)
    except (ShardcatError, OSError) as exc:
        message = str(exc)
        if isinstance(exc, OSError) and not isinstance(exc, ShardcatError):
            message = f"{exc.filename or source}: {exc.strerror or exc}"
        return ConvertResult(source, output, error=message)
    deleted = False
    if delete:
        os.remove(source)
        deleted = True
    return ConvertResult(source, output, n, deleted)


def convert_tars(
    sources: Sequence[str],
    output_dir: str | os.PathLike[str] | None = None,
    *,
    delete: bool = False,
    workers: int = 1,
    grouping: str = "tfd",
    progress: Callable[[ConvertResult, int], None] | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> list[ConvertResult]:
    """Convert each archive to a TFRecord (see :func:`convert_tar`); ``workers``
    processes convert archives in parallel; ``progress(result, total archives)``
    after each one. A failed archive is reported in its
    result and the others go on; with ``delete``, a source is removed only
    after its TFRecord was written and verified (never a remote one: refused).
    Remote sources (URLs) are read with ``storage_options``."""
    tar_format.check_grouping(grouping)
    far = [s for s in sources if remote.is_url(s)]
    if delete and far:
        raise CatalogError(f"--delete removes local archives only, not {far[0]}")
    if output_dir is not None:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
    jobs: list[_Job] = [
        (s, output_path(s, output_dir), delete, grouping, storage_options) for s in sources
    ]
    outputs = [j[1] for j in jobs]
    if len(set(outputs)) != len(outputs):
        dup = next(o for o in outputs if outputs.count(o) > 1)
        raise CatalogError(f"two archives would both be converted to {dup}")
    results: list[ConvertResult] = []
    if workers > 1 and len(jobs) > 1:
        with (
            stopping_on_signals(),  # SIGTERM/SIGHUP stop the workers (and their children)
            multiprocessing.get_context(worker_start_method()).Pool(
                min(workers, len(jobs)),
                initializer=_start_worker,
                initargs=(os.getpid(), dict(os.environ)),
            ) as pool,
        ):
            for result in pool.imap(_convert_one, jobs):
                results.append(result)
                if progress is not None:
                    progress(result, len(jobs))
    else:
        for job in jobs:
            result = _convert_one(job)
            results.append(result)
            if progress is not None:
                progress(result, len(jobs))
    return results
