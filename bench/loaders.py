"""Loader throughput, side by side on the same JPEGs: native, DALI CPU, ImageFolder + PIL.

What it compares and how it times: BENCHMARKS.md, "Loaders".

    python bench/loaders.py [--images 512] [--workers 2] [--batch 32] [--rounds 5] [--out FILE]
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: start again as the module (bench/common.py)
    __import__("common").run_as_module(__file__)

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import simplejpeg
import torch
from PIL import Image

from bench.common import REPO, config, image_shards, load, machine_description, rotated
from largebatch import data as data_mod
from largebatch.config import derive

CEILING = "decode only, 1 core x workers"
NATIVE, DALI, FOLDER = "native (TFRecord)", "DALI CPU (TFRecord)", "ImageFolder + PIL"
DECODE_STEP, DEVICE_STEP = "full-size decode (simplejpeg)", "normalise, contiguous NCHW uint8 batch (used)"


def run_config(root: Path, workers: int, batch: int):
    """The shipped ViT-B/16 recipe (ImageNet's data settings: 224 px, random-resized-crop,
    flip, labels from 1) on the generated shards, resolved as ``largebatch train`` resolves it."""
    overrides = {"data.root": str(root), "data.loader": "native", "data.num_classes": 8, "data.num_workers": workers}
    return config({**overrides, "global_batch_size": batch, "micro_batch_size": batch}, base=REPO / "configs" / "vit-b16.py")


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


def time_epoch(loader, epoch: int) -> tuple[float, float, float]:
    """(images per second, CPU milliseconds per image, of which in the main process) over
    one epoch. The main process's share is its own threads' CPU time: for the native
    loader, the hand-over and the device stage (float conversion and normalisation, on
    the GPU when there is one); the rest is the worker processes'."""
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(epoch)
    count = 0
    cpu, main, start = tree_cpu_seconds(), time.process_time(), time.perf_counter()
    for images, _ in loader:
        count += images.shape[0]
    wall, cpu, main = time.perf_counter() - start, tree_cpu_seconds() - cpu, time.process_time() - main
    return count / wall, cpu / count * 1e3, main / count * 1e3


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
        dataset, batch_size=batch, shuffle=True, drop_last=True, num_workers=workers, persistent_workers=workers > 0
    )


class DecodeOnly:
    """Full-size decode of every JPEG on one core: the ceiling, timed like a loader."""

    def __init__(self, folder: Path, workers: int) -> None:
        self.jpegs = [path.read_bytes() for path in sorted(folder.rglob("*.JPEG"))]
        self.workers = workers

    def time(self) -> tuple[float, float, float]:
        start = time.process_time()
        for jpeg in self.jpegs:
            simplejpeg.decode_jpeg(jpeg)
        per_image = (time.process_time() - start) / len(self.jpegs)
        return self.workers / per_image, per_image * 1e3, per_image * 1e3


def step_costs(jpegs: list[bytes], size: int = 224) -> list[tuple[str, float]]:
    """CPU milliseconds per image of the native loader's steps and their alternatives, one core."""
    import io
    import math

    import torch.nn.functional as F

    from largebatch.data.decode import random_resized_crop_box
    from largebatch.randomness import AUGMENTATION_DRAWS

    rng = np.random.default_rng(0)
    boxes = [random_resized_crop_box(*simplejpeg.decode_jpeg_header(j)[:2], rng.random(AUGMENTATION_DRAWS)) for j in jpegs]
    decoded = [simplejpeg.decode_jpeg(j) for j in jpegs]
    pil = [Image.fromarray(d) for d in decoded]

    def scaled(fraction):
        def run(i):
            height, width = simplejpeg.decode_jpeg_header(jpegs[i])[:2]
            simplejpeg.decode_jpeg(jpegs[i], min_height=math.ceil(height * fraction), min_width=math.ceil(width * fraction))

        return run

    def pil_decode(i):
        with Image.open(io.BytesIO(jpegs[i])) as image:
            image.convert("RGB").load()

    def pil_resize(i):
        left, top, w, h = boxes[i]
        np.asarray(pil[i].resize((size, size), Image.BILINEAR, box=(left, top, left + w, top + h)))

    def torch_resize(layout):
        def run(i):
            left, top, w, h = boxes[i]
            crop = torch.from_numpy(decoded[i])[top : top + h, left : left + w].permute(2, 0, 1)[None]
            if layout == "float":
                out = F.interpolate(crop.float(), size=(size, size), mode="bilinear", antialias=True)
                out.round_().clamp_(0, 255).to(torch.uint8)
                return
            if layout == "NCHW":
                crop = crop.contiguous()
            F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True).contiguous()

        return run

    batch = torch.randint(0, 256, (32, size, size, 3), dtype=torch.uint8)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255
    channels_last, nchw = batch.permute(0, 3, 1, 2), batch.permute(0, 3, 1, 2).contiguous()

    def normalise(images):
        def run(i):
            if i % 32 == 0:
                images.float().sub_(mean).div_(std)

        return run

    steps = [
        (DECODE_STEP, scaled(1.0)),
        ("full-size decode (Pillow)", pil_decode),
        ("decode at DCT scale 7/8", scaled(0.875)),
        ("decode at DCT scale 3/4", scaled(0.75)),
        ("decode at DCT scale 1/2", scaled(0.5)),
        ("decode at DCT scale 1/4", scaled(0.25)),
        ("crop + resize, Pillow (antialiased bilinear)", pil_resize),
        ("crop + resize, torch uint8 antialias, channels-last view (used)", torch_resize("view")),
        ("crop + resize, torch uint8 antialias, NCHW copy first", torch_resize("NCHW")),
        ("crop + resize, torch float32 antialias", torch_resize("float")),
        (DEVICE_STEP, normalise(nchw)),
        ("normalise, channels-last uint8 batch", normalise(channels_last)),
    ]
    out = []
    for name, run in steps:
        best = math.inf
        for _ in range(3):
            start = time.process_time()
            for i in range(len(jpegs)):
                run(i)
            best = min(best, time.process_time() - start)
        out.append((name, best / len(jpegs) * 1e3))
    return out


def decode_share(steps: dict[str, float], total: float, in_main: float) -> list[str]:
    """Where the native loader's CPU time goes, against its full-size decode cost: its
    share of the whole, of the host side (the whole less the device stage, which runs on
    the GPU when there is one) and of the worker processes'."""
    decode, device_stage = steps[DECODE_STEP], steps[DEVICE_STEP]
    host, workers = total - device_stage, total - in_main
    return [
        "Full-size decoding's share of the native loader's CPU time (the decode step above over the native row's medians):",
        "",
        "| native loader's CPU time | ms/image | full-size decode's share |",
        "|---|---:|---:|",
        f"| all of it (the device stage included: on the CPU it runs in the main process) | {total:.2f} | {decode / total:.0%} |",
        f"| host side: all less the device stage ({device_stage:.3f} ms, the normalise step above) | {host:.2f} | {decode / host:.0%} |",
        f"| worker processes only (all less the main process's {in_main:.2f} ms) | {workers:.2f} | {decode / workers:.0%} |",
    ]


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
    cfg = run_config(image_shards(work, args.images, train_shards=8, subsampling=args.subsampling), args.workers, args.batch)
    count = data_mod.count_samples(cfg.data, "train")
    plan = derive(cfg, 1, count).plan
    cpu = torch.device("cpu")
    sizes = [p.stat().st_size for p in (work / "folder").rglob("*.JPEG")]

    loaders = {NATIVE: data_mod.build_train_loader(cfg.data, plan, rank=0, seed=0, device=cpu)}
    try:
        loaders[DALI] = data_mod.build_train_loader(dataclasses.replace(cfg.data, loader="dali"), plan, rank=0, seed=0, device=cpu)
    except Exception as err:  # noqa: BLE001 - report, keep the other rows
        print(f"DALI skipped: {err}", file=sys.stderr)
    loaders[FOLDER] = imagefolder_loader(work / "folder", args.workers, args.batch)
    decode_only = DecodeOnly(work / "folder", args.workers)

    load_before = load()
    rates: dict[str, list[float]] = {name: [] for name in [CEILING, *loaders]}
    cpu_ms: dict[str, list[float]] = {name: [] for name in rates}
    main_ms: dict[str, list[float]] = {name: [] for name in rates}
    names = list(loaders)
    for round_number in range(args.rounds + 1):
        results = {name: time_epoch(loaders[name], round_number) for name in rotated(names, round_number)}
        results[CEILING] = decode_only.time()
        print(
            f"round {round_number}{' (warm-up)' if round_number == 0 else ''}: "
            + ", ".join(f"{n} {r:.0f} img/s {c:.2f} CPU-ms/img" for n, (r, c, _) in results.items()),
            file=sys.stderr,
        )
        if round_number == 0:
            continue
        for name, (rate, ms, in_main) in results.items():
            rates[name].append(rate)
            cpu_ms[name].append(ms)
            main_ms[name].append(in_main)
    load_after = load()

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
        "| loader | images/s | CPU ms/image | of which main process | native images/s / this | this CPU ms / native |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in rates:
        if name == NATIVE:
            vs = "-", "-"
        else:
            vs = ratio(NATIVE, name, rates), ratio(NATIVE, name, cpu_ms, invert=True)
        lines.append(
            f"| {name} | {median(rates[name]):.0f} | {median(cpu_ms[name]):.2f} | {median(main_ms[name]):.2f} | {vs[0]} | {vs[1]} |"
        )
    lines += [
        "",
        (
            "Ratios are medians of the per-round ratios; above 1x the native loader is faster (images/s) "
            "or cheaper (CPU per image). For the decode-only row they say what share of the ceiling "
            "the native loader reaches, and what share of its CPU time full-size decoding is."
        ),
        "",
        f"Machine: {machine_description()}, simplejpeg {simplejpeg.__version__}.",
        f"Before the rounds: {load_before}; after: {load_after}.",
        "",
        "Per round (images/s | CPU ms/image):",
        "",
    ]
    for name in rates:
        lines.append(f"- {name}: " + ", ".join(f"{r:.0f} | {c:.2f}" for r, c in zip(rates[name], cpu_ms[name])))
    jpegs = decode_only.jpegs[:128]
    lines += [
        "",
        f"Steps, CPU ms per image on one core (best of 3 passes over {len(jpegs)} of the JPEGs; random-resized-crop boxes):",
        "",
        "| step | CPU ms/image |",
        "|---|---:|",
    ]
    steps = step_costs(jpegs)
    lines += [f"| {name} | {ms:.3f} |" for name, ms in steps]
    lines += ["", *decode_share(dict(steps), median(cpu_ms[NATIVE]), median(main_ms[NATIVE]))]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
