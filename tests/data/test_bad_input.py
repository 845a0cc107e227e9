"""Bad input is found and named (file, record, byte offset), never trained on."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
import torch

from largebatch import data as data_mod
from largebatch.batching import BatchPlan
from largebatch.data.tfrecord import index_path_for, read_index
from largebatch.errors import DataError
from largebatch.shards import cli
from largebatch.shards.convert import Sample, make_example
from tests.data.conftest import data_cfg, header_claiming, rewrite_record, write_split, write_unique_label_shards

SHARD = "train-00001-of-00002"
CPU = torch.device("cpu")


@pytest.fixture
def shards(tmp_path) -> Path:
    """16 train records in 2 shards; label = record number + 1."""
    return write_unique_label_shards(tmp_path / "shards", {"train": 16}, {"train": 2})


def load_all(root: Path, num_classes: int = 16, decode: str = "auto") -> None:
    plan = BatchPlan.create(global_batch_size=16, micro_batch_size=8, world_size=1, num_samples=16)
    loader = data_mod.build_train_loader(data_cfg(root, num_classes, decode=decode), plan, rank=0, seed=0, device=torch.device("cpu"))
    for _ in loader:
        pass


def verify(root: Path, capsys, *extra: str) -> str:
    assert cli.main(["verify", str(root), "--quiet", "--num-classes", "16", "--label-offset", "1", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    return err


def record_offset(root: Path, record: int) -> int:
    return int(read_index(index_path_for(root / SHARD))[record][0])


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupt_data_crc(shards, capsys):
    offset = record_offset(shards, 3)
    flip_byte(shards / SHARD, offset + 40)  # inside record 3's payload
    message = f"{SHARD}: record 3 at byte offset {offset}: data CRC mismatch"
    with pytest.raises(DataError, match=message):
        load_all(shards)
    assert message in verify(shards, capsys)


def test_corrupt_length_crc(shards, capsys):
    offset = record_offset(shards, 2)
    flip_byte(shards / SHARD, offset + 9)
    assert f"record 2 at byte offset {offset}: length CRC mismatch" in verify(shards, capsys)
    with pytest.raises(DataError, match="length CRC mismatch"):
        load_all(shards)


def test_truncated_file(shards, capsys):
    path = shards / SHARD
    offset = record_offset(shards, 7)
    path.write_bytes(path.read_bytes()[: offset + 30])
    err = verify(shards, capsys)
    assert SHARD in err and "index does not match its file" in err
    with pytest.raises(DataError, match="index does not match its file"):
        load_all(shards)
    # with a rebuilt index the cut record itself is reported
    index_path_for(path).unlink()
    assert cli.main(["index", str(path)]) == 2
    assert f"record 7 at byte offset {offset}: truncated data" in capsys.readouterr().err


def test_missing_index(shards, capsys):
    index_path_for(shards / SHARD).unlink()
    assert f"{SHARD}.idx: index file missing" in verify(shards, capsys)
    with pytest.raises(DataError, match="index file missing; create it with `largebatch data index"):
        load_all(shards)


def test_index_not_matching_file(shards, capsys):
    other = shards / "train-00000-of-00002.idx"
    shutil.copy(other, index_path_for(shards / SHARD))  # same record count, other sizes
    err = verify(shards, capsys)
    assert f"{SHARD}.idx" in err and "index does not match" in err
    with pytest.raises(DataError, match="index does not match"):
        load_all(shards)


def _rewrite_shard(root: Path, bad: int, *, jpeg: bytes | None = None, label: int | None = None) -> None:
    """Rewrite SHARD with record ``bad`` replaced by a broken JPEG or an out-of-range label."""
    from largebatch.data.example import decode_example
    from largebatch.shards.records import iter_records

    originals = [decode_example(data) for _, _, data in iter_records(root / SHARD)]

    def encode(sample: Sample) -> bytes:
        r = originals[sample.source]
        return make_example(
            jpeg if sample.source == bad and jpeg is not None else r["image/encoded"][0],
            r["image/height"][0],
            r["image/width"][0],
            "RGB",
            label if sample.source == bad and label is not None else r["image/class/label"][0],
            "x",
            "x.jpg",
        )

    (root / SHARD).unlink()
    index_path_for(root / SHARD).unlink()
    samples = [Sample(i, 0, "x") for i in range(len(originals))]
    # write_split names shards by count; write both, then keep only the rewritten one
    tmp = root / "rewrite"
    tmp.mkdir()
    write_split(tmp, "train", samples + samples, 2, encode)
    for name in (SHARD, SHARD + ".idx"):
        (tmp / name).replace(root / name)


@pytest.mark.parametrize("decode", ["cpu", "device"])
def test_undecodable_jpeg(shards, capsys, decode):
    _rewrite_shard(shards, 5, jpeg=b"\xff\xd8\xff\xe0 this is not a jpeg")
    offset = record_offset(shards, 5)
    message = f"{SHARD} record 5 at byte offset {offset}: JPEG does not decode"
    with pytest.raises(DataError, match=message):
        load_all(shards, decode=decode)
    assert f"record 5 at byte offset {offset}: JPEG does not decode" in verify(shards, capsys)


def oversized(height: int = 15000, width: int = 20000) -> bytes:
    """A 64 px JPEG whose header claims 300 megapixels (0.8 GiB to decode)."""
    return header_claiming(simplejpeg.encode_jpeg(np.full((64, 64, 3), 90, dtype=np.uint8)), height, width)


@pytest.mark.parametrize("decode", ["cpu", "device"])
def test_oversized_jpeg_header(shards, capsys, decode):
    """Refused the same way whether the loader's workers decode or the device does."""
    from largebatch.data.example import decode_example
    from largebatch.data.tfrecord import ShardSet

    # the limit is a setting: at the largest image's size every record loads, one pixel less names it
    records = ShardSet(shards, "train")
    sizes = [simplejpeg.decode_jpeg_header(decode_example(records.read(i))["image/encoded"][0])[:2] for i in range(len(records))]
    largest = max(range(len(sizes)), key=lambda i: sizes[i][0] * sizes[i][1])
    height, width = sizes[largest]
    plan = BatchPlan.create(global_batch_size=16, micro_batch_size=8, world_size=1, num_samples=16)
    at_limit = data_cfg(shards, 16, max_pixels=height * width, decode=decode)
    assert len(list(data_mod.build_train_loader(at_limit, plan, rank=0, seed=0, device=CPU))) == 2
    below = data_cfg(shards, 16, max_pixels=height * width - 1, decode=decode)
    with pytest.raises(DataError, match=re.escape(f"{records.where(largest)}: the image header says {width}x{height} pixels")):
        list(data_mod.build_train_loader(below, plan, rank=0, seed=0, device=CPU))

    _rewrite_shard(shards, 5, jpeg=oversized())
    offset = record_offset(shards, 5)
    message = (
        f"{SHARD} record 5 at byte offset {offset}: the image header says 20000x15000 pixels (300.0 megapixels), more than "
        "data.max_pixels 50000000 (50 megapixels)"
    )
    with pytest.raises(DataError, match=re.escape(message)):
        load_all(shards, decode=decode)
    evaluation = data_mod.build_eval_loader(
        data_cfg(shards, 16, eval_split="train", decode=decode), batch_size=8, rank=0, world_size=1, device=CPU
    )
    with pytest.raises(DataError, match=re.escape(message)):
        list(evaluation)
    for decode in ([], ["--no-decode"]):  # the header is checked without decoding too
        assert f"record 5 at byte offset {offset}: the image header says 20000x15000" in verify(shards, capsys, *decode)


@pytest.mark.dali
def test_oversized_jpeg_header_dali(shards):
    """DALI reads the header, decodes a stand-in instead (a 300-megapixel decode of 64 px
    of data would fail as undecodable, not name the size) and names the record."""
    pytest.importorskip("nvidia.dali")

    _rewrite_shard(shards, 5, jpeg=oversized())
    message = f"{SHARD} record 5 at byte offset {record_offset(shards, 5)}: the image header says 20000x15000 pixels"
    plan = BatchPlan.create(global_batch_size=16, micro_batch_size=8, world_size=1, num_samples=16)
    with pytest.raises(DataError, match=re.escape(message)):
        list(data_mod.build_train_loader(data_cfg(shards, 16, loader="dali"), plan, rank=0, seed=0, device=CPU))
    evaluation = data_mod.build_eval_loader(
        data_cfg(shards, 16, loader="dali", eval_split="train"), batch_size=8, rank=0, world_size=1, device=CPU
    )
    with pytest.raises(DataError, match=re.escape(message)):
        list(evaluation)


def png_bytes() -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.full((40, 40, 3), 90, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.dali
def test_png_bytes_are_refused_by_dali_as_by_the_native_loader(shards):
    """DALI decodes a PNG where a JPEG belongs; the native loader cannot: both refuse it,
    naming the record, so the loader chosen does not decide what trains."""
    pytest.importorskip("nvidia.dali")

    _rewrite_shard(shards, 5, jpeg=png_bytes())
    where = f"{SHARD} record 5 at byte offset {record_offset(shards, 5)}"
    message = f"{where}: image/encoded is not a JPEG (it starts with 89504e47, a PNG)"
    with pytest.raises(DataError, match=re.escape(message)):
        load_all(shards)
    plan = BatchPlan.create(global_batch_size=16, micro_batch_size=8, world_size=1, num_samples=16)
    with pytest.raises(DataError, match=re.escape(message)):
        list(data_mod.build_train_loader(data_cfg(shards, 16, loader="dali"), plan, rank=0, seed=0, device=CPU))
    evaluation = data_mod.build_eval_loader(
        data_cfg(shards, 16, loader="dali", eval_split="train"), batch_size=8, rank=0, world_size=1, device=CPU
    )
    with pytest.raises(DataError, match=re.escape(message)):
        list(evaluation)


def test_oversized_jpeg_header_media_pipeline_reader(shards):
    """The media pipeline's reader (plain Python; the pipeline itself needs a Gaudi)
    checks each header before the HPU decoder gets the bytes."""
    from largebatch.data.mediapipe import _RecordSource
    from largebatch.data.tfrecord import ShardSet

    _rewrite_shard(shards, 5, jpeg=oversized())
    records = ShardSet(shards, "train")
    batches = [np.arange(0, 8), np.arange(8, 16)]
    source = _RecordSource(records, batches, batch_size=8, num_classes=16, label_offset=1, max_pixels=50_000_000)
    jpegs, labels = source.read(0)
    assert labels.tolist() == list(range(8)) and all(j.dtype == np.uint8 for j in jpegs)
    position = records.indices[1][5][0]
    with pytest.raises(DataError, match=re.escape(f"{SHARD} record 5 at byte offset {position}: the image header says 20000x15000")):
        source.read(1)


def test_label_out_of_range(shards, capsys):
    _rewrite_shard(shards, 6, label=17)  # classes are 1..16 with label_offset 1
    offset = record_offset(shards, 6)
    with pytest.raises(
        DataError,
        match=f"{SHARD} record 6 at byte offset {offset}: label 17 is outside 1..16",
    ):
        load_all(shards)
    assert "label 17 is outside 1..16" in verify(shards, capsys)


@pytest.mark.parametrize(
    ("features", "expected"),
    [
        ({"image/class/label": [1.5]}, "image/class/label holds 1 float value (1.5), expected one int64 class number"),
        ({"image/class/label": [b"7"]}, "image/class/label holds 1 bytes value (b'7'), expected one int64 class number"),
        ({"image/class/label": [3, 4]}, "image/class/label holds 2 int64 values, expected one int64 class number"),
        ({"image/encoded": [255]}, "image/encoded holds 1 int64 value (255), expected one bytes value (the JPEG)"),
        ({"image/encoded": []}, "image/encoded holds no value, expected one bytes value"),
    ],
    ids=["float-label", "bytes-label", "two-labels", "int64-image", "empty-image"],
)
def test_a_feature_of_another_kind_is_named_not_trained_on(shards, capsys, features, expected):
    """A float label (1.5 trained as a class before), a bytes label or an int64 image is
    named with its record, by the loaders and by verify."""
    rewrite_record(shards / SHARD, 6, features)
    where = f"{SHARD} record 6 at byte offset {record_offset(shards, 6)}"
    with pytest.raises(DataError, match=re.escape(f"{where}: not an ImageNet-schema Example ({expected}")):
        load_all(shards)
    assert expected in verify(shards, capsys)


@pytest.mark.dali
@pytest.mark.parametrize(
    ("label", "holds"),
    [
        ([1.5], "holds 1 float value (1.5)"),
        ([b"7"], "holds 1 bytes value (b'7')"),
        ([3, 4], "holds 2 int64 values"),
        ([], "holds no value"),
    ],
    ids=["float", "bytes", "two-values", "none"],
)
def test_dali_names_a_label_that_is_not_one_int64_as_the_native_loader_does(shards, label, holds):
    """A label DALI cannot read as one int64 (read as a fixed-length int64, a float label
    was uninitialised memory, which could fall inside the classes): the record is named with
    what is wrong with it, as the native loader names it, whatever its bits. (An int64
    image/encoded crashes DALI 2.4's reader itself; data verify names it.)"""
    pytest.importorskip("nvidia.dali")

    rewrite_record(shards / SHARD, 5, {"image/class/label": label})
    plan = BatchPlan.create(global_batch_size=16, micro_batch_size=8, world_size=1, num_samples=16)
    expected = f"image/class/label {holds}, expected one int64 class number"
    message = f"{SHARD} record 5 at byte offset {record_offset(shards, 5)}: not an ImageNet-schema Example ({expected}"
    with pytest.raises(DataError, match=re.escape(message)):
        list(data_mod.build_train_loader(data_cfg(shards, 16, loader="dali"), plan, rank=0, seed=0, device=CPU))


@pytest.mark.parametrize(
    ("line", "expected"),
    [("0 \u00b2\n", "line 1: expected '<offset> <size>'"), ("0 " + "1" + "0" * 23 + "\n", "line 1: expected '<offset> <size>'")],
    ids=["superscript-two", "beyond-int64"],
)
def test_an_index_line_that_is_no_pair_of_int64s_is_one_error_line(shards, capsys, line, expected):
    index = index_path_for(shards / SHARD)
    index.write_text(line)
    with pytest.raises(DataError, match=re.escape(expected)):
        load_all(shards)
    err = verify(shards, capsys)
    assert f"{SHARD}.idx: {expected}" in err and "largebatch data index" in err


def test_an_index_larger_than_its_shard_could_need_is_refused_unread(shards, capsys):
    """A sparse 4 GiB index is refused from its size: reading it would take 4 GiB."""
    index = index_path_for(shards / SHARD)
    with open(index, "r+b") as handle:
        handle.truncate(4 << 30)
    with pytest.raises(DataError, match=f"{SHARD}.idx: {4 << 30} bytes, more than an index of its"):
        load_all(shards)
    assert "not the index of" in verify(shards, capsys)


def test_a_record_length_beyond_the_file_is_named_before_reading(shards, capsys):
    """A length of 2^62 with a valid length CRC: ``data index`` names the record instead of
    allocating the length."""
    import struct

    from largebatch.data.tfrecord import masked_crc

    path = shards / SHARD
    offset = record_offset(shards, 4)
    data = bytearray(path.read_bytes())
    length = struct.pack("<Q", 1 << 62)
    data[offset : offset + 12] = length + struct.pack("<I", masked_crc(length))
    path.write_bytes(bytes(data))
    assert cli.main(["index", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"record 4 at byte offset {offset}: truncated data (its header claims {(1 << 62) + 4} bytes" in err


def test_missing_or_empty_shard_list(tmp_path, capsys):
    with pytest.raises(DataError, match="data folder not found"):
        load_all(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no shards of split 'train'"):
        load_all(tmp_path / "empty")
    assert "no TFRecord shards" in verify(tmp_path / "empty", capsys)


def test_incomplete_shard_set(shards):
    (shards / "train-00000-of-00002").unlink()
    with pytest.raises(DataError, match="do not form one complete set"):
        load_all(shards)
