"""What a remote ingest reads: before its scans, the format and options of its
shards off a copy of the first shard's head (:func:`head_copy`, :func:`remote_rule`;
``catalog migrate`` reads its options the same way) and a new dataset's options
that only every shard's sidecar tells (:func:`dataset_wide_options`: RecordIO's
``.idx`` keys colliding; of local shards too); then the local copy of each shard it
scans (:func:`local_copy`, with its sidecar: :func:`sidecar_copy`), whose warnings
name the URL (:func:`warnings_naming`); the storage options it keeps and stores
(:func:`storage_options_kept`).

Two capabilities of formats are looked up here (a format has one by defining its
methods, no import of this module needed):

- :class:`RemoteHead`: how many first bytes of a shard its options are read off
  (TFRecord, RecordIO: the first record); without it, :data:`SNIFF_HEAD`;
- :class:`Sidecars`: a file beside each shard that its scan reads (RecordIO's
  MXNet ``.idx``), fetched beside a remote shard's local copy, and the options
  of a new dataset that only all those files tell; without it, none.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from shardcat.catalog.reuse import Rule
from shardcat.errors import MissingShardError
from shardcat.facade.dataset_options import detect_options
from shardcat.facade.options import IngestOptions
from shardcat.formats.base import Format
from shardcat.formats.registry import detect_format, get_format
from shardcat.paths import PathsLike, as_patterns
from shardcat.readers.view import STORAGE_OPTIONS
from shardcat.sources import remote, remote_file
from shardcat.sources.compressed import detect_compression

__all__ = [
    "SNIFF_HEAD",
    "SNIFF_REMOTE",
    "RemoteHead",
    "Sidecars",
    "dataset_wide_options",
    "head_copy",
    "local_copy",
    "remote_rule",
    "sidecar_copy",
    "sidecar_of",
    "storage_options_kept",
    "warnings_naming",
]

#: at most the bytes of a remote shard its format and options are detected from
SNIFF_REMOTE = 4 << 20
#: the first bytes of a remote shard read for its rule (then the rest of its first
#: record, when the format says it is longer: :class:`RemoteHead`)
SNIFF_HEAD = 64 << 10


@runtime_checkable
class RemoteHead(Protocol):
    """How much of a shard's head its options need."""

    def head_needed(self, head: str) -> int | None:
        """How many first bytes of a shard ``detect_options`` reads, told from a
        copy of its first bytes at ``head`` (a remote shard's options are read off
        that many, not a fixed head); None: cannot tell (a compressed stream)."""


@runtime_checkable
class Sidecars(Protocol):
    """A file beside each shard that its scan reads."""

    def sidecar(self, path: str, options: Mapping[str, Any] | None = None) -> str | None:
        """The file beside the shard ``path`` that its scan reads when present
        (RecordIO: the MXNet ``.idx`` holding its keys); None: none, or none a scan
        with ``options`` reads."""

    def dataset_sidecars(self, options: Mapping[str, Any], given: Mapping[str, Any]) -> bool:
        """Whether :meth:`detect_dataset_options` reads every shard's sidecar
        (``options``: the first shard's, ``given``: the caller's)."""

    def detect_dataset_options(
        self,
        files: Sequence[str],
        given: Mapping[str, Any],
        *,
        first: Mapping[str, Any] | None = None,
        sidecars: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Options of a new dataset that only all its shards tell (called once,
        when the dataset is created; ``given``: the options the caller set).
        ``first``: the first shard's options when read already; ``sidecars``:
        name -> local copy of each shard's sidecar that exists, instead of the
        files beside ``files`` (remote shards)."""


def sidecar_of(fmt: Format, path: str, options: Mapping[str, Any] | None = None) -> str | None:
    """The sidecar of the shard ``path`` (:class:`Sidecars`; None: none)."""
    return fmt.sidecar(path, options) if isinstance(fmt, Sidecars) else None


@contextlib.contextmanager
def head_copy(
    url: str, options: Mapping[str, Any] | None, format: str | None, first: int = SNIFF_HEAD
) -> Iterator[tuple[str, str]]:
    """A local copy of the first bytes of the remote shard ``url`` that its format
    (``format``, else detected) and options are read off, and the format's name:
    ``first`` bytes (:data:`SNIFF_HEAD`; a caller that knows where the first record
    ends asks for that), then the rest of the first record when the format says it
    is longer (:data:`SNIFF_REMOTE` at most, or when it cannot tell), in one more
    request. A compressed shard of a format not given: its first
    :data:`SNIFF_REMOTE` bytes (a bz2 block is larger than the head)."""
    with remote_file.downloaded(url, options, first) as (tmp, info):
        need: int | None = None
        if format not in (None, "auto") or detect_compression(tmp) is None:
            name = detect_format(tmp) if format in (None, "auto") else str(format)
            fmt = get_format(name)
            need = fmt.head_needed(tmp) if isinstance(fmt, RemoteHead) else 0
        have = min(first, info.size)
        end = min(SNIFF_REMOTE if need is None else need, SNIFF_REMOTE, info.size)
        if end > have:  # the rest, in one request
            source = remote.RemoteSource(
                url, info.size, info.mtime_ns, info.fingerprint, options, use_cache=False
            )
            try:
                with open(tmp, "ab") as f:
                    f.write(source.fetch(have, end))
            finally:
                source.close()
        yield tmp, detect_format(tmp) if format in (None, "auto") else str(format)


def remote_rule(
    url: str, options: Mapping[str, Any] | None, format: str | None
) -> tuple[str, dict[str, Any]]:
    """The format (``format``, else detected) and the options detected of remote
    shards whose first is ``url``: read off its :func:`head_copy` and, for a format
    with a sidecar (RecordIO's ``.idx``), whether the store has the shard's. That
    is asked (one HEAD, no bytes): the shard's scan downloads it."""
    with head_copy(url, options, format) as (head, name):
        fmt = get_format(name)
        far = sidecar_of(fmt, url)
        has = None if far is None else _exists(far, options)
        return name, detect_options(fmt, head, sidecar=has)


def dataset_wide_options(
    fmt: Format, files: Sequence[str], rule: Rule, options: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The options of a new dataset of ``files`` that only all of them tell
    (:meth:`Sidecars.detect_dataset_options`; ``rule``: read off the first shard;
    {} without the capability). Of remote shards, when the format decides from
    every shard's sidecar (RecordIO: whether the ``.idx`` keys collide), those the
    store has are downloaded first, into a temporary directory; the scans download
    them again (``.idx`` files are small beside their ``.rec``)."""
    if not isinstance(fmt, Sidecars):
        return {}
    if not remote.is_url(files[0]):
        return fmt.detect_dataset_options(files, rule.explicit)
    if not fmt.dataset_sidecars(rule.detected, rule.explicit):
        return {}
    with tempfile.TemporaryDirectory(prefix="shardcat-") as tmp:
        sidecars = {}
        for i, url in enumerate(files):
            far = fmt.sidecar(url)
            if far is None:
                continue
            near = os.path.join(tmp, f"{i}-{far.rsplit('/', 1)[-1][-60:]}")
            try:
                remote_file.download(far, near, options)
            except MissingShardError:
                continue
            sidecars[far] = near
        return fmt.detect_dataset_options(
            files, rule.explicit, first=rule.detected, sidecars=sidecars
        )


def _exists(url: str, options: Mapping[str, Any] | None) -> bool:
    try:
        remote.remote_info(url, options)
    except MissingShardError:
        return False
    return True


@contextlib.contextmanager
def local_copy(
    url: str,
    options: Mapping[str, Any] | None,
    limit: int | None = None,
    fmt: Format | None = None,
    format_options: Mapping[str, Any] | None = None,
) -> Iterator[tuple[str, remote.RemoteInfo]]:
    """The object at ``url`` (its first ``limit`` bytes) streamed into a temporary
    file, deleted on exit; with the identity of the version read. With ``fmt``, the
    shard's sidecar (see :func:`sidecar_copy`) is fetched beside it too, when a
    scan with ``format_options`` reads it."""
    with remote_file.downloaded(url, options, limit) as (tmp, info):
        if fmt is None:
            yield tmp, info
        else:
            with sidecar_copy(url, tmp, fmt, options, format_options):
                yield tmp, info


@contextlib.contextmanager
def sidecar_copy(
    url: str,
    copy: str,
    fmt: Format,
    options: Mapping[str, Any] | None,
    format_options: Mapping[str, Any] | None = None,
) -> Iterator[str | None]:
    """The sidecar of the remote shard ``url`` (:class:`Sidecars`: RecordIO's ``.idx``),
    when the store has one and a scan with ``format_options`` reads it, fetched
    beside ``copy`` (the shard's local copy) under the name the format looks for
    there; deleted on exit. None: no sidecar."""
    far, near = sidecar_of(fmt, url, format_options), sidecar_of(fmt, copy, format_options)
    if far is None or near is None:
        yield None
        return
    try:
        remote_file.download(far, near, options)
    except MissingShardError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(near)
        yield None
        return
    try:
        yield near
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(near)


@contextlib.contextmanager
def warnings_naming(local: str, url: str) -> Iterator[None]:
    """The warnings of a scan of ``local``, the copy of ``url``, naming ``url``."""
    with warnings.catch_warnings(record=True) as caught:
        yield
    for w in caught:
        warnings.warn(str(w.message).replace(local, url), w.category, stacklevel=3)


def storage_options_kept(paths: PathsLike, opts: IngestOptions) -> IngestOptions:
    """The storage options given for URLs are kept by this process (and its workers)
    in full, and stored without secrets: ``opts`` as stored."""
    given = opts.options.get(STORAGE_OPTIONS)
    if not given:
        return opts
    for pattern in as_patterns(paths):
        if remote.is_url(os.fspath(pattern)):
            remote.configure(remote.protocol_of(os.fspath(pattern)), **given)
    return opts.with_(options={**opts.options, STORAGE_OPTIONS: remote.public_options(given)})
