"""Optimizer step time of our LAMB against its peers on ViT-B/16's parameters.

Not a test: prints a markdown table of ms/step (median and min over blocks of steps),
each optimizer's time as a multiple of ours, and for each peer the largest absolute
difference between its update and ours under matched options, all in one run on the same
tensors. ``torch.optim.Adam(fused=True)`` runs beside them as a floor: one fused pass
over the same tensors, without the norms and the second pass LAMB needs.

    OMP_NUM_THREADS=1 PYTHONPATH=.:.bench-site python bench/lamb_step.py --threads 1 --steps 3 --rounds 4

Peers (see bench/requirements.txt): timm's ``timm.optim.Lamb`` (foreach and per-tensor),
``torch_optimizer.Lamb`` 0.3.0 and Colossal-AI 0.5.0's ``colossalai.nn.optimizer.lamb``
(loaded from its file: the package ``__init__`` pulls in GPU-only requirements).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import time
from collections.abc import Callable
from typing import Any

import timm
import torch

from largebatch.optim.lamb import Lamb

LR, WEIGHT_DECAY = 1e-3, 0.05


def model_shapes(name: str) -> list[torch.Size]:
    """Parameter shapes of a timm model, without allocating it."""
    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False)
    return [p.shape for p in model.parameters()]


def colossal_lamb() -> type | None:
    """Colossal-AI's Lamb class loaded from its module file, or None if not installed."""
    spec = importlib.util.find_spec("colossalai")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = f"{spec.submodule_search_locations[0]}/nn/optimizer/lamb.py"
    module_spec = importlib.util.spec_from_file_location("colossal_lamb", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.Lamb


def candidates() -> list[tuple[str, Callable[[list], Any], Callable[[list], Any] | None]]:
    """(label, peer factory, matched factory of ours or None for ours)."""
    out: list[tuple[str, Callable[[list], Any], Callable[[list], Any] | None]] = [
        ("ours foreach", lambda ps: Lamb(ps, lr=LR, weight_decay=WEIGHT_DECAY), None),
        (
            "ours per-tensor",
            lambda ps: Lamb(ps, lr=LR, weight_decay=WEIGHT_DECAY, foreach=False),
            None,
        ),
    ]

    def ours_paper(ps):
        return Lamb(ps, lr=LR, weight_decay=WEIGHT_DECAY)

    def ours_no_bc(ps):
        return Lamb(ps, lr=LR, weight_decay=WEIGHT_DECAY, bias_correction=False)

    out.append(("reference: torch.optim.Adam fused (not LAMB)", lambda ps: torch.optim.Adam(ps, lr=LR, fused=True), None))

    from timm.optim import Lamb as TimmLamb

    for foreach in (True, False):
        out.append(
            (
                f"timm {timm.__version__} Lamb foreach={foreach}",
                lambda ps, f=foreach: TimmLamb(
                    ps,
                    lr=LR,
                    weight_decay=WEIGHT_DECAY,
                    max_grad_norm=None,
                    always_adapt=True,
                    bias_correction=True,
                    foreach=f,
                ),
                ours_paper,
            )
        )
    try:
        import torch_optimizer

        out.append(
            (
                "torch_optimizer 0.3.0 Lamb",
                lambda ps: torch_optimizer.Lamb(
                    ps,
                    lr=LR,
                    weight_decay=WEIGHT_DECAY,
                    clamp_value=float("inf"),
                    debias=False,
                ),
                ours_no_bc,
            )
        )
    except ImportError:
        print("torch_optimizer not installed: skipped")
    colossal = colossal_lamb()
    if colossal is None:
        print("colossalai not installed: skipped")
    else:
        out.append(
            (
                "colossalai 0.5.0 Lamb",
                lambda ps: colossal(ps, lr=LR, weight_decay=WEIGHT_DECAY, bias_correction=False),
                ours_no_bc,
            )
        )
    return out


def time_in_blocks(factories: list[Callable[[list], Any]], params: list, steps: int, rounds: int) -> list[list[float]]:
    """ms of each optimizer's steps, in blocks of ``steps``, the blocks taking turns.

    Each block starts with one untimed step: it creates the state the first time and
    lets the allocator settle on the optimizer's temporaries after the previous one's
    (alternating single steps penalises the peers that allocate per tensor). Taking
    turns for ``rounds`` rounds spreads load from elsewhere over all of them.
    """
    optimizers = [factory(params) for factory in factories]
    times: list[list[float]] = [[] for _ in optimizers]
    for _ in range(rounds):
        for optimizer, out in zip(optimizers, times):
            optimizer.step()
            for _ in range(steps):
                start = time.perf_counter()
                optimizer.step()
                out.append((time.perf_counter() - start) * 1e3)
    del optimizers
    gc.collect()
    return times


def update_after(factory: Callable[[list], Any], start: list, grads: list[list]) -> list:
    """Parameters minus ``start`` after one step per gradient set, on fresh copies."""
    params = [p.detach().clone().requires_grad_(True) for p in start]
    optimizer = factory(params)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g
        optimizer.step()
    del optimizer
    return [(p.detach() - s) for p, s in zip(params, start)]


def max_difference(a: list, b: list) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="timed steps per block")
    parser.add_argument("--rounds", type=int, default=2, help="blocks per optimizer")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--compare-steps", type=int, default=2, help="steps for the update diff")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shapes = model_shapes("vit_base_patch16_224")
    params = [(torch.randn(s) * 0.02).requires_grad_(True) for s in shapes]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    print(
        f"{len(params)} tensors, {sum(p.numel() for p in params) / 1e6:.1f}M params, fp32, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    found = candidates()
    factories = [factory for _, factory, _ in found]
    times = time_in_blocks(factories, params, args.steps, args.rounds)
    rows = []
    for (label, factory, ours), ms in zip(found, times):
        diff = None
        if ours is not None:
            grads = [[torch.randn_like(p) * 1e-3 for p in params] for _ in range(args.compare_steps)]
            start = [p.detach() for p in params]
            diff = max_difference(update_after(factory, start, grads), update_after(ours, start, grads))
            del grads
            gc.collect()
        rows.append((label, min(ms), statistics.median(ms), diff))
    ours_low, ours_median = rows[0][1], rows[0][2]
    print(
        f"\n{args.rounds} rounds of {args.steps} timed steps per optimizer, blocks taking turns; "
        "'x ours' is the optimizer's time divided by ours (foreach)"
    )
    print("\n| optimizer | ms/step median | ms/step min | median x ours | min x ours | max abs update diff vs ours |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, low, median, diff in rows:
        shown = f"{diff:.1e}" if diff is not None else "(reference)" if "reference" in label else "(ours)"
        print(f"| {label} | {median:.1f} | {low:.1f} | {median / ours_median:.2f} | {low / ours_low:.2f} | {shown} |")
    peers = [row for row in rows if row[3] is not None]
    fastest_median = min(peers, key=lambda row: row[2])
    fastest_min = min(peers, key=lambda row: row[1])
    print(
        f"\nours vs the fastest peer: {fastest_median[2] / ours_median:.2f}x faster by median "
        f"({fastest_median[0]}), {fastest_min[1] / ours_low:.2f}x by min ({fastest_min[0]})"
    )


if __name__ == "__main__":
    main()
