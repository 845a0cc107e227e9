"""Optimizer step time of our LARS against timm's ``Lars`` on ViT-B/16's parameters.

What it compares and how it times: BENCHMARKS.md, "LARS step against timm's `Lars`".

    OMP_NUM_THREADS=1 python bench/lars_step.py --threads 1 --steps 3 --rounds 8
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: start again as the module (bench/common.py)
    __import__("common").run_as_module(__file__)

import argparse
import functools
import gc
import statistics
from collections.abc import Callable
from typing import Any

import timm
import timm.optim
import torch

from bench.common import spread_text, table, time_blocks
from bench.lamb_step import optimizer_arguments, random_params, update_difference
from largebatch.optim.lars import Lars

LR, MOMENTUM, WEIGHT_DECAY, ETA = 0.5, 0.9, 5e-4, 1e-3


def param_groups(params: list[torch.Tensor]) -> list[dict[str, Any]]:
    """Weight decay (and so the trust ratio) for matrices; biases and norms without."""
    return [
        {"params": [p for p in params if p.ndim > 1], "weight_decay": WEIGHT_DECAY},
        {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0},
    ]


def ours(params: list, **options) -> torch.optim.Optimizer:
    return Lars(param_groups(params), lr=LR, momentum=MOMENTUM, eta=ETA, nesterov=True, **options)


def timm_lars(params: list) -> torch.optim.Optimizer:
    return timm.optim.Lars(param_groups(params), lr=LR, momentum=MOMENTUM, trust_coeff=ETA, nesterov=True)


def paired(a: Callable, b: Callable, params: list, steps: int, rounds: int) -> tuple[list[float], list[float]]:
    """Block medians of ``a`` and ``b``, taking turns, first one then the other."""
    optimizers = a(params), b(params)
    times = time_blocks([optimizer.step for optimizer in optimizers], steps, rounds)
    del optimizers
    gc.collect()
    return [statistics.median(block) for block in times[0]], [statistics.median(block) for block in times[1]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    optimizer_arguments(parser, steps=3, rounds=8, compare_steps=3)
    parser.add_argument("--model", default="vit_base_patch16_224", help="timm model whose parameter shapes are used")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    params = random_params(args.model)
    print(
        f"{len(params)} tensors, {sum(p.numel() for p in params) / 1e6:.1f}M params, fp32, "
        f"torch {torch.__version__}, timm {timm.__version__}, {torch.get_num_threads()} threads"
    )
    rows = []
    pairs = [
        ("A/A control: ours vs ours", ours),
        (f"timm {timm.__version__} Lars", timm_lars),
        ("ours per-tensor path", functools.partial(ours, foreach=False)),
    ]
    for label, peer in pairs:
        ms_ours, ms_peer = paired(ours, peer, params, args.steps, args.rounds)
        ratio = spread_text([p / o for o, p in zip(ms_ours, ms_peer)], 2)
        diff = update_difference(peer, ours, params, args.compare_steps)
        rows.append(f"| {label} | {statistics.median(ms_ours):.1f} | {statistics.median(ms_peer):.1f} | {ratio} | {diff:.1e} |")
    print(
        f"\n{args.rounds} pairs of blocks of {args.steps} timed steps, order alternating; "
        "'peer / ours' is the median over pairs of the ratio of block medians (quartiles in brackets)\n"
    )
    print(table("pair | ours ms/step: | peer ms/step: | peer / ours: | max abs update diff vs ours:", rows))


if __name__ == "__main__":
    main()
