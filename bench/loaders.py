"""Loader throughput, side by side on the same JPEGs: native, DALI CPU, ImageFolder + PIL.

Generates ImageNet-like JPEGs (about 500x375, smooth noise with shapes, quality 90, 4:2:0
chroma like most camera and web JPEGs), writes them both as an image folder and as
TFRecord shards, then times epochs of 224x224 random-resized-crop + flip + normalise
batches per loader, with the same number of worker processes / threads for each.

Each round times one epoch of every loader, in an order that rotates between rounds, so
a busy neighbour on a shared machine slows all of them alike; the first round is a
warm-up and is not counted. Two measures per epoch: images per wall-clock second, and CPU
milliseconds per image summed over the process, its threads and its worker processes
(read from /proc, so live DataLoader workers count), which load from other jobs inflates
far less than wall time. The tables give the median over the counted rounds, and the
median of the per-round ratios.

The decode-only ceiling is one core's full-size simplejpeg decode rate (CPU time) times
the worker count: what the workers could deliver if decoding were all they did.

    python bench/loaders.py [--images 512] [--workers 2] [--batch 32] [--rounds 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
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

CEILING = "decode only, 1 core x workers"
NATIVE, DALI, FOLDER = "native (TFRecord)", "DALI CPU (TFRecord)", "ImageFolder + PIL"


def make_images(folder: Path, count: int, subsampling: str, classes: int = 8, seed: int = 0) -> None:
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
        jpeg = simplejpeg.encode_jpeg(
            np.ascontiguousarray(pixels.clip(0, 255).astype(np.uint8)),
            quality=90,
            colorsubsampling=subsampling,
        )
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


_TICK = os.sysconf("SC_CLK_TCK")


def _proc_times(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds of the process's threads and reaped children), None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    # fields[1] is ppid; utime, stime, cutime, cstime are fields[11:15].
    return int(fields[1]), sum(int(x) for x in fields[11:15]) / _TICK


def _children(pid: int) -> list[int]:
    kids = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            kids += [int(x) for x in children.read_text().split()]
        except OSError:
            pass
    return kids


def tree_cpu_seconds() -> float:
    """CPU seconds used by this process (all threads) and all its descendants, live or reaped."""
    total, pending = 0.0, [os.getpid()]
    while pending:
        pid = pending.pop()
        if (times := _proc_times(pid)) is not None:
            total += times[1]
            pending += _children(pid)
    return total


def time_epoch(loader, epoch: int) -> tuple[float, float]:
    """(images per second, CPU milliseconds per image) over one epoch."""
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(epoch)
    count = 0
    cpu, start = tree_cpu_seconds(), time.perf_counter()
    for images, _ in loader:
        count += images.shape[0]
    wall, cpu = time.perf_counter() - start, tree_cpu_seconds() - cpu
    return count / wall, cpu / count * 1e3


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


class DecodeOnly:
    """Full-size decode of every JPEG on one core: the ceiling, timed like a loader."""

    def __init__(self, folder: Path, workers: int) -> None:
        self.jpegs = [path.read_bytes() for path in sorted(folder.rglob("*.JPEG"))]
        self.workers = workers

    def time(self) -> tuple[float, float]:
        start = time.process_time()
        for jpeg in self.jpegs:
            simplejpeg.decode_jpeg(jpeg)
        per_image = (time.process_time() - start) / len(self.jpegs)
        return self.workers / per_image, per_image * 1e3


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{model}, {len(os.sched_getaffinity(0))} cores (shared), Python {platform.python_version()}, "
        f"torch {torch.__version__}, simplejpeg {simplejpeg.__version__}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5, help="counted rounds, after one warm-up round")
    parser.add_argument("--subsampling", default="420", choices=["420", "422", "444"], help="JPEG chroma subsampling")
    parser.add_argument("--out", help="also write the markdown tables here")
    args = parser.parse_args()
    torch.set_num_threads(1)

    work = Path(tempfile.mkdtemp(prefix="bench-loaders-"))
    make_images(work / "folder", args.images, args.subsampling)
    convert.convert_image_folder(work / "folder", work / "shards", train_shards=8, progress=False)
    count = native.count_samples({"root": str(work / "shards")}, "train")
    plan = BatchPlan.create(global_batch_size=args.batch, micro_batch_size=args.batch, world_size=1, num_samples=count)
    cfg = data_cfg(work / "shards", args.workers)
    cpu = torch.device("cpu")
    sizes = [p.stat().st_size for p in (work / "folder").rglob("*.JPEG")]

    loaders = {NATIVE: native.build_train_loader(cfg, plan, rank=0, seed=0, device=cpu)}
    try:
        from largebatch.data import dali

        loaders[DALI] = dali.build_train_loader(cfg, plan, rank=0, seed=0, device=cpu)
    except Exception as err:  # noqa: BLE001 - report, keep the other rows
        print(f"DALI skipped: {err}", file=sys.stderr)
    loaders[FOLDER] = imagefolder_loader(work / "folder", args.workers, args.batch)
    decode_only = DecodeOnly(work / "folder", args.workers)

    load_before = os.getloadavg()
    rates: dict[str, list[float]] = {name: [] for name in [CEILING, *loaders]}
    cpu_ms: dict[str, list[float]] = {name: [] for name in rates}
    names = list(loaders)
    for round_number in range(args.rounds + 1):
        order = names[round_number % len(names) :] + names[: round_number % len(names)]
        results = {name: time_epoch(loaders[name], round_number) for name in order}
        results[CEILING] = decode_only.time()
        print(
            f"round {round_number}{' (warm-up)' if round_number == 0 else ''}: "
            + ", ".join(f"{n} {r:.0f} img/s {c:.2f} CPU-ms/img" for n, (r, c) in results.items()),
            file=sys.stderr,
        )
        if round_number == 0:
            continue
        for name, (rate, ms) in results.items():
            rates[name].append(rate)
            cpu_ms[name].append(ms)
    load_after = os.getloadavg()

    def ratio(name: str, base: str, values: dict[str, list[float]], invert: bool = False) -> str:
        if base not in values or not values[base]:
            return "n/a"
        per_round = [(b / a if invert else a / b) for a, b in zip(values[name], values[base])]
        return f"{statistics.median(per_round):.2f}x"

    median = statistics.median
    lines = [
        (
            f"{count} JPEGs, {min(sizes) // 1000}-{max(sizes) // 1000} kB (mean {sum(sizes) // len(sizes) // 1000} kB), "
            f"about 500x375, quality 90, chroma {args.subsampling}; 224x224 random-resized-crop "
            f"(0.08-1, 3/4-4/3) + flip + normalise to float NCHW; batch {args.batch}; "
            f"{args.workers} worker processes (native, ImageFolder) / threads (DALI). One warm-up round, then "
            f"{args.rounds} rounds of one epoch per loader in rotating order; medians over the rounds."
        ),
        "",
        "| loader | images/s | CPU ms/image | native images/s / this | this CPU ms / native |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in rates:
        if name == NATIVE:
            vs = "-", "-"
        else:
            vs = ratio(NATIVE, name, rates), ratio(NATIVE, name, cpu_ms, invert=True)
        lines.append(f"| {name} | {median(rates[name]):.0f} | {median(cpu_ms[name]):.2f} | {vs[0]} | {vs[1]} |")
    lines += [
        "",
        (
            "Ratios are medians of the per-round ratios; above 1x the native loader is faster (images/s) "
            "or cheaper (CPU per image). For the decode-only row they say what share of the ceiling "
            "the native loader reaches, and what share of its CPU time full-size decoding is."
        ),
        "",
        f"Machine: {machine()}.",
        f"Load average (1/5/15 min): {'/'.join(f'{x:.1f}' for x in load_before)} before, {'/'.join(f'{x:.1f}' for x in load_after)} after.",
        "",
        "Per round (images/s | CPU ms/image):",
        "",
    ]
    for name in rates:
        lines.append(f"- {name}: " + ", ".join(f"{r:.0f} | {c:.2f}" for r, c in zip(rates[name], cpu_ms[name])))
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
