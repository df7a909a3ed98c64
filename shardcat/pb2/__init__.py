"""TensorFlow's ``Example`` protos, built at import time in a private descriptor pool.

The wire format is identical to ``tensorflow/core/example/{feature,example}.proto``,
so bytes written by TensorFlow parse here and the other way round. The messages
live under the proto package ``shardcat.tfexample`` in a pool of their own: they
never clash with TensorFlow's (or tfd-utils') classes in the same process, and
because no ``protoc``-generated code is involved there is no generated-code
version check — the module works on every protobuf runtime from 5.x on.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = [
    "BytesList",
    "Example",
    "Feature",
    "FeatureList",
    "FeatureLists",
    "Features",
    "FloatList",
    "Int64List",
    "SequenceExample",
]

_PACKAGE = "shardcat.tfexample"
_F = descriptor_pb2.FieldDescriptorProto


def _field(
    msg: descriptor_pb2.DescriptorProto,
    name: str,
    number: int,
    ftype: int,
    *,
    repeated: bool = False,
    type_name: str | None = None,
    oneof: int | None = None,
    packed: bool = False,
) -> None:
    f = msg.field.add(name=name, number=number, type=ftype)
    f.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
    if type_name:
        f.type_name = f".{_PACKAGE}.{type_name}"
    if oneof is not None:
        f.oneof_index = oneof
    if packed:
        f.options.packed = True


def _map(file: descriptor_pb2.FileDescriptorProto, owner: str, field: str, value_type: str) -> None:
    msg = file.message_type.add(name=owner)
    entry_name = "".join(part.capitalize() for part in field.split("_")) + "Entry"
    entry = msg.nested_type.add(name=entry_name)
    entry.options.map_entry = True
    _field(entry, "key", 1, _F.TYPE_STRING)
    _field(entry, "value", 2, _F.TYPE_MESSAGE, type_name=value_type)
    _field(msg, field, 1, _F.TYPE_MESSAGE, repeated=True, type_name=f"{owner}.{entry_name}")


def _file() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(
        name="shardcat/pb2/example.proto", package=_PACKAGE, syntax="proto3"
    )
    _field(file.message_type.add(name="BytesList"), "value", 1, _F.TYPE_BYTES, repeated=True)
    _field(
        file.message_type.add(name="FloatList"),
        "value",
        1,
        _F.TYPE_FLOAT,
        repeated=True,
        packed=True,
    )
    _field(
        file.message_type.add(name="Int64List"),
        "value",
        1,
        _F.TYPE_INT64,
        repeated=True,
        packed=True,
    )
    feature = file.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, (name, type_name) in enumerate(
        [("bytes_list", "BytesList"), ("float_list", "FloatList"), ("int64_list", "Int64List")],
        start=1,
    ):
        _field(feature, name, number, _F.TYPE_MESSAGE, type_name=type_name, oneof=0)
    _map(file, "Features", "feature", "Feature")
    _field(
        file.message_type.add(name="FeatureList"),
        "feature",
        1,
        _F.TYPE_MESSAGE,
        repeated=True,
        type_name="Feature",
    )
    _map(file, "FeatureLists", "feature_list", "FeatureList")
    _field(
        file.message_type.add(name="Example"), "features", 1, _F.TYPE_MESSAGE, type_name="Features"
    )
    seq = file.message_type.add(name="SequenceExample")
    _field(seq, "context", 1, _F.TYPE_MESSAGE, type_name="Features")
    _field(seq, "feature_lists", 2, _F.TYPE_MESSAGE, type_name="FeatureLists")
    return file


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())


def _cls(name: str) -> Any:
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PACKAGE}.{name}"))


BytesList = _cls("BytesList")
FloatList = _cls("FloatList")
Int64List = _cls("Int64List")
Feature = _cls("Feature")
Features = _cls("Features")
FeatureList = _cls("FeatureList")
FeatureLists = _cls("FeatureLists")
Example = _cls("Example")
SequenceExample = _cls("SequenceExample")
