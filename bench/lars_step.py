"""Optimizer step time of our LARS against timm's ``Lars`` on ViT-B/16's parameters.

What it compares and how it times: BENCHMARKS.md, "LARS step against timm's `Lars`".

    OMP_NUM_THREADS=1 python bench/lars_step.py --threads 1 --steps 3 --rounds 8
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: start again as the module (bench/common.py)
    __import__("common").run_as_module(__file__)

import functools
import statistics
from typing import Any

import timm
import timm.optim
import torch

from bench.common import spread_text, table
from bench.lamb_step import optimizer_bench, time_steps, update_difference
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


def main() -> None:
    args, params = optimizer_bench(__doc__, steps=3, rounds=8, compare_steps=3)
    rows = []
    pairs = [
        ("A/A control: ours vs ours", ours),
        (f"timm {timm.__version__} Lars", timm_lars),
        ("ours per-tensor path", functools.partial(ours, foreach=False)),
    ]
    for label, peer in pairs:
        times = time_steps([ours, peer], params, args.steps, args.rounds)
        ms_ours, ms_peer = ([statistics.median(block) for block in side] for side in times)
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
