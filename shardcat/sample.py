"""Small generated TFRecord shards for demos, docs and tests."""

from __future__ import annotations

import os
import random
from pathlib import Path

from shardcat.readers.tfrecord import TFRecordWriter, make_example

__all__ = ["make_sample"]

# The smallest valid JPEG prefix/suffix around random bytes: enough for
# `catalog get` to recognise the image type by its magic number.
_JPEG_HEAD = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
_JPEG_TAIL = b"\xff\xd9"


def make_sample(
    directory: str | os.PathLike[str],
    *,
    shards: int = 4,
    records: int = 1000,
    image_bytes: int = 1024,
    seed: int = 0,
) -> list[str]:
    """Write ``shards`` TFRecord files holding ``records`` records in all.

    Each record has ``key`` (``rec_000000042``), ``label`` (int64, 0..9),
    ``score`` (float), ``caption`` (short text) and ``image`` (JPEG-marked
    bytes). Returns the shard paths. Deterministic for a given ``seed``.
    """
    if shards < 1 or records < 0:
        raise ValueError("need at least one shard and a non-negative record count")
    rng = random.Random(seed)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    per_shard = -(-records // shards) if records else 0
    for s in range(shards):
        path = out / f"train-{s:05d}-of-{shards:05d}.tfrecord"
        with TFRecordWriter(path) as writer:
            for i in range(s * per_shard, min(records, (s + 1) * per_shard)):
                body = rng.randbytes(max(0, image_bytes - len(_JPEG_HEAD) - len(_JPEG_TAIL)))
                writer.write(
                    make_example(
                        {
                            "key": f"rec_{i:09d}",
                            "label": rng.randrange(10),
                            "score": round(rng.random(), 3),
                            "caption": f"sample {i}",
                            "image": _JPEG_HEAD + body + _JPEG_TAIL,
                        }
                    )
                )
        paths.append(str(path))
    return paths
