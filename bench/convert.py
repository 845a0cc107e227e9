"""``largebatch data convert`` and ``verify`` with several workers against one.

What it compares and how it times: BENCHMARKS.md, "Converting and verifying shards".

    python bench/convert.py [--images 2000] [--rounds 5] [--workers N] [--jobs folder verify fashion-mnist]
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: start again as the module (bench/common.py)
    __import__("common").run_as_module(__file__)

import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import image_shards, in_turn, load, machine_description, options, spread, table
from largebatch.shards import FASHION_MNIST_DIR, convert
from largebatch.shards.pool import default_workers
from largebatch.shards.verify import verify_split


def job_runners(work: Path, chosen: list[str]) -> dict[str, Callable[[int, Path], object]]:
    """Each chosen job as ``run(workers, scratch)``."""
    shards = work / "shards"

    def folder(workers: int, scratch: Path) -> object:
        return convert.convert_image_folder(work / "folder", scratch, train_shards=32, progress=False, workers=workers)

    def verify(workers: int, scratch: Path) -> object:
        return verify_split(shards, "train", num_classes=8, label_offset=1, progress=False, workers=workers)

    def fmnist(workers: int, scratch: Path) -> object:
        return convert.convert_fashion_mnist(scratch, progress=False, workers=workers)

    jobs = {"folder": ("convert folder", folder), "verify": ("verify (decode)", verify), "fashion-mnist": ("convert fashion-mnist", fmnist)}
    return dict(jobs[name] for name in chosen)


def timed(run: Callable[[int, Path], object], workers: int, work: Path) -> float:
    scratch = work / "scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    start = time.perf_counter()
    run(workers, scratch)
    return time.perf_counter() - start


def main() -> None:
    rounds, workers = (5, "counted rounds, after one warm-up round"), (default_workers(), "the parallel side's workers")
    parser = options(__doc__, images=(2000, "JPEGs in the generated folder"), rounds=rounds, workers=workers)
    jobs = ["folder", "verify", "fashion-mnist"]
    parser.add_argument("--jobs", nargs="+", choices=jobs, default=jobs, help="which (fashion-mnist: where Debian's package is installed)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-convert-"))
    try:
        image_shards(work, args.images, train_shards=32)
        if not (Path(FASHION_MNIST_DIR) / "train-images-idx3-ubyte.gz").is_file() and "fashion-mnist" in args.jobs:
            print(f"fashion-mnist skipped: not installed at {FASHION_MNIST_DIR}", file=sys.stderr)
            args.jobs.remove("fashion-mnist")
        jobs = job_runners(work, args.jobs)
        sides = {"one": 1, "many": args.workers, "A/A": 1}
        times: dict[str, dict[str, list[float]]] = {job: {side: [] for side in sides} for job in jobs}
        before = load()
        for round_number in range(args.rounds + 1):
            for job, run in jobs.items():
                for side in in_turn(list(sides), round_number):
                    seconds = timed(run, sides[side], work)
                    if round_number:  # the first round warms the page cache and the fork server
                        times[job][side].append(seconds)
        after = load()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"Machine: {machine_description()}.")
    print(f"{before} before, {after} after; {args.images} generated JPEGs, 32 shards.")
    rows, lines = [], []
    for job, sides_times in times.items():
        (speedup, low, high), (aa, aa_low, aa_high) = (
            spread([a / b for a, b in zip(sides_times["one"], sides_times[side])]) for side in ("many", "A/A")
        )
        one, many = statistics.median(sides_times["one"]), statistics.median(sides_times["many"])
        rows.append(f"| {job} | {one:.2f} | {many:.2f} | {speedup:.2f} [{low:.2f}, {high:.2f}] | {aa:.2f} [{aa_low:.2f}, {aa_high:.2f}] |")
        lines.append(f"{job}: 1 worker / {args.workers} workers = {speedup:.2f} (A/A 1 worker / 1 worker = {aa:.2f})")
    print("\n" + table(f"job | 1 worker, s | {args.workers} workers, s | 1 worker / {args.workers} workers [quartiles] | A/A", rows))
    print("\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
