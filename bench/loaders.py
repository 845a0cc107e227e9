"""Loader throughput, side by side on the same JPEGs: native, DALI CPU, ImageFolder + PIL.

What it compares and how it times: BENCHMARKS.md, "Loaders".

    python bench/loaders.py [--images 512] [--workers 2] [--batch 32] [--rounds 5] [--out FILE]
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: start again as the module (bench/common.py)
    __import__("common").run_as_module(__file__)

import contextlib
import functools
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

from bench.common import REPO, config, image_shards, load, machine_description, options, rotated, table, train_loader

CEILING = "decode only, 1 core x workers"
NATIVE, DALI, FOLDER = "native (TFRecord)", "DALI CPU (TFRecord)", "ImageFolder + PIL"
DECODE_STEP, DEVICE_STEP = "full-size decode (simplejpeg)", "normalise, contiguous NCHW uint8 batch (used)"


def run_config(root: Path, workers: int, batch: int, loader: str = "native"):
    """The shipped ViT-B/16 recipe (ImageNet's data settings) on the generated shards, resolved."""
    overrides = {"data.root": str(root), "data.loader": loader, "data.num_classes": 8, "data.num_workers": workers}
    return config({**overrides, "global_batch_size": batch, "micro_batch_size": batch}, base=REPO / "configs" / "vit-b16.py")


def tree_cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds of process ``pid`` (default: this one) and its descendants; 0 for one that is gone."""
    pid = pid or os.getpid()
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()  # after "pid (comm)"
    except OSError:
        return 0.0
    children = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            children += [int(child) for child in task.read_text().split()]
    # utime, stime, cutime, cstime
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK") + sum(tree_cpu_seconds(child) for child in children)


def time_epoch(loader, epoch: int) -> tuple[float, float, float]:
    """(images per second, CPU milliseconds per image, of which in the main process: the native
    loader's hand-over and device stage) over one epoch."""
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

    def scaled(i: int, fraction: float) -> None:
        height, width = simplejpeg.decode_jpeg_header(jpegs[i])[:2]
        simplejpeg.decode_jpeg(jpegs[i], min_height=math.ceil(height * fraction), min_width=math.ceil(width * fraction))

    def pil_decode(i: int) -> None:
        with Image.open(io.BytesIO(jpegs[i])) as image:
            image.convert("RGB").load()

    def pil_resize(i: int) -> None:
        left, top, w, h = boxes[i]
        np.asarray(pil[i].resize((size, size), Image.BILINEAR, box=(left, top, left + w, top + h)))

    def crop(i: int) -> torch.Tensor:
        """Image ``i``'s box as a 1x3xHxW uint8 view of the decoded pixels (channels last in memory)."""
        left, top, w, h = boxes[i]
        return torch.from_numpy(decoded[i])[top : top + h, left : left + w].permute(2, 0, 1)[None]

    def resize(images: torch.Tensor) -> torch.Tensor:
        return F.interpolate(images, size=(size, size), mode="bilinear", antialias=True)

    batch = torch.randint(0, 256, (32, size, size, 3), dtype=torch.uint8)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255
    channels_last, nchw = batch.permute(0, 3, 1, 2), batch.permute(0, 3, 1, 2).contiguous()
    dct_scales = {"7/8": 0.875, "3/4": 0.75, "1/2": 0.5, "1/4": 0.25}
    steps = [
        (DECODE_STEP, functools.partial(scaled, fraction=1.0)),
        ("full-size decode (Pillow)", pil_decode),
        *((f"decode at DCT scale {name}", functools.partial(scaled, fraction=fraction)) for name, fraction in dct_scales.items()),
        ("crop + resize, Pillow (antialiased bilinear)", pil_resize),
        ("crop + resize, torch uint8 antialias, channels-last view (used)", lambda i: resize(crop(i)).contiguous()),
        ("crop + resize, torch uint8 antialias, NCHW copy first", lambda i: resize(crop(i).contiguous()).contiguous()),
        ("crop + resize, torch float32 antialias", lambda i: resize(crop(i).float()).round_().clamp_(0, 255).to(torch.uint8)),
        (DEVICE_STEP, lambda i: i % 32 == 0 and nchw.float().sub_(mean).div_(std)),  # once per batch of 32
        ("normalise, channels-last uint8 batch", lambda i: i % 32 == 0 and channels_last.float().sub_(mean).div_(std)),
    ]

    def cost(run) -> float:
        """The best of 3 passes over the JPEGs, CPU ms per image."""
        passes = []
        for _ in range(3):
            start = time.process_time()
            for i in range(len(jpegs)):
                run(i)
            passes.append(time.process_time() - start)
        return min(passes) / len(jpegs) * 1e3

    return [(name, cost(run)) for name, run in steps]


def decode_share(steps: dict[str, float], total: float, in_main: float) -> str:
    """Full-size decoding's share of the native loader's CPU time: the whole, the host side, the workers'."""
    decode, device_stage = steps[DECODE_STEP], steps[DEVICE_STEP]
    rows = [
        ("all of it (the device stage included: on the CPU it runs in the main process)", total),
        (f"host side: all less the device stage ({device_stage:.3f} ms, the normalise step above)", total - device_stage),
        (f"worker processes only (all less the main process's {in_main:.2f} ms)", total - in_main),
    ]
    cells = [f"| {name} | {ms:.2f} | {decode / ms:.0%} |" for name, ms in rows]
    return "Full-size decoding's share of the native loader's CPU time (the decode step above over the native row's medians):\n\n" + table(
        "native loader's CPU time | ms/image: | full-size decode's share:", cells
    )


def main() -> None:
    parser = options(
        __doc__, images=512, workers=len(os.sched_getaffinity(0)), batch=32, rounds=(5, "counted rounds, after one warm-up round")
    )
    parser.add_argument("--subsampling", default="420", choices=["420", "422", "444"], help="JPEG chroma subsampling")
    parser.add_argument("--out", help="also write the markdown tables here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="bench-loaders-"))
    shards, cpu = image_shards(work, args.images, train_shards=8, subsampling=args.subsampling), torch.device("cpu")
    loaders = {NATIVE: train_loader(run_config(shards, args.workers, args.batch), cpu)}
    try:
        loaders[DALI] = train_loader(run_config(shards, args.workers, args.batch, "dali"), cpu)
    except Exception as err:  # noqa: BLE001 - report, keep the other rows
        print(f"DALI skipped: {err}", file=sys.stderr)
    loaders[FOLDER] = imagefolder_loader(work / "folder", args.workers, args.batch)
    decode_only = DecodeOnly(work / "folder", args.workers)
    sizes = [len(jpeg) for jpeg in decode_only.jpegs]
    load_before, per_round = load(), {name: [] for name in [CEILING, *loaders]}  # (images/s, CPU ms/image, of which main process)
    for round_number in range(args.rounds + 1):
        results = {name: time_epoch(loaders[name], round_number) for name in rotated(list(loaders), round_number)}
        results[CEILING] = decode_only.time()
        print(
            f"round {round_number}{' (warm-up)' if round_number == 0 else ''}: "
            + ", ".join(f"{n} {r:.0f} img/s {c:.2f} CPU-ms/img" for n, (r, c, _) in results.items()),
            file=sys.stderr,
        )
        if round_number:  # round 0 warms up
            for name, result in results.items():
                per_round[name].append(result)
    rates, cpu_ms, main_ms = ({name: [r[i] for r in values] for name, values in per_round.items()} for i in range(3))
    median = statistics.median

    def vs_native(name: str, values: dict[str, list[float]], invert: bool = False) -> str:
        """The median of the per-round ratios native / this (this / native with ``invert``)."""
        return "-" if name == NATIVE else f"{median([(b / a if invert else a / b) for a, b in zip(values[NATIVE], values[name])]):.2f}x"

    rows = [
        f"| {name} | {median(rates[name]):.0f} | {median(cpu_ms[name]):.2f} | {median(main_ms[name]):.2f} "
        f"| {vs_native(name, rates)} | {vs_native(name, cpu_ms, invert=True)} |"
        for name in per_round
    ]
    jpegs = decode_only.jpegs[:128]
    steps = step_costs(jpegs)
    text = "\n".join(
        [
            f"{len(sizes)} JPEGs, {min(sizes) // 1000}-{max(sizes) // 1000} kB (mean {sum(sizes) // len(sizes) // 1000} kB), "
            f"about 500x375, quality 90, chroma {args.subsampling}; 224x224 random-resized-crop (0.08-1, 3/4-4/3) + flip + "
            f"normalise to float NCHW; batch {args.batch}; {args.workers} worker processes (native, ImageFolder) / threads (DALI). "
            f"One warm-up round, then {args.rounds} rounds of one epoch per loader in rotating order; medians over the rounds.",
            "",
            table("loader | images/s: | CPU ms/image: | of which main process: | native images/s / this: | this CPU ms / native:", rows),
            "",
            "Ratios are medians of the per-round ratios; above 1x the native loader is faster (images/s) or cheaper (CPU per "
            "image). For the decode-only row they say what share of the ceiling the native loader reaches, and what share of "
            "its CPU time full-size decoding is.",
            "",
            f"Machine: {machine_description()}, simplejpeg {simplejpeg.__version__}.",
            f"Before the rounds: {load_before}; after: {load()}.",
            "",
            "Per round (images/s | CPU ms/image):",
            "",
            *(f"- {name}: " + ", ".join(f"{r:.0f} | {c:.2f}" for r, c in zip(rates[name], cpu_ms[name])) for name in per_round),
            "",
            f"Steps, CPU ms per image on one core (best of 3 passes over {len(jpegs)} of the JPEGs; random-resized-crop boxes):",
            "",
            table("step | CPU ms/image:", [f"| {name} | {ms:.3f} |" for name, ms in steps]),
            "",
            decode_share(dict(steps), median(cpu_ms[NATIVE]), median(main_ms[NATIVE])),
        ]
    )
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
