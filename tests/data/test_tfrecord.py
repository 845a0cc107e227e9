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

from largebatch.data.example import ExampleDecodeError, decode_example, encode_example
from largebatch.data.tfrecord import (
    ShardSet,
    TFRecordWriter,
    count_records,
    index_path_for,
    iter_records,
    masked_crc,
    read_index,
    scan_index,
    write_index,
)


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
    script = shutil.which("tfrecord2idx") or str(
        Path(sys.executable).with_name("tfrecord2idx")
    )
    if not Path(script).is_file():
        pytest.skip(
            "DALI's tfrecord2idx script not installed (pip install nvidia-dali-cuda130)"
        )
    rng = np.random.default_rng(0)
    index = _write(
        tmp_path / "f", [rng.bytes(int(n)) for n in rng.integers(0, 3000, 25)]
    )
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
