"""The one error hierarchy of shardcat.

Every error raised on purpose is a :class:`ShardcatError`. Subclasses also
inherit the matching built-in so callers can keep writing ``except KeyError``
or ``except ValueError``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CatalogError",
    "CorruptRecordError",
    "DuplicateKeyError",
    "Hint",
    "IngestError",
    "KeyNotFoundError",
    "LegacyIndexError",
    "MissingShardError",
    "NetworkFilesystemWarning",
    "NoSuchFeatureError",
    "SamplerError",
    "SamplerStateError",
    "SchemaVersionError",
    "ShardIOError",
    "ShardcatError",
    "ShardcatWarning",
    "StaleShardError",
    "StaleWriterError",
    "StorageBusyError",
    "StorageShapeError",
    "StorageTypeError",
    "StorageValueError",
    "masked",
]

# A URL's password (``scheme://user:password@``), and a query string (of a URL or
# of a bare path, as HTTP clients print the URL they failed on).
_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s/@:'\"]*):[^\s/@'\"]+@")
_QUERY = re.compile(r"(?<=\S)\?[^\s'\")]+")
# A query parameter that carries a secret: presigned S3 (X-Amz-Signature,
# AWSAccessKeyId), GCS (X-Goog-Signature), Azure SAS (sig), WebHDFS (delegation),
# tokens and API keys.
_SECRET = re.compile(
    r"(?i)[?&;][^=&;]*(?:sig|token|credential|secret|password|passwd|key|auth|delegation)"
)


def _query(m: re.Match[str]) -> str:
    query = m.group(0)
    if _SECRET.search(query) is None:
        return query
    return "?..." + query[len(query.rstrip(":,.;")) :]  # the message's punctuation kept


def masked(text: str) -> str:
    """``text`` with the secrets its URLs may carry masked: a password
    (``https://user:***@host/...``) and a query string naming a signature, token,
    key or credential (a presigned URL: ``...shard.tar?...``). A shard URL is
    stored whole (reads need it); every message shows it this way, since
    messages end up in logs."""
    if "?" in text:
        text = _QUERY.sub(_query, text)
    return _PASSWORD.sub(r"\g<head>:***@", text) if "@" in text else text


@dataclass(frozen=True)
class Hint:
    """What to do about an error (or warning), named as data in both spellings:
    ``python`` as the library's arguments and calls say it (``on_duplicate='first'
    or 'last'``), ``cli`` as the ``catalog`` command's options and commands do
    (``--on-duplicate first or last``). A message is its text and its hint joined
    by a space (``lead``: the hint first); the CLI shows the same text with
    :attr:`cli` (:meth:`render`), so rewording a message never changes which option
    the CLI names, and no message text is rewritten."""

    python: str
    cli: str
    lead: bool = False

    @classmethod
    def naming(
        cls, python: str, cli: str, *, before: str = "", after: str = "", lead: bool = False
    ) -> Hint:
        """A hint whose two spellings differ only in the option: ``before`` + the
        option + ``after`` (``Hint.naming("format=", "--format", before="pass ")``)."""
        return cls(before + python + after, before + cli + after, lead)

    def join(self, text: str) -> str:
        """``text`` with this hint, as the library says it."""
        return f"{self.python} {text}" if self.lead else f"{text} {self.python}"

    def render(self, message: str, *, cli: bool = True) -> str:
        """``message`` (made by :meth:`join`, maybe with its paths renamed since) with
        the hint in the CLI's spelling; unchanged if it does not carry this hint."""
        python, shown = masked(self.python), masked(self.cli)  # as the message holds them
        if not cli:
            return message
        if self.lead and message.startswith(python + " "):
            return shown + message[len(python) :]
        if not self.lead and message.endswith(" " + python):
            return message[: len(message) - len(python)] + shown
        return message


# The hints several messages give.
KEEP_ONE = Hint(
    "(use on_duplicate='first' or 'last' to keep one)",
    "(use --on-duplicate first or last to keep one)",
)
MORE_TIME = Hint("pass --timeout/timeout= to allow more", "pass --timeout to allow more")
REPLACE = Hint("(overwrite=True / --force replaces it)", "(--force replaces it)")


def checkpoint_hint(where: object, *, before: str = "", unseen: bool = False) -> Hint:
    """Checkpoint the catalog ``where`` where it is written (``unseen``: first say
    that an immutable open would not see the commits, and to open it read-only)."""
    command = f"`catalog checkpoint -c {where}`"
    python, cli = f"{before}({command}, Catalog.checkpoint())", f"{before}({command})"
    if not unseen:
        return Hint(python, cli)
    said = "would not see them: open it with {} instead, or checkpoint it where it is written"
    return Hint(
        f"so immutable=True {said.format('readonly=True')} {python}",
        f"so --immutable {said.format('--readonly')} {cli}",
    )


def upgrade_hint(where: object) -> Hint:
    """Upgrade the catalog ``where`` (an older schema) before reading it."""
    return Hint(
        "open it once without readonly=True (or run `catalog upgrade`) to upgrade it",
        f"run `catalog upgrade -c {where}` to upgrade it",
    )


class _Masked:
    """Messages (the string arguments) pass through :func:`masked`; ``hint`` (a
    :class:`Hint`, keyword only) is joined to the first one and kept as
    :attr:`hint` for the CLI to render in its own spelling."""

    hint: Hint | None = None

    def __init__(self, *args: Any, hint: Hint | None = None) -> None:
        if hint is not None:
            self.hint = hint
            if args and isinstance(args[0], str):
                args = (hint.join(args[0]), *args[1:])
        super().__init__(*(masked(a) if isinstance(a, str) else a for a in args))

    def cli_message(self) -> str:
        """The message as the ``catalog`` command shows it: its hint in the CLI's spelling."""
        text = str(self)
        return text if self.hint is None else self.hint.render(text)


class ShardcatError(_Masked, Exception):
    """Base class of all errors shardcat raises on purpose. Its message shows URLs
    without their secrets (:func:`masked`); attributes such as ``path`` keep them.
    ``hint``: what to do, in the library's and the CLI's spelling (:class:`Hint`)."""


class CatalogError(ShardcatError, ValueError):
    """The catalog cannot do what was asked (unknown dataset, bad option, bad SQL...)."""


class KeyNotFoundError(ShardcatError, KeyError):
    """A key or position that the dataset does not hold."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class NoSuchFeatureError(CatalogError):
    """The record has no feature of that name; ``available`` lists those it has.
    (With the message alone: rebuilt from it, as torch's DataLoader does.)"""

    def __init__(
        self, key: str, feature: str | None = None, available: list[str] | None = None
    ) -> None:
        self.key, self.feature, self.available = key, feature, available
        if feature is None:
            super().__init__(key)
            return
        super().__init__(
            f"record {key!r} has no feature {feature!r} (it has: {', '.join(available or [])})"
        )


class CorruptRecordError(ShardcatError, ValueError):
    """Bytes on disk that do not match the container format.

    Carries the shard ``path`` and the byte ``offset`` of the bad record. (With the
    message alone, as torch's DataLoader rebuilds a worker's error: neither.)
    ``key``: the key of the catalog's record there, where the caller looked it up
    (``verify`` does), else None.
    """

    path: str | None
    offset: int | None
    key: str | None = None

    def __init__(
        self,
        path: str,
        offset: int | None = None,
        problem: str | None = None,
        *,
        hint: Hint | None = None,
    ) -> None:
        if offset is None and problem is None:
            self.path, self.offset, self.problem = None, None, path
            super().__init__(path, hint=hint)
            return
        self.path, self.offset, self.problem = path, offset, problem or ""
        super().__init__(f"{path}: at byte {offset}: {problem}", hint=hint)


class LegacyIndexError(CorruptRecordError):
    """A legacy index file (tfd-utils pickle, DALI/MXNet/vahidk text index) that
    cannot be read, or that is refused because it is not plain data."""


class DuplicateKeyError(ShardcatError, ValueError):
    """The same key appears twice in one dataset (names both places)."""


class IngestError(ShardcatError, ValueError):
    """Some shards could not be indexed; every other shard was committed.

    ``failures`` lists each failed shard (``path``, ``error``).
    """

    def __init__(self, message: str, failures: list[Any] | None = None) -> None:
        super().__init__(message)
        self.failures = [] if failures is None else failures


class StaleShardError(ShardcatError, RuntimeError):
    """A shard no longer matches what the catalog indexed (it changed on disk, or
    the dataset was re-indexed in a way an open reader cannot follow): re-ingest it,
    or reopen/refresh the reader. ``path`` names the file where there is one."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class MissingShardError(StaleShardError, FileNotFoundError):
    """A shard file the catalog lists does not exist any more."""

    def __init__(self, message: str, path: str | None = None) -> None:
        StaleShardError.__init__(self, message, path)

    def __str__(self) -> str:  # OSError would format (errno, strerror)
        return str(self.args[0]) if self.args else ""


class ShardIOError(ShardcatError, OSError):
    """A shard file could not be opened or read (permissions, I/O error)."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class StaleWriterError(ShardcatError, RuntimeError):
    """Another process committed to a TensorBlob/TensorDB since it was opened for writing."""


class StorageBusyError(ShardcatError, BlockingIOError):
    """A TensorBlob/TensorDB is already open for writing (one writer at a time)."""


class SchemaVersionError(ShardcatError, RuntimeError):
    """The catalog's schema version does not match this library; ``found``: the
    version an older catalog records (None: newer, or not known)."""

    found: int | None = None


class StorageTypeError(ShardcatError, TypeError):
    """TensorBlob/TensorDB got a value of the wrong type: an index, a tensor of the
    wrong dtype, not a tensor (a ``TypeError``, where tensorblob raises one)."""


class StorageValueError(ShardcatError, ValueError):
    """A value TensorBlob/TensorDB cannot take (e.g. extending with another block size)."""


class StorageShapeError(StorageValueError, RuntimeError):
    """A tensor that does not hold whole rows of the storage's shape.

    A ``ValueError``, and a ``RuntimeError`` as torch's ``view`` raises in tensorblob.
    """


class SamplerError(ShardcatError, ValueError):
    """Bad arguments for a sampler (:class:`shardcat.torch.RecordSampler`)."""


class SamplerStateError(SamplerError):
    """A sampler state that does not belong to this sampler: another dataset length,
    seed or shuffle, so loading it would silently continue a different order."""


class ShardcatWarning(_Masked, UserWarning):
    """Base class of the warnings shardcat gives (the CLI prints them as one line)."""


class NetworkFilesystemWarning(ShardcatWarning):
    """A writable SQLite catalog opened on a network filesystem (NFS, CIFS, FUSE,
    Lustre, ...), where SQLite's locks and WAL shared memory are not reliable."""
