"""Conditional ranged reads on Google Cloud Storage (``gs://``, gcsfs) and Azure
Blob Storage (``az://``, ``abfs://``, adlfs): one request per read, checked
against the object's identity as indexed, for :class:`shardcat.sources.remote.RemoteSource`.

**GCS**: the identity is the object's *generation* (a new upload is a new
generation; the ETag of the JSON API may stay the same for identical bytes). A
read is ``GET .../o/<object>?alt=media&ifGenerationMatch=<generation>`` with a
``Range`` header: GCS answers 412 for another generation and 404 for a deleted
object, and names the generation it served in ``x-goog-generation``. A server
that names none (an emulator) leaves the read *unproven*: the caller then asks
for the object's generation (:func:`gcs_generation`, one metadata request) rather
than trust the bytes.

**Azure**: the identity is the blob's ETag; a read is ``download_blob(offset,
length, etag=..., match_condition=IfNotModified)`` (``If-Match``): 412 for a
changed blob (``ResourceModifiedError``; Azurite answers it for a deleted blob too,
which one more request then tells apart), 404 for a deleted one, and the answer
carries the ETag it served.
"""

from __future__ import annotations

from typing import Any


class Changed(Exception):
    """The store answered 412 (the precondition failed) or another identity than indexed."""


def handles(protocol: str, fs: Any) -> bool:
    """Whether ``fs`` (of ``protocol``) reads through this module."""
    if protocol in ("gs", "gcs"):
        return hasattr(fs, "_call") and hasattr(fs, "url")
    if protocol in ("az", "abfs", "abfss"):
        return hasattr(fs, "service_client") and hasattr(fs, "split_path")
    return False


def cloud_get(
    protocol: str, fs: Any, url: str, start: int, end: int, expect: str | None
) -> tuple[bytes, bool]:
    """Bytes ``start:end`` of the object in one request, conditional on ``expect``
    (the GCS generation or the Azure ETag indexed; None: unconditional); and
    whether the answer proved it came from that version."""
    import fsspec.asyn

    go = _gcs if protocol in ("gs", "gcs") else _azure
    return fsspec.asyn.sync(fs.loop, go, fs, url, start, end, expect)  # type: ignore[no-any-return]


async def _gcs(
    fs: Any, url: str, start: int, end: int, generation: str | None
) -> tuple[bytes, bool]:
    params = {} if generation is None else {"ifGenerationMatch": generation}
    try:
        headers, data = await fs._call(
            "GET", fs.url(url), headers={"Range": f"bytes={start}-{end - 1}"}, **params
        )
    except FileExistsError:  # gcsfs's name for a 412 answer
        raise Changed("412 Precondition Failed") from None
    served = headers.get("x-goog-generation")
    if generation is not None and served is not None and served != generation:
        raise Changed(f"generation {served} served")
    return data, generation is None or served is not None


def gcs_generation(fs: Any, url: str) -> str:
    """The object's generation now, in one metadata request (gcsfs's ``info`` also
    lists the name as a folder); FileNotFoundError if it does not exist."""
    bucket, key, _ = fs.split_path(url)
    meta = fs.call("GET", "b/{}/o/{}", bucket, key, json_out=True)
    return str(meta["generation"])


async def _azure(fs: Any, url: str, start: int, end: int, etag: str | None) -> tuple[bytes, bool]:
    from azure.core import MatchConditions
    from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError

    container, blob, version_id = fs.split_path(url)
    condition: dict[str, Any] = {}
    if etag is not None:
        condition = {"etag": etag, "match_condition": MatchConditions.IfNotModified}
    try:
        async with fs.service_client.get_blob_client(container=container, blob=blob) as client:
            stream = await client.download_blob(
                offset=start, length=end - start, version_id=version_id, **condition
            )
            data = await stream.readall()
    except ResourceModifiedError:  # 412: changed, or (Azurite) deleted: ask which
        async with fs.service_client.get_blob_client(container=container, blob=blob) as client:
            if not await client.exists(version_id=version_id):
                raise FileNotFoundError(url) from None
        raise Changed("412 Precondition Failed") from None
    except ResourceNotFoundError:
        raise FileNotFoundError(url) from None
    served = stream.properties.etag
    if etag is not None and served is not None and served != etag:
        raise Changed(f"ETag {served} served")
    return data, True  # Azure honours If-Match
