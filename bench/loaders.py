"""Loader throughput, side by side on the same JPEGs: native, DALI CPU, ImageFolder + PIL.

Generates ImageNet-like JPEGs (about 500x375, smooth noise with shapes), writes them both
as an image folder and as TFRecord shards, then times one epoch of 224x224
random-resized-crop + flip + normalise batches per loader (after one warm-up epoch),
with the same number of worker processes / threads for each. The decode-only ceiling is
one core's full-size simplejpeg decode rate times the worker count.

    python bench/loaders.py [--images 384] [--workers 2] [--batch 32] [--out bench/results/loaders.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import simplejpeg
import torch
from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from largebatch.batching import BatchPlan
from largebatch.data import convert, native


def make_images(folder: Path, count: int, classes: int = 8, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for i in range(count):
        width, height = int(rng.integers(440, 560)), int(rng.integers(330, 420))
        small = rng.integers(0, 256, size=(height // 24 + 2, width // 24 + 2, 3), dtype=np.uint8)
        image = Image.fromarray(small).resize((width, height), Image.BICUBIC)
        draw = ImageDraw.Draw(image)
        for _ in range(6):
            x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
            r = int(rng.integers(10, 120))
            draw.ellipse(
                (x - r, y - r, x + r, y + r),
                fill=tuple(int(c) for c in rng.integers(0, 256, 3)),
            )
        pixels = np.asarray(image).astype(np.int16) + rng.integers(-12, 13, size=(height, width, 3))
        out = folder / "train" / f"c{i % classes}"
        out.mkdir(parents=True, exist_ok=True)
        jpeg = simplejpeg.encode_jpeg(np.ascontiguousarray(pixels.clip(0, 255).astype(np.uint8)), quality=90)
        (out / f"img{i:05d}.JPEG").write_bytes(jpeg)


def data_cfg(root: Path, workers: int) -> dict:
    return {
        "root": str(root),
        "train_split": "train",
        "eval_split": "validation",
        "image_size": 224,
        "channels": 3,
        "num_classes": 8,
        "label_offset": 1,
        "mean": (0.485, 0.456, 0.406),
        "std": (0.229, 0.224, 0.225),
        "num_workers": workers,
        "prefetch": 2,
        "scale": (0.08, 1.0),
        "ratio": (3 / 4, 4 / 3),
        "hflip": 0.5,
        "eval_crop_ratio": 0.875,
        "verify_crc": True,
    }


def time_epochs(loader, epochs: int = 2) -> float:
    """Images per second over the last epoch (the first warms workers and caches up)."""
    rate = 0.0
    for epoch in range(epochs):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        count, start = 0, time.perf_counter()
        for images, _ in loader:
            count += images.shape[0]
        rate = count / (time.perf_counter() - start)
    return rate


def imagefolder_loader(folder: Path, workers: int, batch: int):
    from torchvision import datasets, transforms

    transform = transforms.Compose(
        [
            transforms.RandomResizedCrop(224),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ]
    )
    dataset = datasets.ImageFolder(str(folder / "train"), transform=transform)
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        persistent_workers=workers > 0,
    )


def decode_ceiling(shards: Path, workers: int) -> float:
    from largebatch.data.example import decode_example
    from largebatch.data.tfrecord import iter_records, list_shards

    jpegs = [
        decode_example(data, ["image/encoded"])["image/encoded"][0]
        for path in list_shards(shards, "train")
        for _, _, data in iter_records(path)
    ]
    start = time.perf_counter()
    for jpeg in jpegs:
        simplejpeg.decode_jpeg(jpeg)
    return len(jpegs) / (time.perf_counter() - start) * workers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=384)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="alternating timing rounds (best counts)")
    parser.add_argument("--out", help="also write the markdown table here")
    args = parser.parse_args()
    torch.set_num_threads(1)

    work = Path(tempfile.mkdtemp(prefix="bench-loaders-"))
    make_images(work / "folder", args.images)
    convert.convert_image_folder(work / "folder", work / "shards", train_shards=8, progress=False)
    count = native.count_samples({"root": str(work / "shards")}, "train")
    plan = BatchPlan.create(
        global_batch_size=args.batch,
        micro_batch_size=args.batch,
        world_size=1,
        num_samples=count,
    )
    cfg = data_cfg(work / "shards", args.workers)
    cpu = torch.device("cpu")

    loaders = {"native (TFRecord)": native.build_train_loader(cfg, plan, rank=0, seed=0, device=cpu)}
    try:
        from largebatch.data import dali

        loaders["DALI CPU (TFRecord)"] = dali.build_train_loader(cfg, plan, rank=0, seed=0, device=cpu)
    except Exception as err:  # noqa: BLE001 - report, keep the other rows
        print(f"DALI skipped: {err}", file=sys.stderr)
    loaders["ImageFolder + PIL"] = imagefolder_loader(work / "folder", args.workers, args.batch)
    # Rounds alternate between loaders so a busy neighbour slows all of them alike; best round counts.
    results = {"decode-only ceiling (1 core x workers)": 0.0} | dict.fromkeys(loaders, 0.0)
    for round_number in range(args.rounds):
        results["decode-only ceiling (1 core x workers)"] = max(
            results["decode-only ceiling (1 core x workers)"],
            decode_ceiling(work / "shards", args.workers),
        )
        for name, loader in loaders.items():
            results[name] = max(results[name], time_epochs(loader, epochs=2 if round_number == 0 else 1))
    base = results["ImageFolder + PIL"]
    dali_rate = results.get("DALI CPU (TFRecord)")
    lines = [
        (
            f"{count} JPEGs ~500x375 (q90), 224x224 random-resized-crop + flip + normalise, "
            f"batch {args.batch}, {args.workers} workers/threads; best epoch of {args.rounds} alternating rounds (after a warm-up epoch)."
        ),
        "",
        "| loader | images/s | vs ImageFolder+PIL | vs DALI CPU |",
        "|---|---:|---:|---:|",
    ]
    for name, rate in results.items():
        vs_dali = f"{rate / dali_rate:.2f}x" if dali_rate else "n/a"
        lines.append(f"| {name} | {rate:.0f} | {rate / base:.2f}x | {vs_dali} |")
    machine = f"{platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}, torch {torch.__version__}"
    lines += ["", f"Machine: {machine}."]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
