"""Training stall per checkpoint, synchronous against asynchronous (``checkpoint.async_save``).

What it compares and how it times: BENCHMARKS.md, "Asynchronous checkpoints".

    OMP_NUM_THREADS=1 python bench/async_checkpoint.py [--rounds 3]
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: start again as the module (bench/common.py)
    __import__("common").run_as_module(__file__)

import argparse
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

from bench.common import BASE, load, machine_description, options, repo_env, rotated, run_or_fail, sets, table
from largebatch.engine.hook import Hook, Priority

SIDES = {"sync": False, "async": True, "sync again": False}


class SaveStopwatchHook(Hook):
    """Each step's time and the checkpoint hook's share of it (``state.hook_times``), written to ``out``."""

    priority = Priority.LOW + 1

    def __init__(self, out: str) -> None:
        super().__init__()
        self.out, self.steps, self.held = out, [], 0.0

    def before_run(self, state) -> None:
        state.hook_times = {}  # the engine times each hook call from here on

    def before_step(self, state) -> None:
        self.start = time.perf_counter()

    def after_step(self, state) -> None:
        held = state.hook_times.get(("CheckpointHook", "after_step"), [0, 0.0])[1]  # all its calls so far
        self.steps.append({"step": state.step, "held": held - self.held, "duration": time.perf_counter() - self.start})
        self.held = held

    def after_train(self, state) -> None:
        held_at_end = state.hook_times.get(("CheckpointHook", "after_train"), [0, 0.0])[1]
        if state.run.is_main:
            pathlib.Path(self.out).write_text(json.dumps({"steps": self.steps, "held_at_end": held_at_end}))


def overrides(args: argparse.Namespace, async_save: bool, record: pathlib.Path) -> dict:
    """The base config's overrides: ``args.model`` under fsdp with LAMB, a save every ``--interval`` steps, the stopwatch."""
    return {
        "max_steps": args.steps,
        "global_batch_size": 2,
        "micro_batch_size": 1,
        "clip_grad_norm": None,
        "model": {"name": args.model},
        "optimizer": {"type": "lamb", "lr": 1e-3, "weight_decay": 0.05},
        "lr_schedule.warmup_steps": None,
        "dist.strategy": "fsdp",
        "data.train_samples": 1024,
        "checkpoint": {"interval_epochs": 0, "at_end": False, "keep": 1, "interval_steps": args.interval, "async_save": async_save},
        "hooks": [{"type": f"{pathlib.Path(__file__).resolve()}:SaveStopwatchHook", "out": str(record)}],
    }


def side(args: argparse.Namespace, async_save: bool, scratch: pathlib.Path) -> dict:
    """One torchrun job of ``train.py --config bench/base.yaml --set ...``; what ``SaveStopwatchHook`` recorded."""
    folder = pathlib.Path(tempfile.mkdtemp(prefix="lbasync-", dir=scratch))
    try:
        record = folder / "clock.json"
        cmd = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py", "--config", str(BASE), "--run-dir"]
        cmd += [str(folder / "run"), *(arg for override in sets(overrides(args, async_save, record)) for arg in ("--set", override))]
        run_or_fail(cmd, {**repo_env(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
        return json.loads(record.read_text())
    finally:
        shutil.rmtree(folder)


def summary(record: dict, interval: int) -> dict[str, float]:
    """The stall of the first save, the mean of the later ones, the wait at the end, a step without a save."""
    held = [s["held"] for s in record["steps"] if s["step"] % interval == 0]
    others = [s["duration"] for s in record["steps"] if s["step"] % interval != 0 and s["step"] > 1]  # the first step warms up
    return {"first": held[0], "later": statistics.mean(held[1:]), "end": record["held_at_end"], "step": statistics.median(others)}


def main(argv: list[str] | None = None) -> int:
    model = ("vit_large_patch16_224", "timm model whose state is saved")
    parser = options(__doc__, rounds=3, model=model, steps=(9, "steps a side takes"), interval=(2, "checkpoint.interval_steps"))
    parser.add_argument("--scratch", default=None, help="where the run directories go (default: the system's temporary folder)")
    args = parser.parse_args(argv)
    if args.steps < 2 * args.interval + 1:
        parser.error("--steps must hold two saves and a step after them")
    scratch = pathlib.Path(args.scratch or tempfile.gettempdir())
    names, rounds, loads = list(SIDES), [], []
    for index in range(args.rounds):
        loads.append(load().split()[2])
        results = {name: summary(side(args, SIDES[name], scratch), args.interval) for name in rotated(names, index)}
        rounds.append(results)
        print(f"round {index + 1} (load {loads[-1]}): {json.dumps(results)}", file=sys.stderr, flush=True)

    saves = args.steps // args.interval
    print(f"Machine: {machine_description()}.\n")
    print(
        f"{args.model}, dist.strategy fsdp, LAMB, world size 2; {args.steps} steps, a checkpoint every {args.interval} "
        f"({saves} a side); {args.rounds} rounds, load average at each round's start {', '.join(loads)}.\n"
    )
    print("Seconds rank 0's loop is held by the checkpoint hook:\n")
    rows = [
        f"| {i} | {name} | " + " | ".join(f"{r[name][key]:.2f}" for key in ("first", "later", "end", "step")) + " |"
        for i, r in enumerate(rounds, 1)
        for name in names
    ]
    print(table("round | side | first save: | later saves (mean): | at the end: | step without a save (median):", rows))
    print()
    for label, key in (("later saves", "later"), ("first save", "first"), ("step", "step")):
        for name, side_name in ((f"async / sync {label}", "async"), (f"A/A sync again / sync {label}", "sync again")):
            values = [r[side_name][key] / r["sync"][key] for r in rounds]
            print(f"{name} = {statistics.median(values):.3f} (median; {min(values):.3f}-{max(values):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
