"""The converter and the ``convert | index | verify`` commands."""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from PIL import Image
from tqdm import tqdm

from largebatch.data.example import decode_example
from largebatch.data.tfrecord import count_records, index_path_for, list_shards, read_index
from largebatch.errors import DataError
from largebatch.shards import cli, convert, verify
from largebatch.shards.pool import run_jobs
from largebatch.shards.records import iter_records, scan_index

CLASSES = ["n02", "n01", "n03"]  # deliberately unsorted on creation
CHECKS = verify.RecordChecks(num_classes=3, label_offset=1, decode=True, max_pixels=convert.MAX_PIXELS)


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


def test_workers_write_the_bytes_one_writes(tmp_path, fmnist_shards):
    src = make_image_folder(tmp_path / "src", per_class=6)
    one, three = tmp_path / "one", tmp_path / "three"
    convert.convert_image_folder(src, one, train_shards=5, validation_shards=2, progress=False)
    convert.convert_image_folder(src, three, train_shards=5, validation_shards=2, progress=False, workers=3)
    assert digest(three) == digest(one) and len(digest(one)) == 2 * 7 + 1
    # Fashion-MNIST's arrays travel to the workers with the samples: the fixture's shards, by two workers
    two = tmp_path / "fmnist"
    convert.convert_fashion_mnist(two, limit=64, train_shards=4, validation_shards=2, progress=False, workers=2)
    assert digest(two) == digest(fmnist_shards)


def bad_images_folder(root: Path) -> Path:
    src = make_image_folder(root, per_class=8)  # 26 train images; shuffled, the broken are 11th and 17th
    for name in ("n01", "n03"):
        (src / "train" / name / "broken.png").write_bytes(b"not an image at all")
    return src


def test_workers_stop_at_the_problem_one_worker_reports(tmp_path):
    # A serial run stops at the first bad image in shard order; a parallel one lets the
    # shards before it finish and reports the same image, whichever worker met a bad one first.
    src = bad_images_folder(tmp_path / "src")
    errors = {}
    for workers in (1, 4):
        with pytest.raises(DataError) as error:
            convert.convert_image_folder(src, tmp_path / f"out{workers}", train_shards=6, progress=False, workers=workers)
        errors[workers] = str(error.value)
    assert errors[4] == errors[1]
    assert errors[1].endswith("broken.png: cannot read image: not an image format Pillow knows (19 bytes)")
    # every shard before the failing one is complete and identical, in both
    done = {name: sha for name, sha in digest(tmp_path / "out1").items() if not name.endswith(".tmp")}
    # bounds 0, 4, 8, 13; the conversion is named (dataset.json.partial) before its first shard
    assert sorted(done) == ["dataset.json.partial"] + [f"train-0000{n}-of-00006{idx}" for n in (0, 1) for idx in ("", ".idx")]
    assert {k: v for k, v in digest(tmp_path / "out4").items() if k in done} == done


def test_verify_and_index_with_workers_match_one_worker(tmp_path, capsys):
    src = make_image_folder(tmp_path / "src", per_class=6)
    out = tmp_path / "out"
    convert.convert_image_folder(src, out, train_shards=4, validation_shards=2, progress=False)
    indexes = {p.name: p.read_bytes() for p in out.glob("*.idx")}
    for p in out.glob("*.idx"):
        p.unlink()
    written = verify.index_files(sorted(p for p in out.iterdir() if p.name != "dataset.json"), workers=3)
    assert {p.name: p.read_bytes() for p in written} == indexes
    bar_file = io.StringIO()
    counts = {}
    for workers in (1, 3):
        with tqdm(total=0, file=bar_file) as bar:
            counts[workers] = sum(
                run_jobs(
                    verify.verify_shard,
                    [(p, read_index(index_path_for(p)), CHECKS) for p in list_shards(out, "train")],
                    workers=workers,
                    bar=bar,
                )
            )
            assert bar.n == counts[workers]  # the workers' progress reached the bar
    assert counts[1] == counts[3] == 18
    # two damaged shards: both worker counts name the earlier one, at the same record
    for shard in (list_shards(out, "train")[1], list_shards(out, "train")[3]):
        data = bytearray(shard.read_bytes())
        data[-5] ^= 0xFF  # the last record's data CRC
        shard.write_bytes(bytes(data))
    messages = []
    for workers in ("1", "3"):
        assert run(["verify", str(out), "--quiet", "--workers", workers]) == 2
        messages.append(capsys.readouterr().err)
    assert messages[0] == messages[1] and messages[0].startswith(f"error: {list_shards(out, 'train')[1]}: record ")


def foldered_and_flat_validation(root: Path) -> tuple[Path, Path, list[tuple[str, str]]]:
    """The same images twice: val/<class>/ILSVRC2012_val_*.JPEG, and a flat val/ as
    ImageNet's archive unpacks; file-name order differs from class order."""
    foldered = make_image_folder(root / "foldered")
    images = sorted((root / "foldered" / "val").rglob("img*"))
    numbers = np.random.default_rng(3).permutation(len(images)) + 1
    truth = []
    for image, k in zip(images, numbers):
        name = f"ILSVRC2012_val_{k:08d}{image.suffix}"
        image.rename(image.parent / name)
        truth.append((name, image.parent.name))
    flat = root / "flat"
    shutil.copytree(foldered / "train", flat / "train")
    (flat / "val").mkdir()
    for name, wnid in truth:
        shutil.copy(foldered / "val" / wnid / name, flat / "val" / name)
    return foldered, flat, sorted(truth)


def test_a_flat_validation_folder_with_either_labels_file_makes_the_foldered_shards(tmp_path):
    foldered, flat, truth = foldered_and_flat_validation(tmp_path)
    synsets = tmp_path / "imagenet_2012_validation_synset_labels.txt"
    synsets.write_text("".join(f"{wnid}\n" for _, wnid in truth))  # in file-name order
    solution = tmp_path / "LOC_val_solution.csv"
    rows = [f"{Path(name).stem},{wnid} 12 8 30 25 {wnid} 1 2 20 20" for name, wnid in reversed(truth)]
    solution.write_text("ImageId,PredictionString\n" + "\n".join(rows) + "\n")
    expected = tmp_path / "expected"
    convert.convert_image_folder(foldered, expected, train_shards=2, validation_shards=2, progress=False)
    for labels in (synsets, solution):
        out = tmp_path / labels.stem
        argv = ["convert", "folder", str(flat), "--out", str(out), "--val-labels", str(labels), "--quiet"]
        assert run([*argv, "--train-shards", "2", "--validation-shards", "2", "--workers", "1"]) == 0
        shards = {name: sha for name, sha in digest(out).items() if name != "dataset.json"}  # it names its source
        assert shards == {name: sha for name, sha in digest(expected).items() if name != "dataset.json"}
        assert json.loads((out / "dataset.json").read_text())["splits"] == json.loads((expected / "dataset.json").read_text())["splits"]


def test_a_flat_validation_folder_without_good_labels_is_one_clear_error(tmp_path, capsys):
    _, flat, truth = foldered_and_flat_validation(tmp_path)
    labels = tmp_path / "labels.txt"
    argv = ["convert", "folder", str(flat), "--out", str(tmp_path / "out"), "--quiet"]
    cases = {
        None: f"error: {flat / 'val'}: holds 6 images and no class folders; give their classes with --val-labels FILE",
        "".join(f"{wnid}\n" for _, wnid in truth[:-1]): f"error: {labels}: 5 class names for the 6 images in {flat / 'val'}",
        "".join(f"{wnid}\n" for _, wnid in truth[:2]) + "n09\n" + "".join(f"{wnid}\n" for _, wnid in truth[3:]): (
            f"error: {labels}: line 3: class 'n09' (for {truth[2][0]}) is not a folder in train/"
        ),
        "".join(f"{k}\n" for k in (490, 361, 171, 822, 297, 482)): (
            f"error: {labels}: line 1: '490' is a class number, not a class folder name: this looks like the devkit's "
            "ILSVRC2012_validation_ground_truth.txt"
        ),
        "ImageId,PredictionString\n" + "".join(f"{Path(n).stem},{w} 1 1 2 2\n" for n, w in truth[1:]): (
            f"error: {labels}: no row for {truth[0][0]} (ImageId {Path(truth[0][0]).stem})"
        ),
    }
    for text, message in cases.items():
        if text is not None:
            labels.write_text(text)
        assert run(argv + ([] if text is None else ["--val-labels", str(labels)])) == 2
        err = capsys.readouterr().err
        assert err.startswith(message) and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()  # nothing written before the labels are right


def convert_cli(src: Path, out: Path, *extra: str) -> list[str]:
    return ["convert", "folder", str(src), "--out", str(out), "--train-shards", "2", "--validation-shards", "1", "--quiet", *extra]


def add_class(src: Path, name: str = "n00") -> None:
    for folder in ("train", "val"):
        (src / folder / name).mkdir()
        Image.fromarray(np.full((24, 24, 3), 128, dtype=np.uint8)).save(src / folder / name / "new.JPEG")


def test_convert_into_the_shards_of_another_source_refuses_or_rewrites_them_as_a_fresh_convert(tmp_path, capsys):
    """The issue's reproduction: a class added to the source, converted into the same --out.
    Without --force nothing changes and one line says what differs; with --force the
    folder ends byte for byte as a fresh conversion into an empty folder."""
    src, out, fresh = make_image_folder(tmp_path / "src"), tmp_path / "out", tmp_path / "fresh"
    shutil.rmtree(src / "train" / "n03")
    shutil.rmtree(src / "val" / "n03")
    assert run(convert_cli(src, out)) == 0
    before = digest(out)
    add_class(src)
    assert run(convert_cli(src, out)) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"error: {out}: holds the shards of another conversion (classes (2 -> 3; 'n01' -> 'n00')") and err.count("\n") == 1
    )
    assert "train: 6 records in 2 shards -> 7 in 2" in err and "--force" in err
    assert digest(out) == before
    assert run(convert_cli(src, out, "--force")) == 0
    assert "removed 7 files of another conversion" in capsys.readouterr().out
    assert run(convert_cli(src, fresh)) == 0
    assert digest(out) == digest(fresh)
    assert run(["verify", str(out), "--quiet"]) == 0


@pytest.mark.parametrize("change", ["content", "quality", "interrupted"])
def test_a_reconvert_keeps_shards_only_of_the_same_files_and_options(tmp_path, capsys, change):
    src, out = make_image_folder(tmp_path / "src"), tmp_path / "out"
    if change == "interrupted":  # a conversion of other files stopped after its first shards
        other = make_image_folder(tmp_path / "other", per_class=4)
        convert.convert_image_folder(other, out, train_shards=2, validation_shards=1, progress=False)
        (out / "dataset.json").replace(out / "dataset.json.partial")
        (out / "train-00001-of-00002").unlink()
        expected = "the source's files (names, sizes or modification times) or their labels"
    else:
        assert run(convert_cli(src, out)) == 0
    if change == "content":  # same names and classes, another picture
        image = src / "train" / "n01" / "img0.JPEG"
        Image.fromarray(np.zeros((50, 50, 3), dtype=np.uint8)).save(image, quality=90)
        expected = "the source's files (names, sizes or modification times) or their labels"
    before = digest(out)
    assert run(convert_cli(src, out, *(["--quality", "80"] if change == "quality" else []))) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("--quality 95 -> 80" if change == "quality" else expected) in err
    assert digest(out) == before


def test_shards_written_before_the_fingerprint_are_kept_when_dataset_json_agrees(tmp_path):
    """A folder converted by a largebatch without the fingerprint (its dataset.json lacks it)
    re-runs as before when classes, offset and counts agree; the fingerprint is added."""
    src, out = make_image_folder(tmp_path / "src"), tmp_path / "out"
    convert.convert_image_folder(src, out, train_shards=2, validation_shards=1, progress=False)
    meta = json.loads((out / "dataset.json").read_text())
    del meta["fingerprint"]
    (out / "dataset.json").write_text(json.dumps(meta))
    shard = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name.startswith("train-")}
    convert.convert_image_folder(src, out, train_shards=2, validation_shards=1, progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name.startswith("train-")} == shard
    assert "fingerprint" in json.loads((out / "dataset.json").read_text())


def test_verify_finds_shards_that_disagree_with_dataset_json(tmp_path, capsys):
    """dataset.json of one conversion beside the shards of another: the record counts
    disagree, though every label is in the range it gives."""
    src = make_image_folder(tmp_path / "src")
    convert.convert_image_folder(src, tmp_path / "old", train_shards=2, validation_shards=1, progress=False)
    add_class(src)
    convert.convert_image_folder(src, tmp_path / "new", train_shards=2, validation_shards=1, progress=False)
    shutil.copy(tmp_path / "new" / "dataset.json", tmp_path / "old" / "dataset.json")
    assert run(["verify", str(tmp_path / "old"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dataset.json says split 'train' has 10 records in 2 shards, its shards hold 9 in 2" in err


def test_a_damaged_dataset_json_beside_shards_is_refused_and_replaced_with_force(tmp_path, capsys):
    src, out, fresh = make_image_folder(tmp_path / "src"), tmp_path / "out", tmp_path / "fresh"
    assert run(convert_cli(src, out)) == 0
    (out / "dataset.json").write_text('{"classes": [')
    assert run(convert_cli(src, out)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dataset.json: not valid JSON" in err
    assert run(convert_cli(src, out, "--force")) == 0
    assert run(convert_cli(src, fresh)) == 0
    assert digest(out) == digest(fresh)
