"""tf.train.Feature and Example builders shared by the TFRecord test modules."""

from __future__ import annotations

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
