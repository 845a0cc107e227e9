"""Cost of the built-in hooks: images/s of the engine with different hook sets, side by side.

Every variant trains the same model (LAMB, clipping on) on the same pre-made
micro-batches, in alternating rounds within one process; only the hooks differ:

* ``minimal``: the default hooks without ``nan_guard`` and ``grad_norm``;
* ``defaults``: the default hooks (``nan_guard``, ``grad_norm`` and ``lr`` included);
* ``all``: the defaults plus ``memory``, ``trust_ratio``, ``hook_timer`` and ``csv``.

Reported: the median images/s of each and its ratio to ``minimal``. On a CPU a host sync
is free (kernels run synchronously), so this measures the hooks' compute and Python cost,
not the stall a sync causes on an accelerator.

    OMP_NUM_THREADS=1 python bench/hook_costs.py [--rounds 5] [--steps 20] [--log-interval 10]
"""

from __future__ import annotations

import argparse
import pathlib
import platform
import statistics
import sys
import tempfile
import time

import torch
import yaml

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import engine_overhead  # noqa: E402
from engine_overhead import FixedBatches  # noqa: E402

from largebatch.engine.engine import Engine  # noqa: E402
from largebatch.launch import TrainArgs, build_run  # noqa: E402

EXTRA = ["memory", "trust_ratio", "hook_timer", "csv"]
VARIANTS = {"minimal": ("NanGuardHook", "GradNormHook"), "defaults": (), "all": ()}


def make_config(args, extra_hooks: list[str]) -> dict:
    """``engine_overhead``'s config (vit_tiny, 32 px, clipping) with LAMB and these hooks."""
    base = argparse.Namespace(**vars(args), model="vit_tiny_patch16_224", image_size=32, patch=4)
    cfg = engine_overhead.make_config(base, args.steps)
    cfg["optimizer"] = {"type": "lamb", "lr": 1e-3, "weight_decay": 0.05}
    cfg["log"]["interval"] = args.log_interval
    cfg["hooks"] = extra_hooks
    return cfg


def run_round(config_path: pathlib.Path, run_dir: pathlib.Path, batches, drop: tuple[str, ...]) -> float:
    engine, hooks = build_run(TrainArgs(str(config_path), run_dir=str(run_dir)))
    kept = [h for h in hooks if h.name not in drop]
    engine = Engine(engine.state, kept, FixedBatches(batches, 10))
    start = time.perf_counter()
    engine.run()
    return engine.state.samples_seen / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--micro", type=int, default=16)
    parser.add_argument("--accumulation", type=int, default=2)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--log-interval", type=int, default=10)
    args = parser.parse_args()
    torch.manual_seed(0)
    batches = [(torch.randn(args.micro, 3, 32, 32), torch.randint(10, (args.micro,))) for _ in range(args.steps * args.accumulation)]
    rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        configs = {}
        for name in VARIANTS:
            configs[name] = pathlib.Path(tmp) / f"{name}.yaml"
            configs[name].write_text(yaml.safe_dump(make_config(args, EXTRA if name == "all" else [])))
        run_round(configs["all"], pathlib.Path(tmp) / "warmup", batches, ())  # one discarded round warms caches
        for i in range(args.rounds):
            names = list(VARIANTS) if i % 2 == 0 else list(VARIANTS)[::-1]  # drift hits all alike
            for name in names:
                rates[name].append(run_round(configs[name], pathlib.Path(tmp) / f"{name}{i}", batches, VARIANTS[name]))
    base = statistics.median(rates["minimal"])
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}")
    print(
        f"vit_tiny depth {args.depth}, 32px, micro {args.micro} x accumulation {args.accumulation}, LAMB, clip 1.0, {args.steps} steps x {args.rounds} rounds, log every {args.log_interval}"
    )
    print("| hooks | images/s (median) | / minimal | rounds |")
    print("|---|---:|---:|---|")
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.1f} | {median / base:.3f} | {', '.join(f'{v:.1f}' for v in values)} |")


if __name__ == "__main__":
    main()
