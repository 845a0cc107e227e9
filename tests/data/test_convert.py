"""The converter and the ``convert | index | verify`` commands."""

from __future__ import annotations

import argparse
import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from largebatch.data import cli, convert
from largebatch.data.example import decode_example
from largebatch.data.tfrecord import (
    count_records,
    index_path_for,
    iter_records,
    list_shards,
    read_index,
    scan_index,
)

CLASSES = ["n02", "n01", "n03"]  # deliberately unsorted on creation


def make_image_folder(root: Path, per_class: int = 3, val_per_class: int = 2) -> Path:
    rng = np.random.default_rng(1)
    for folder, count in (("train", per_class), ("val", val_per_class)):
        for name in CLASSES:
            (root / folder / name).mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(
                    0,
                    256,
                    (int(rng.integers(20, 40)), int(rng.integers(20, 40)), 3),
                    dtype=np.uint8,
                )
                image = Image.fromarray(pixels)
                if i == 1:
                    image.save(root / folder / name / f"img{i}.png")  # re-encoded as JPEG
                elif i == 2:
                    image.convert("CMYK").save(root / folder / name / f"img{i}.JPEG", quality=90)
                else:
                    image.save(root / folder / name / f"img{i}.JPEG", quality=90)
    return root


def records(root: Path, split: str) -> list[dict]:
    return [decode_example(data) for path in list_shards(root, split) for _, _, data in iter_records(path)]


def digest(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())}


def test_image_folder(tmp_path):
    src = make_image_folder(tmp_path / "src")
    meta = convert.convert_image_folder(src, tmp_path / "out", train_shards=2, validation_shards=2, progress=False)
    assert meta["classes"] == sorted(CLASSES)
    assert meta["splits"] == {
        "train": {"shards": 2, "records": 9},
        "validation": {"shards": 2, "records": 6},
    }
    assert [p.name for p in list_shards(tmp_path / "out", "train")] == [
        "train-00000-of-00002",
        "train-00001-of-00002",
    ]
    for split in ("train", "validation"):
        for path in list_shards(tmp_path / "out", split):
            assert read_index(index_path_for(path)).tolist() == scan_index(path).tolist()
    val = records(tmp_path / "out", "validation")
    assert [r["image/class/label"][0] for r in val] == [
        1,
        1,
        2,
        2,
        3,
        3,
    ]  # ImageNet counts from 1
    assert [r["image/class/text"][0] for r in val] == [
        b"n01",
        b"n01",
        b"n02",
        b"n02",
        b"n03",
        b"n03",
    ]
    for r in records(tmp_path / "out", "train") + val:
        assert r["image/format"] == [b"JPEG"]
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(r["image/encoded"][0])
        assert (r["image/height"][0], r["image/width"][0]) == (height, width)
        assert colorspace in ("YCbCr", "Gray")  # CMYK sources were re-encoded
        assert r["image/filename"][0].startswith(b"img")
    train_labels = [r["image/class/label"][0] for r in records(tmp_path / "out", "train")]
    assert sorted(train_labels) == [
        1,
        1,
        1,
        2,
        2,
        2,
        3,
        3,
        3,
    ] and train_labels != sorted(train_labels)


def test_deterministic_and_skips_finished_shards(tmp_path):
    src = make_image_folder(tmp_path / "src")
    a, b = tmp_path / "a", tmp_path / "b"
    convert.convert_image_folder(src, a, train_shards=3, validation_shards=1, progress=False)
    convert.convert_image_folder(src, b, train_shards=3, validation_shards=1, progress=False)
    assert digest(a) == digest(b)
    before = {p.name: p.stat().st_mtime_ns for p in a.iterdir()}
    (a / "train-00001-of-00003").unlink()
    (a / "train-00002-of-00003.idx").unlink()  # a shard without its index is unfinished
    (a / "stale.tmp").write_bytes(b"half a shard")
    convert.convert_image_folder(src, a, train_shards=3, validation_shards=1, progress=False)
    after = {p.name: p.stat().st_mtime_ns for p in a.iterdir()}
    rewritten = {n for n in before if after.get(n) != before[n]}
    assert rewritten <= {
        "train-00001-of-00003",
        "train-00001-of-00003.idx",
        "train-00002-of-00003",
        "train-00002-of-00003.idx",
        "dataset.json",
    }
    assert after["train-00000-of-00003"] == before["train-00000-of-00003"]
    assert {k: v for k, v in digest(a).items() if k != "stale.tmp"} == digest(b)


def test_fashion_mnist_subset(fmnist_shards):
    assert count_records(fmnist_shards, "train") == 64 and count_records(fmnist_shards, "validation") == 64
    first = records(fmnist_shards, "validation")[0]
    assert first["image/class/label"] == [9]  # t10k's first image is an ankle boot
    assert first["image/class/text"] == [b"Ankle boot"]
    pixels = simplejpeg.decode_jpeg(first["image/encoded"][0], colorspace="GRAY")
    assert pixels.shape == (28, 28, 1)
    meta = convert.read_meta(fmnist_shards)
    assert meta["num_classes"] == 10 and meta["label_offset"] == 0 and meta["channels"] == 1


def run(argv: list[str]) -> int:
    return cli.main(argv)


def test_cli_convert_index_verify(tmp_path, capsys):
    src = make_image_folder(tmp_path / "src")
    out = tmp_path / "out"
    assert (
        run(
            [
                "convert",
                "folder",
                str(src),
                "--out",
                str(out),
                "--train-shards",
                "2",
                "--validation-shards",
                "1",
                "--quiet",
                "--limit",
                "4",
            ]
        )
        == 0
    )
    assert count_records(out, "train") == 4
    shard = out / "train-00000-of-00002"
    expected = index_path_for(shard).read_bytes()
    index_path_for(shard).unlink()
    assert run(["index", str(shard)]) == 0
    assert index_path_for(shard).read_bytes() == expected
    assert run(["verify", str(out), "--quiet"]) == 0
    assert "train: 4 records OK" in capsys.readouterr().out


def test_register_adds_subcommands():
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["verify", "somewhere"])
    assert args.func is cli.cmd_verify and args.dir == "somewhere"


def test_cli_error_is_one_line(tmp_path, capsys):
    assert run(["verify", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "missing" in err


def test_prepare_fmnist_script_exists():
    script = Path(__file__).resolve().parents[2] / "data" / "prepare_fmnist.py"
    assert script.is_file() and os.access(script, os.R_OK)


def test_images_above_the_size_limit_are_refused_before_decoding(tmp_path, capsys):
    from largebatch.errors import DataError
    from tests.data.conftest import header_claiming

    src = make_image_folder(tmp_path / "src")
    bomb = src / "train" / "n01" / "img0.JPEG"
    bomb.write_bytes(header_claiming(bomb.read_bytes(), 15000, 20000))  # a 300-megapixel header over a few pixels
    with pytest.raises(DataError) as error:
        convert.convert_image_folder(src, tmp_path / "out", train_shards=1, validation_shards=1, progress=False)
    assert str(error.value).startswith(
        f"{bomb}: the image header says 20000x15000 pixels (300.0 megapixels), more than --max-pixels 50000000"
    )
    # a PNG (read by Pillow) above a lower limit, through the command line: its size comes from the header too
    other = tmp_path / "other"
    for name, size in (("a", (30, 20)), ("b", (300, 200))):
        (other / "train" / name).mkdir(parents=True)
        Image.fromarray(np.zeros((size[1], size[0], 3), dtype=np.uint8)).save(other / "train" / name / "x.png")
    argv = ["convert", "folder", str(other), "--out", str(tmp_path / "out2"), "--quiet", "--max-pixels", "1000"]
    assert run(argv) == 2
    err = capsys.readouterr().err
    png = other / "train" / "b" / "x.png"
    assert err.count("\n") == 1 and err.startswith(
        f"error: {png}: the image header says 300x200 pixels (0.1 megapixels), more than --max-pixels 1000"
    )
