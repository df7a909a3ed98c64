"""shardcat.pb2: wire compatibility with TensorFlow's ``example.proto``.

The expected bytes are built by a tiny protobuf encoder written here from the
wire-format spec (varints, tags ``field << 3 | wire_type``, length-delimited
fields), following ``tensorflow/core/example/{feature,example}.proto``:

    BytesList  { repeated bytes value = 1; }
    FloatList  { repeated float value = 1 [packed = true]; }
    Int64List  { repeated int64 value = 1 [packed = true]; }
    Feature    { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                              Int64List int64_list = 3; } }
    Features   { map<string, Feature> feature = 1; }
    FeatureList  { repeated Feature feature = 1; }
    FeatureLists { map<string, FeatureList> feature_list = 1; }
    Example    { Features features = 1; }
    SequenceExample { Features context = 1; FeatureLists feature_lists = 2; }

Only the core install is needed (the Makefile also runs this file against the
newest protobuf runtime).
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap

import pytest
from google.protobuf import descriptor_pool

from shardcat.pb2 import (
    BytesList,
    Example,
    Feature,
    FeatureList,
    FeatureLists,
    Features,
    FloatList,
    Int64List,
    SequenceExample,
)

# -- a minimal protobuf encoder (wire format spec) -----------------------------

VARINT, I64, LEN, I32 = 0, 1, 2, 5


def varint(n: int) -> bytes:
    """Base-128 varint; negative int64 values are their two's complement (10 bytes)."""
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def ld(field: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return tag(field, LEN) + varint(len(payload)) + payload


def enc_bytes_list(values: list[bytes]) -> bytes:
    return b"".join(ld(1, v) for v in values)


def enc_int64_list(values: list[int]) -> bytes:
    return ld(1, b"".join(varint(v) for v in values))  # packed


def enc_float_list(values: list[float]) -> bytes:
    return ld(1, b"".join(struct.pack("<f", v) for v in values))  # packed


def enc_feature(kind: str, values: list) -> bytes:
    if kind == "bytes":
        return ld(1, enc_bytes_list(values))
    if kind == "float":
        return ld(2, enc_float_list(values))
    return ld(3, enc_int64_list(values))


def enc_map_entry(key: str, value: bytes) -> bytes:
    return ld(1, key.encode("utf-8")) + ld(2, value)


def enc_features(features: dict[str, tuple[str, list]]) -> bytes:
    return b"".join(ld(1, enc_map_entry(k, enc_feature(*v))) for k, v in features.items())


def enc_example(features: dict[str, tuple[str, list]]) -> bytes:
    return ld(1, enc_features(features))


# -- the encoder itself --------------------------------------------------------


def test_encoder_varints_follow_the_spec() -> None:
    assert varint(0) == b"\x00"
    assert varint(1) == b"\x01"
    assert varint(150) == b"\x96\x01"  # the spec's own example
    assert varint(300) == b"\xac\x02"
    assert varint(-1) == b"\xff" * 9 + b"\x01"
    assert len(varint(-1)) == 10
    assert len(varint(-(2**63))) == 10
    assert tag(1, LEN) == b"\x0a"
    assert tag(3, LEN) == b"\x1a"


# -- Example wire compatibility ------------------------------------------------

MIXED = {
    "image": ("bytes", [b"\x89PNG\r\n\x1a\n", b""]),
    "label": ("int64", [7, -1, 2**62, -(2**63)]),
    "score": ("float", [0.5, -2.25, 1e-3]),
}


def test_hand_encoded_example_parses_to_the_right_values() -> None:
    raw = enc_example(MIXED)
    ex = Example.FromString(raw)
    feature = ex.features.feature
    assert set(feature) == {"image", "label", "score"}
    assert feature["image"].WhichOneof("kind") == "bytes_list"
    assert list(feature["image"].bytes_list.value) == [b"\x89PNG\r\n\x1a\n", b""]
    assert feature["label"].WhichOneof("kind") == "int64_list"
    assert list(feature["label"].int64_list.value) == [7, -1, 2**62, -(2**63)]
    assert feature["score"].WhichOneof("kind") == "float_list"
    # floats travel as IEEE float32: compare against the float32 rounding
    expected = [struct.unpack("<f", struct.pack("<f", v))[0] for v in (0.5, -2.25, 1e-3)]
    assert list(feature["score"].float_list.value) == expected
    assert feature["score"].float_list.value[2] != 1e-3  # really float32


def test_built_example_serializes_to_what_parses_back_equal() -> None:
    built = Example(
        features=Features(
            feature={
                "image": Feature(bytes_list=BytesList(value=[b"\x89PNG\r\n\x1a\n", b""])),
                "label": Feature(int64_list=Int64List(value=[7, -1, 2**62, -(2**63)])),
                "score": Feature(float_list=FloatList(value=[0.5, -2.25, 1e-3])),
            }
        )
    )
    hand = Example.FromString(enc_example(MIXED))
    assert built == hand
    assert Example.FromString(built.SerializeToString()) == hand
    # same bytes up to map order: same length, and each entry appears verbatim
    out = built.SerializeToString()
    assert len(out) == len(enc_example(MIXED))
    for name, value in MIXED.items():
        assert ld(1, enc_map_entry(name, enc_feature(*value))) in out


@pytest.mark.parametrize(
    ("kind", "values", "feature"),
    [
        (
            "bytes",
            [b"abc", b"", b"\x00\xff"],
            Feature(bytes_list=BytesList(value=[b"abc", b"", b"\x00\xff"])),
        ),
        ("int64", [1, -1, 300], Feature(int64_list=Int64List(value=[1, -1, 300]))),
        ("int64", [-5], Feature(int64_list=Int64List(value=[-5]))),
        ("float", [0.5, -2.0, 3.25], Feature(float_list=FloatList(value=[0.5, -2.0, 3.25]))),
    ],
)
def test_single_feature_example_bytes_are_exact(kind: str, values: list, feature) -> None:
    ex = Example(features=Features(feature={"f": feature}))
    expected = enc_example({"f": (kind, values)})
    assert ex.SerializeToString() == expected
    assert Example.FromString(expected) == ex


def test_int64_and_float_lists_are_packed() -> None:
    ints = Int64List(value=[1, -1, 300]).SerializeToString()
    # one field-1 wire-type-2 record holding all varints
    assert ints[0] == 0x0A
    assert ints == b"\x0a\x0d" + b"\x01" + b"\xff" * 9 + b"\x01" + b"\xac\x02"
    floats = FloatList(value=[0.5, -2.0]).SerializeToString()
    assert floats == b"\x0a\x08" + struct.pack("<ff", 0.5, -2.0)
    # bytes are never packed: one field-1 record per value
    assert BytesList(value=[b"a", b"bc"]).SerializeToString() == b"\x0a\x01a\x0a\x02bc"
    # the oneof numbers: bytes_list = 1, float_list = 2, int64_list = 3
    assert Feature(bytes_list=BytesList(value=[b"a"])).SerializeToString()[0] == 0x0A
    assert Feature(float_list=FloatList(value=[1.0])).SerializeToString()[0] == 0x12
    assert Feature(int64_list=Int64List(value=[1])).SerializeToString()[0] == 0x1A


def test_unpacked_repeated_scalars_are_accepted() -> None:
    # Parsers must accept the non-packed encoding of packable fields too.
    unpacked_ints = tag(1, VARINT) + varint(3) + tag(1, VARINT) + varint(-4)
    unpacked_floats = tag(1, I32) + struct.pack("<f", 1.5) + tag(1, I32) + struct.pack("<f", -8.0)
    assert list(Int64List.FromString(unpacked_ints).value) == [3, -4]
    assert list(FloatList.FromString(unpacked_floats).value) == [1.5, -8.0]
    raw = ld(1, ld(1, enc_map_entry("n", ld(3, unpacked_ints))))
    assert list(Example.FromString(raw).features.feature["n"].int64_list.value) == [3, -4]


def test_empty_messages_and_empty_feature() -> None:
    assert Example().SerializeToString() == b""
    assert Example.FromString(b"") == Example()
    # a feature with no kind set is an entry with an empty value message
    ex = Example(features=Features(feature={"e": Feature()}))
    assert ex.SerializeToString() == ld(1, ld(1, enc_map_entry("e", b"")))
    assert (
        Example.FromString(ex.SerializeToString()).features.feature["e"].WhichOneof("kind") is None
    )


def test_descriptors_are_private_to_shardcat() -> None:
    assert Example.DESCRIPTOR.full_name == "shardcat.tfexample.Example"
    assert SequenceExample.DESCRIPTOR.full_name == "shardcat.tfexample.SequenceExample"
    assert [f.name for f in Feature.DESCRIPTOR.fields] == ["bytes_list", "float_list", "int64_list"]
    assert [f.number for f in Feature.DESCRIPTOR.fields] == [1, 2, 3]
    assert Feature.DESCRIPTOR.oneofs_by_name["kind"] is not None
    with pytest.raises(KeyError):
        descriptor_pool.Default().FindMessageTypeByName("shardcat.tfexample.Example")


# -- SequenceExample -----------------------------------------------------------


def _sequence_example() -> SequenceExample:
    return SequenceExample(
        context=Features(
            feature={
                "id": Feature(bytes_list=BytesList(value=[b"clip-1"])),
                "fps": Feature(float_list=FloatList(value=[29.5])),
            }
        ),
        feature_lists=FeatureLists(
            feature_list={
                "frames": FeatureList(
                    feature=[
                        Feature(bytes_list=BytesList(value=[b"f0"])),
                        Feature(bytes_list=BytesList(value=[b"f1"])),
                        Feature(bytes_list=BytesList(value=[b"f2"])),
                    ]
                ),
                "boxes": FeatureList(
                    feature=[
                        Feature(int64_list=Int64List(value=[1, 2, 3, 4])),
                        Feature(int64_list=Int64List(value=[-1])),
                    ]
                ),
            }
        ),
    )


def test_sequence_example_round_trips() -> None:
    seq = _sequence_example()
    back = SequenceExample.FromString(seq.SerializeToString())
    assert back == seq
    assert list(back.context.feature["id"].bytes_list.value) == [b"clip-1"]
    assert list(back.context.feature["fps"].float_list.value) == [29.5]
    frames = back.feature_lists.feature_list["frames"].feature
    assert [list(f.bytes_list.value) for f in frames] == [[b"f0"], [b"f1"], [b"f2"]]
    boxes = back.feature_lists.feature_list["boxes"].feature
    assert [list(f.int64_list.value) for f in boxes] == [[1, 2, 3, 4], [-1]]


def test_single_entry_sequence_example_bytes_are_exact() -> None:
    seq = SequenceExample(
        context=Features(feature={"id": Feature(int64_list=Int64List(value=[9]))}),
        feature_lists=FeatureLists(
            feature_list={
                "t": FeatureList(
                    feature=[
                        Feature(float_list=FloatList(value=[1.0])),
                        Feature(float_list=FloatList(value=[2.0, 3.0])),
                    ]
                )
            }
        ),
    )
    flist = ld(1, enc_feature("float", [1.0])) + ld(1, enc_feature("float", [2.0, 3.0]))
    expected = ld(1, enc_features({"id": ("int64", [9])})) + ld(2, ld(1, enc_map_entry("t", flist)))
    assert seq.SerializeToString() == expected
    assert SequenceExample.FromString(expected) == seq


def test_example_bytes_parse_as_sequence_example_context() -> None:
    raw = enc_example(MIXED)
    ex = Example.FromString(raw)
    seq = SequenceExample.FromString(raw)
    assert seq.context == ex.features
    assert seq.HasField("context")
    assert not seq.HasField("feature_lists")
    assert len(seq.feature_lists.feature_list) == 0
    # and the other way: a SequenceExample's context is what an Example sees
    seq2 = _sequence_example()
    assert Example.FromString(seq2.SerializeToString()).features == seq2.context


# -- no clash with TensorFlow's package ----------------------------------------

# Runs in a fresh interpreter: a descriptor added to the default pool can never
# be removed again, and it would clash with TensorFlow's real example.proto if
# any later test in this session imported it.
_CLASH_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    pool = descriptor_pool.Default()
    try:
        pool.FindMessageTypeByName("tensorflow.Example")
    except KeyError:
        pass
    else:
        print(json.dumps({"skip": True}))
        sys.exit(0)

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name="tensorflow/core/example/example.proto", package="tensorflow", syntax="proto3"
    )
    msg = fdp.message_type.add(name="Example")
    msg.field.add(name="name", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    msg.field.add(name="ids", number=2, type=F.TYPE_INT64, label=F.LABEL_REPEATED)
    pool.Add(fdp)
    TFExample = message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))

    # imported after tensorflow.Example exists in the default pool
    from shardcat.pb2 import BytesList, Example, Feature, Features

    other = TFExample(name="other", ids=[1, -2])
    other_back = TFExample.FromString(other.SerializeToString())
    ours = Example(features=Features(feature={"k": Feature(bytes_list=BytesList(value=[b"v"]))}))
    ours_back = Example.FromString(ours.SerializeToString())
    print(json.dumps({
        "skip": False,
        "tf_full_name": TFExample.DESCRIPTOR.full_name,
        "ours_full_name": Example.DESCRIPTOR.full_name,
        "distinct": TFExample is not Example,
        "other": [other_back.name, list(other_back.ids)],
        "ours": [b.decode() for b in ours_back.features.feature["k"].bytes_list.value],
        "ours_hex": ours.SerializeToString().hex(),
    }))
    """
)


def test_no_clash_with_a_tensorflow_example_in_the_default_pool() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _CLASH_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if result["skip"]:
        pytest.skip("the default descriptor pool already defines tensorflow.Example")
    assert result["tf_full_name"] == "tensorflow.Example"
    assert result["ours_full_name"] == "shardcat.tfexample.Example"
    assert result["distinct"] is True
    assert result["other"] == ["other", [1, -2]]
    assert result["ours"] == ["v"]
    assert bytes.fromhex(result["ours_hex"]) == enc_example({"k": ("bytes", [b"v"])})
