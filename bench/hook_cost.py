"""Hook cost: optimizer-step time of the engine with its default hooks against no hooks.

Three engines over the same model, optimizer and pre-made micro-batches, in interleaved
rounds within one process (the order rotates each round, so drift in the machine's
load hits all three):

* ``none``: the engine with an empty hook list;
* ``defaults``: the hooks ``largebatch.hooks.build_hooks`` gives a config that lists none
  (``DEFAULT_HOOKS``, whatever it holds; checkpoints off, no clipping, logging every
  ``log.interval`` steps as the schema's default);
* ``defaults, timed``: the same, with each hook call timed (``perf_counter`` around it),
  to see where the time goes.

Each optimizer step is timed around the engine's ``_train_step`` (once-per-run work such
as opening the log file is not counted). Per round, the mean step time of ``defaults``
over that of ``none``; reported: the median of those ratios over rounds, the median
step times, and the time inside each hook per step.

    OMP_NUM_THREADS=1 python bench/hook_cost.py [--rounds 7] [--steps 20] [--device cpu]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

import torch
import yaml

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import engine_overhead  # noqa: E402
from engine_overhead import FixedBatches  # noqa: E402

from largebatch.engine.engine import Engine  # noqa: E402
from largebatch.engine.hook import HookError  # noqa: E402
from largebatch.launch import TrainArgs, build_run  # noqa: E402


class StepTimedEngine(Engine):
    """The engine, recording each optimizer step's wall time (and, if asked, each hook call's)."""

    def __init__(self, *args, time_hooks: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.step_seconds: list[float] = []
        self.hook_seconds: collections.Counter[str] = collections.Counter()
        self.time_hooks = time_hooks
        self._sync = self.state.backend.synchronize if hasattr(self.state.backend, "synchronize") else lambda: None

    def _train_step(self, batches, window: int) -> None:
        self._sync()
        start = time.perf_counter()
        super()._train_step(batches, window)
        self._sync()
        self.step_seconds.append(time.perf_counter() - start)

    def fire(self, event) -> None:
        if not self.time_hooks:
            return super().fire(event)
        for hook in self._by_event[event]:
            start = time.perf_counter()
            try:
                getattr(hook, event.value)(self.state)
            except Exception as exc:
                raise HookError(f"hook {hook.name} failed in {event.value}: {exc}") from exc
            self.hook_seconds[hook.name] += time.perf_counter() - start


def make_config(args) -> dict:
    """The engine-overhead bench's config, without clipping, logging at the schema's default interval."""
    cfg = engine_overhead.make_config(args, 4 * args.steps)
    cfg.update(device=args.device, max_steps=args.steps, clip_grad_norm=0, log={"console": False})
    return cfg


def run_round(config_path: pathlib.Path, run_dir: pathlib.Path, batches, variant: str) -> StepTimedEngine:
    built, hooks = build_run(TrainArgs(str(config_path), run_dir=str(run_dir)))
    engine = StepTimedEngine(
        built.state, [] if variant == "none" else hooks, FixedBatches(batches, 10), time_hooks=variant == "defaults, timed"
    )
    with contextlib.redirect_stdout(io.StringIO()):  # the logger's closing line
        engine.run()
    return engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--micro", type=int, default=32)
    parser.add_argument("--accumulation", type=int, default=2)
    parser.add_argument("--model", default="vit_tiny_patch16_224")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--patch", type=int, default=4)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = "cuda" if args.device == "cuda" else "cpu"
    batches = [
        (torch.randn(args.micro, 3, args.image_size, args.image_size, device=device), torch.randint(10, (args.micro,), device=device))
        for _ in range(args.accumulation * 4)
    ]
    variants = ["none", "defaults", "defaults, timed"]
    steps = {v: [] for v in variants}
    ratios, hook_seconds, hook_names = [], collections.Counter(), []
    with tempfile.TemporaryDirectory() as tmp:
        config_path = pathlib.Path(tmp) / "bench.yaml"
        config_path.write_text(yaml.safe_dump(make_config(args)))
        run_round(config_path, pathlib.Path(tmp) / "warmup", batches, "defaults")  # warm caches and allocators
        for i in range(args.rounds):
            means = {}
            for variant in variants[i % 3 :] + variants[: i % 3]:
                engine = run_round(config_path, pathlib.Path(tmp) / f"r{i}-{variant[:4]}", batches, variant)
                timed = engine.step_seconds[1:]  # the first step of a fresh engine warms up
                steps[variant] += timed
                means[variant] = statistics.fmean(timed)
                if engine.time_hooks:
                    hook_seconds.update(engine.hook_seconds)
                    hook_names = [h.name for h in engine.hooks]
            ratios.append(means["defaults"] / means["none"])
    total_steps = args.rounds * args.steps
    median_step = {v: statistics.median(s) for v, s in steps.items()}
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, torch {torch.__version__}, device {args.device}"
    )
    print(
        f"model {args.model} depth {args.depth}, {args.image_size}px patch {args.patch}, micro {args.micro} x accumulation "
        f"{args.accumulation}, {args.steps} steps x {args.rounds} rounds; default hooks: {', '.join(hook_names)}"
    )
    print()
    print("| engine | median step (ms) | mean step (ms) |")
    print("|---|---:|---:|")
    for variant in variants:
        print(f"| {variant} | {median_step[variant] * 1e3:.2f} | {statistics.fmean(steps[variant]) * 1e3:.2f} |")
    print()
    print(f"defaults / none, mean step time per round: {', '.join(f'{r:.4f}' for r in ratios)}")
    print(f"median ratio: {statistics.median(ratios):.4f} ({(statistics.median(ratios) - 1) * 100:+.2f}%)")
    print()
    print("| hook | time inside per step (ms) | share of the 'none' median step |")
    print("|---|---:|---:|")
    inside = 0.0
    for name, seconds in hook_seconds.most_common():
        per_step = seconds / total_steps
        inside += per_step
        print(f"| {name} | {per_step * 1e3:.3f} | {per_step / median_step['none'] * 100:.3f}% |")
    print(f"| all hooks | {inside * 1e3:.3f} | {inside / median_step['none'] * 100:.3f}% |")


if __name__ == "__main__":
    main()
