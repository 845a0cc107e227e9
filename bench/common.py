"""What every benchmark shares: the machine's description, configs built as a user builds
them, the rotation that times sides in turn, the ratios read over rounds, and the inputs.

Configs: ``bench/base.yaml`` with ``--set``-style overrides, through ``resolve_config`` and
``build_run`` as ``largebatch train --config bench/base.yaml --set key=value`` takes them.
Timing: sides take turns, one block each per round, the order reversed every other round
(``in_turn``); a ratio is the median of per-round ratios with its quartiles (``spread``),
read against an A/A control (one side timed twice, as two).

The benchmarks are modules (``python -m bench.x``); run as a file (``python bench/x.py``,
as BENCHMARKS.md writes the commands), one starts itself again as the module. Light at
import (no torch): ``bench/startup.py`` times commands against ``import torch``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

REPO = pathlib.Path(__file__).resolve().parents[1]
BASE = REPO / "bench" / "base.yaml"
CLASSES = 10  # the base config's synthetic classes
MODEL = {"model": "vit_tiny_patch16_224", "image_size": 32, "patch": 4, "depth": 12}  # options' model defaults
TIMED_OUT = 124  # the status of a child stopped at its time limit
T = TypeVar("T")


def repo_env(*paths: pathlib.Path) -> dict[str, str]:
    """This process's environment with the repository (and ``paths``) first on ``PYTHONPATH``."""
    first = [str(path) for path in (REPO, *paths)]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [*first, os.environ.get("PYTHONPATH")])))


def run_as_module(file: str) -> NoReturn:
    """``python bench/x.py ARGS`` becomes ``python -m bench.x ARGS`` (this process replaced)."""
    os.execve(sys.executable, [sys.executable, "-m", f"bench.{pathlib.Path(file).stem}", *sys.argv[1:]], repo_env())


# -- the machine ----------------------------------------------------------------------------


def machine_description() -> str:
    """CPU model, cores, memory, GPU, OS, Python, torch, timm and OMP_NUM_THREADS, in one line."""
    import torch

    cpu = platform.machine()
    memory = ""
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
        memory = f", {int(pathlib.Path('/proc/meminfo').read_text().split()[1]) / 2**20:.0f} GiB memory"
    except (OSError, ValueError, IndexError, StopIteration):
        pass
    try:
        import timm

        timm_version = f", timm {timm.__version__}"
    except ImportError:
        timm_version = ""
    gpu = "no GPU" if not torch.cuda.is_available() else f"GPU {torch.cuda.get_device_name(0)}"
    return (
        f"{cpu}, {os.cpu_count()} cores{memory}, {gpu}; {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}, torch {torch.__version__}{timm_version}; "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, {torch.get_num_threads()} torch threads"
    )


def load() -> str:
    """The load average (1, 5, 15 minutes), for a report's before and after."""
    try:
        return "load average " + " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "load average unknown"


def table(header: str, rows: Sequence[str] = ()) -> str:
    """A Markdown table: ``header`` (``"name | value:"``: a trailing ``:`` right-aligns a column) and ``rows``."""
    names = [name.strip() for name in header.split("|")]
    top = "| " + " | ".join(name.removesuffix(":") for name in names) + " |"
    rule = "|" + "|".join("---:" if name.endswith(":") else "---" for name in names) + "|"
    return "\n".join([top, rule, *rows])


# -- suites: benchmarks as children, one report ---------------------------------------------


def run_child(args: list[str], env: dict[str, str], timeout: float | None = None, log: pathlib.Path | None = None, label: str = ""):
    """``python ARGS`` in the repository: (the command, its status (124 at ``timeout``), stdout less
    ``done:`` lines and, failed, stderr's end, seconds). ``log`` gets both streams whole."""
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        status, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as err:
        status, stdout, stderr = (
            TIMED_OUT,
            _text(err.stdout),
            _text(err.stderr) + f"\nstopped after {timeout:.0f} s (the section's share of --budget)",
        )
    seconds, command = time.perf_counter() - start, shlex.join(["python", *args])
    if log is not None:
        with log.open("a") as f:
            f.write(f"===== {label}: `{command}` status {status}, {seconds:.1f} s\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n")
    stdout = "\n".join(line for line in stdout.splitlines() if not line.startswith("done: ")).strip()
    return command, status, stdout if status == 0 else f"{stdout}\n\n```\n{stderr[-4000:].strip()}\n```", seconds


def run_or_fail(args: list[str], env: dict[str, str] | None = None) -> None:
    """``python ARGS`` in the repository; when it fails, the end of its output printed and this process failed."""
    command, status, output, _ = run_child(args, env or repo_env())
    if status:
        print(f"\n{output}")
        raise SystemExit(f"`{command}` ended with status {status}")


def _text(stream: str | bytes | None) -> str:
    return stream.decode(errors="replace") if isinstance(stream, bytes) else stream or ""


def write_report(out: pathlib.Path, title: str, command: str, head: Sequence[str], summary: str, sections: Sequence[str]) -> None:
    """A suite's Markdown report: when and how it ran, the machine, ``head``, the summary table, each child's section."""
    when = f"Run {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC with `{command}`."
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join([f"# {title}", "", when, "", f"Machine: {machine_description()}.", "", *head, summary, "", *sections]))


# -- configs, as a user builds them ---------------------------------------------------------


def sets(overrides: dict[str, Any]) -> list[str]:
    """``--set`` arguments (``key.path=value``) for ``overrides``."""
    return [f"{key}={json.dumps(value)}" for key, value in overrides.items()]


def config(overrides: dict[str, Any], base: pathlib.Path = BASE):
    """The typed config of ``base`` with ``overrides``, as ``largebatch train`` resolves it."""
    from largebatch.config import resolve_config

    return resolve_config(base, sets(overrides))


def build_engine(overrides: dict[str, Any], run_dir: pathlib.Path):
    """The engine ``largebatch train --config bench/base.yaml --set ... --run-dir RUN_DIR`` trains with."""
    from largebatch.launch import build_run
    from largebatch.start import TrainArgs

    return build_run(TrainArgs(str(BASE), sets(overrides), run_dir=str(run_dir)))[0]


def model_overrides(args) -> dict[str, Any]:
    """The model and image size of ``options``' ``--model --patch --depth --image-size``."""
    return {"model": {"name": args.model, "patch_size": args.patch, "depth": args.depth}, "data.image_size": args.image_size}


def options(doc: str, **defaults: Any) -> argparse.ArgumentParser:
    """A benchmark's parser, described by its docstring's first line: ``--name`` for each
    default, typed as the default (``(default, help)`` to say more)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    for name, default in defaults.items():
        default, text = default if isinstance(default, tuple) else (default, None)
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default, help=text)
    return parser


def train_loader(cfg, device):
    """The training loader ``largebatch train`` builds for ``cfg`` in one process (rank 0, seed 0)."""
    from largebatch import data
    from largebatch.config import derive

    return data.build_train_loader(cfg.data, derive(cfg, 1, data.count_samples(cfg.data, "train")).plan, rank=0, seed=0, device=device)


def shard_data(root: pathlib.Path, image_size: int, workers: int) -> dict[str, Any]:
    """The data section for ``image_shards``: the native loader, random-resized-crop and flip."""
    # evaluation is off; the check that the eval split exists still runs
    data = {"loader": "native", "root": str(root), "eval_split": "train", "image_size": image_size, "num_classes": 8, "label_offset": 1}
    return data | {"num_workers": workers, "scale": [0.08, 1.0], "hflip": 0.5}


# -- timing ---------------------------------------------------------------------------------


def in_turn(sides: Sequence[T], round_: int) -> list[T]:
    """A round's order: as given in even rounds, reversed in odd ones."""
    return list(sides) if round_ % 2 == 0 else list(sides)[::-1]


def rotated(sides: Sequence[T], round_: int) -> list[T]:
    """A round's order when each side should lead in turn: rotated by the round."""
    start = round_ % len(sides)
    return [*sides[start:], *sides[:start]]


def time_blocks(
    steps: Sequence[Callable[[], object]], per_block: int, rounds: int, settle: Callable[[], None] = lambda: None
) -> list[list[list[float]]]:
    """Milliseconds per side, per round: a block of ``per_block`` calls after one untimed call, the
    blocks ``in_turn``; ``settle`` waits for queued device work after each call."""
    times: list[list[list[float]]] = [[] for _ in steps]
    for round_ in range(rounds):
        for index in in_turn(range(len(steps)), round_):
            steps[index]()
            settle()
            block = []
            for _ in range(per_block):
                start = time.perf_counter()
                steps[index]()
                settle()
                block.append((time.perf_counter() - start) * 1e3)
            times[index].append(block)
    return times


def spread(ratios: Sequence[float]) -> tuple[float, float, float]:
    """The median of per-round ratios and its quartiles."""
    if len(ratios) == 1:
        return ratios[0], ratios[0], ratios[0]
    q1, median, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return median, q1, q3


def per_round_ratio(blocks: Sequence[Sequence[float]], base: Sequence[Sequence[float]]) -> tuple[float, float, float]:
    """``spread`` of each round's block median over the base side's in the same round."""
    return spread([statistics.median(b) / statistics.median(o) for b, o in zip(blocks, base)])


def spread_text(ratios: Sequence[float], digits: int = 3) -> str:
    """``median (q1-q3)`` of per-round ratios."""
    median, q1, q3 = spread(ratios)
    return f"{median:.{digits}f}" if len(ratios) < 2 else f"{median:.{digits}f} ({q1:.{digits}f}-{q3:.{digits}f})"


# -- inputs ---------------------------------------------------------------------------------


class FixedBatches:
    """The loader contract over a fixed list of micro-batches (the same list each epoch)."""

    def __init__(self, batches, num_classes: int = CLASSES) -> None:
        self.batches, self.num_classes, self.num_samples = batches, num_classes, 0

    def __len__(self) -> int:
        return len(self.batches)

    def set_epoch(self, epoch: int) -> None:
        pass

    def __iter__(self):
        import itertools

        return itertools.cycle(self.batches)  # the engine takes as many as its plan says

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def random_batches(count: int, micro: int, image_size: int, device: Any = "cpu") -> list:
    """``count`` seeded micro-batches of random images and labels of the base config's classes."""
    import torch

    torch.manual_seed(0)
    shape = (micro, 3, image_size, image_size)
    return [(torch.randn(shape, device=device), torch.randint(CLASSES, (micro,), device=device)) for _ in range(count)]


def make_images(folder: pathlib.Path, count: int, subsampling: str = "420", classes: int = 8, seed: int = 0) -> None:
    """ImageNet-like JPEGs (about 500x375, smooth noise with shapes, quality 90) in ``folder/train/c<label>``."""
    import numpy as np
    import simplejpeg
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    for i in range(count):
        width, height = int(rng.integers(440, 560)), int(rng.integers(330, 420))
        small = rng.integers(0, 256, size=(height // 24 + 2, width // 24 + 2, 3), dtype=np.uint8)
        image = Image.fromarray(small).resize((width, height), Image.BICUBIC)
        draw = ImageDraw.Draw(image)
        for _ in range(6):
            x, y, r = int(rng.integers(0, width)), int(rng.integers(0, height)), int(rng.integers(10, 120))
            draw.ellipse((x - r, y - r, x + r, y + r), fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
        pixels = np.asarray(image).astype(np.int16) + rng.integers(-12, 13, size=(height, width, 3))
        out = folder / "train" / f"c{i % classes}"
        out.mkdir(parents=True, exist_ok=True)
        pixels = np.ascontiguousarray(pixels.clip(0, 255).astype(np.uint8))
        (out / f"img{i:05d}.JPEG").write_bytes(simplejpeg.encode_jpeg(pixels, quality=90, colorsubsampling=subsampling))


def image_shards(work: pathlib.Path, count: int, train_shards: int = 4, subsampling: str = "420") -> pathlib.Path:
    """``make_images`` into ``work/folder``, converted into ``train_shards`` TFRecord shards in ``work/shards``."""
    from largebatch.shards import convert

    make_images(work / "folder", count, subsampling)
    convert.convert_image_folder(work / "folder", work / "shards", train_shards=train_shards, progress=False)
    return work / "shards"
