"""TFRecord framing, Example codec and index files, against references."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import crc32c
import numpy as np
import pytest

from largebatch.data.example import ExampleDecodeError, decode_example
from largebatch.data.tfrecord import ShardSet, count_records, index_path_for, masked_crc, read_index
from largebatch.shards.records import TFRecordWriter, encode_example, iter_records, scan_index, write_index


def _masked_reference(data: bytes) -> int:
    # TensorFlow's crc32c::Mask written out: rotate right by 15, add a constant.
    crc = crc32c.crc32c(data)
    rotated = ((crc >> 15) | (crc << 17)) & 0xFFFFFFFF
    return (rotated + 0xA282EAD8) & 0xFFFFFFFF


def _write(path: Path, payloads: list[bytes]) -> list[tuple[int, int]]:
    with TFRecordWriter(path) as writer:
        for payload in payloads:
            writer.write(payload)
    return writer.index


def test_crc_of_known_vector():
    # CRC-32C("123456789") = 0xE3069283 (RFC 3720 check value)
    assert crc32c.crc32c(b"123456789") == 0xE3069283
    assert masked_crc(b"123456789") == _masked_reference(b"123456789")


def test_round_trip_and_framing(tmp_path):
    payloads = [b"", b"a", bytes(range(256)) * 40]
    index = _write(tmp_path / "f", payloads)
    raw = (tmp_path / "f").read_bytes()
    # the first record's frame, byte by byte
    assert struct.unpack("<Q", raw[:8])[0] == 0
    assert struct.unpack("<I", raw[8:12])[0] == _masked_reference(raw[:8])
    assert struct.unpack("<I", raw[12:16])[0] == _masked_reference(b"")
    assert [data for _, _, data in iter_records(tmp_path / "f")] == payloads
    assert [(o, s) for o, s, _ in iter_records(tmp_path / "f")] == index
    assert sum(size for _, size in index) == len(raw)


def test_index_matches_dalis_tfrecord2idx(tmp_path):
    script = shutil.which("tfrecord2idx") or str(Path(sys.executable).with_name("tfrecord2idx"))
    if not Path(script).is_file():
        pytest.skip("DALI's tfrecord2idx script not installed (pip install nvidia-dali-cuda130)")
    rng = np.random.default_rng(0)
    index = _write(tmp_path / "f", [rng.bytes(int(n)) for n in rng.integers(0, 3000, 25)])
    write_index(tmp_path / "ours.idx", index)
    subprocess.run(
        [sys.executable, script, str(tmp_path / "f"), str(tmp_path / "dali.idx")],
        check=True,
    )
    assert (tmp_path / "ours.idx").read_bytes() == (tmp_path / "dali.idx").read_bytes()
    assert read_index(tmp_path / "dali.idx").tolist() == [list(e) for e in index]
    assert scan_index(tmp_path / "f").tolist() == [list(e) for e in index]


def test_example_codec_round_trip():
    features = {
        "image/encoded": b"\xff\xd8jpeg\x00bytes",
        "image/class/label": 417,
        "image/class/text": "n01440764",
        "negative": -5,
        "many": [1, 2**40, -(2**63)],
        "floats": [0.5, -2.25],
        "empty": [],
    }
    decoded = decode_example(encode_example(features))
    assert decoded["image/encoded"] == [features["image/encoded"]]
    assert decoded["image/class/label"] == [417]
    assert decoded["image/class/text"] == [b"n01440764"]
    assert decoded["negative"] == [-5]
    assert decoded["many"] == [1, 2**40, -(2**63)]
    assert decoded["floats"] == [0.5, -2.25]
    assert decoded["empty"] == []
    assert decode_example(encode_example(features), ["negative"]) == {"negative": [-5]}


def test_example_known_bytes_and_unpacked_ints():
    # Example{features{feature{key:"a" value{int64_list{value:[1]}}}}}, as protobuf writes it
    packed = bytes.fromhex("0a0c0a0a0a016112051a030a0101")
    assert encode_example({"a": 1}) == packed
    assert decode_example(packed) == {"a": [1]}
    # the same list unpacked (field 1 as plain varints) must decode too
    unpacked = bytes.fromhex("0a0d0a0b0a016112061a0408010802")
    assert decode_example(unpacked) == {"a": [1, 2]}
    with pytest.raises(ExampleDecodeError):
        decode_example(b"\x0a\x05\x0a")


def test_shardset_random_access_and_count(tmp_path):
    for k in range(3):
        payloads = [f"{k}-{i}".encode() for i in range(k + 2)]
        path = tmp_path / f"train-{k:05d}-of-00003"
        write_index(index_path_for(path), _write(path, payloads))
    shards = ShardSet(tmp_path, "train")
    assert len(shards) == 2 + 3 + 4 == count_records(tmp_path, "train")
    assert shards.read(0) == b"0-0"
    assert shards.read(4) == b"1-2"
    assert shards.read(8) == b"2-3"
    assert shards.locate(5) == (2, 0)


def _protobuf_example_class():
    """``tf.train.Example`` built from its ``.proto`` definition with the protobuf runtime
    (installed with the tensorboard extra), the reference the codec is checked against."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(name="example_ref.proto", package="ref", syntax="proto3")
    label, msg_type = descriptor_pb2.FieldDescriptorProto, descriptor_pb2.FieldDescriptorProto
    repeated, optional = label.LABEL_REPEATED, label.LABEL_OPTIONAL

    def message(name, *fields):
        m = proto.message_type.add(name=name)
        for number, fname, kind, lab, type_name in fields:
            field = m.field.add(name=fname, number=number, type=kind, label=lab)
            if type_name:
                field.type_name = type_name
        return m

    message("BytesList", (1, "value", msg_type.TYPE_BYTES, repeated, None))
    message("FloatList", (1, "value", msg_type.TYPE_FLOAT, repeated, None))
    message("Int64List", (1, "value", msg_type.TYPE_INT64, repeated, None))
    feature = message(
        "Feature",
        (1, "bytes_list", msg_type.TYPE_MESSAGE, optional, ".ref.BytesList"),
        (2, "float_list", msg_type.TYPE_MESSAGE, optional, ".ref.FloatList"),
        (3, "int64_list", msg_type.TYPE_MESSAGE, optional, ".ref.Int64List"),
    )
    feature.oneof_decl.add(name="kind")
    for f in feature.field:
        f.oneof_index = 0
    features = message("Features", (1, "feature", msg_type.TYPE_MESSAGE, repeated, ".ref.Features.FeatureEntry"))
    entry = features.nested_type.add(name="FeatureEntry")
    entry.field.add(name="key", number=1, type=msg_type.TYPE_STRING, label=optional)
    entry.field.add(name="value", number=2, type=msg_type.TYPE_MESSAGE, label=optional, type_name=".ref.Feature")
    entry.options.map_entry = True
    message("Example", (1, "features", msg_type.TYPE_MESSAGE, optional, ".ref.Features"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("ref.Example"))


def _reference_decode(example) -> dict[str, list]:
    out = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        out[name] = [] if kind is None else list(getattr(feature, kind).value)
    return out


def test_example_decoder_matches_protobuf_on_random_examples():
    Example = _protobuf_example_class()
    rng = np.random.default_rng(0)
    for trial in range(300):
        message = Example()
        for k in range(int(rng.integers(0, 9))):
            feature = message.features.feature[f"f{k}/{'é' * int(rng.integers(0, 2))}{'x' * int(rng.integers(0, 200))}"]
            kind = int(rng.integers(0, 4))
            n = int(rng.integers(0, 6 if trial % 7 else 300))
            if kind == 0:
                feature.bytes_list.value.extend(rng.bytes(int(rng.integers(0, 300))) for _ in range(n))
            elif kind == 1:
                feature.float_list.value.extend(rng.standard_normal(n).astype(np.float32).tolist())
            elif kind == 2:
                feature.int64_list.value.extend(int(v) for v in rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64))
            # kind 3: a Feature with no list set
        data = message.SerializeToString(deterministic=True)
        assert decode_example(data) == _reference_decode(message)
        names = list(message.features.feature)
        if names:
            keep = names[: len(names) // 2 + 1]
            assert decode_example(data, keep) == {n: _reference_decode(message)[n] for n in keep}


def test_example_decoder_agrees_with_protobuf_on_every_truncation():
    Example = _protobuf_example_class()
    from google.protobuf.message import DecodeError

    message = Example()
    message.features.feature["image/encoded"].bytes_list.value.append(bytes(range(200)))
    message.features.feature["image/class/label"].int64_list.value.extend([417, -3, 2**40])
    message.features.feature["weights"].float_list.value.extend([0.5, -2.25])
    data = message.SerializeToString(deterministic=True)
    for cut in range(len(data)):
        reference = Example()
        try:
            reference.ParseFromString(data[:cut])
        except DecodeError:
            with pytest.raises(ExampleDecodeError):
                decode_example(data[:cut])
        else:
            assert decode_example(data[:cut]) == _reference_decode(reference)
