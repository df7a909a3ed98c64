"""tf.train.Feature and Example builders shared by the TFRecord test modules, and
the records of a TFRecord shard read without shardcat (:func:`payloads`)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from shardcat.pb2 import BytesList, Example, Feature, Features, FloatList, Int64List


def ex_bytes(**features: Feature) -> bytes:
    """A serialized ``Example`` with these features."""
    return Example(features=Features(feature=features)).SerializeToString()


def b(*values: bytes) -> Feature:
    return Feature(bytes_list=BytesList(value=list(values)))


def i64(*values: int) -> Feature:
    return Feature(int64_list=Int64List(value=list(values)))


def f32(*values: float) -> Feature:
    return Feature(float_list=FloatList(value=list(values)))


def payloads(*paths: str | os.PathLike[str]) -> dict[str, bytes]:
    """Every record of these TFRecord shards by its ``key`` feature: the serialized
    Example as the file holds it (read here with struct alone, not with shardcat)."""
    out = {}
    for path in paths:
        data = Path(path).read_bytes()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack_from("<Q", data, pos)
            raw = data[pos + 12 : pos + 12 + length]
            key = Example.FromString(raw).features.feature["key"].bytes_list.value[0]
            out[key.decode()] = raw
            pos += 12 + length + 4
    return out
