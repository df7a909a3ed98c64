"""Small generated shards (TFRecord, tar or RecordIO) for demos, docs and tests."""

from __future__ import annotations

import io
import json
import os
import random
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from shardcat.formats.recordio import IRHeader, RecordIOWriter, pack
from shardcat.formats.tfrecord import TFRecordWriter, make_example

__all__ = ["SAMPLE_FORMATS", "make_sample"]

SAMPLE_FORMATS = ("tfrecord", "tar", "recordio")
_EXTENSIONS = {"tfrecord": "tfrecord", "tar": "tar", "recordio": "rec"}

# The smallest valid JPEG prefix/suffix around random bytes: enough for
# `catalog get` to recognise the image type by its magic number.
_JPEG_HEAD = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
_JPEG_TAIL = b"\xff\xd9"
# tar members get this mtime, so the same call writes the same bytes.
_TAR_MTIME = 1_700_000_000


def _records(
    rng: random.Random, first: int, end: int, image_bytes: int
) -> Iterator[dict[str, Any]]:
    """The generated records ``first..end-1`` (drawn in order from ``rng``)."""
    for i in range(first, end):
        body = rng.randbytes(max(0, image_bytes - len(_JPEG_HEAD) - len(_JPEG_TAIL)))
        yield {
            "i": i,
            "key": f"rec_{i:09d}",
            "label": rng.randrange(10),
            "score": round(rng.random(), 3),
            "caption": f"sample {i}",
            "image": _JPEG_HEAD + body + _JPEG_TAIL,
        }


def _write_tfrecord(path: Path, records: Iterator[dict[str, Any]]) -> None:
    with TFRecordWriter(path) as writer:
        for r in records:
            fields = {name: r[name] for name in ("key", "label", "score", "caption", "image")}
            writer.write(make_example(fields))


def _write_tar(path: Path, records: Iterator[dict[str, Any]]) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as archive:
        for r in records:
            members = {
                "jpg": r["image"],
                "cls": str(r["label"]).encode(),
                "json": json.dumps({"score": r["score"], "caption": r["caption"]}).encode(),
            }
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{r['key']}.{ext}")
                info.size, info.mtime, info.mode = len(data), _TAR_MTIME, 0o644
                archive.addfile(info, io.BytesIO(data))


def _write_recordio(path: Path, records: Iterator[dict[str, Any]]) -> None:
    with RecordIOWriter(path) as writer:
        for r in records:
            header = IRHeader(0, float(r["label"]), r["i"], 0)
            writer.write(pack(header, r["image"]), key=r["i"])


_WRITERS = {"tfrecord": _write_tfrecord, "tar": _write_tar, "recordio": _write_recordio}


def make_sample(
    directory: str | os.PathLike[str],
    *,
    shards: int = 4,
    records: int = 1000,
    image_bytes: int = 1024,
    seed: int = 0,
    format: str = "tfrecord",
    progress: Callable[[int], None] | None = None,
) -> list[str]:
    """Write ``shards`` files of ``format`` holding ``records`` records in all.

    Each record has a key (``rec_000000042``), a label (0..9), a score, a
    caption (``sample 42``) and a JPEG-marked image of ``image_bytes`` bytes:

    - ``tfrecord``: ``train-00000-of-00004.tfrecord``, Examples with features
      ``key``, ``label`` (int64), ``score`` (float), ``caption``, ``image``;
    - ``tar``: ``train-00000-of-00004.tar``, WebDataset samples
      ``rec_000000042.jpg``, ``.cls`` (the label) and ``.json`` (score and caption);
    - ``recordio``: ``train-00000-of-00004.rec`` with an MXNet ``.idx`` beside it
      (keys ``0``..``n-1`` over all shards); each payload is
      ``pack(IRHeader(0, label, i, 0), image)``.

    Returns the shard paths. Deterministic for a given ``seed``.
    ``progress(records_written)`` is called every 1,000 records and at the end.
    """
    if shards < 1 or records < 0:
        raise ValueError("need at least one shard and a non-negative record count")
    if format not in _WRITERS:
        raise ValueError(f"format must be one of {', '.join(SAMPLE_FORMATS)}, not {format!r}")
    rng = random.Random(seed)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    per_shard = -(-records // shards) if records else 0
    for s in range(shards):
        path = out / f"train-{s:05d}-of-{shards:05d}.{_EXTENSIONS[format]}"
        first = s * per_shard
        made = _records(rng, first, min(records, first + per_shard), image_bytes)
        _WRITERS[format](path, made if progress is None else _counted(made, progress))
        paths.append(str(path))
    if progress is not None:
        progress(records)
    return paths


def _counted(made: Iterator[dict[str, Any]], progress: Callable[[int], None]) -> Iterator[Any]:
    for record in made:
        yield record
        if (record["i"] + 1) % 1000 == 0:
            progress(record["i"] + 1)
