"""Optimizer step time of our LAMB against its peers on ViT-B/16's parameters.

What it compares and how it times: BENCHMARKS.md, "LAMB step against its peers" (the peers: bench/requirements.txt).

    OMP_NUM_THREADS=1 PYTHONPATH=.:.bench-site python bench/lamb_step.py --threads 1 --steps 3 --rounds 10
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: start again as the module (bench/common.py)
    __import__("common").run_as_module(__file__)

import argparse
import functools
import gc
import importlib.util
import statistics
from collections.abc import Callable
from typing import Any

import timm
import torch
from timm.optim import Lamb as TimmLamb

from bench.common import machine_description, options, per_round_ratio, table, time_blocks
from largebatch.engine.update import step_unless
from largebatch.optim import lamb_triton, lamb_update
from largebatch.optim.lamb import Lamb

LR, WEIGHT_DECAY = 1e-3, 0.05


def random_params(name: str, device: str = "cpu") -> list[torch.Tensor]:
    """Seeded tensors of a timm model's parameter shapes, with random gradients."""
    with torch.device("meta"):
        shapes = [p.shape for p in timm.create_model(name, pretrained=False).parameters()]
    torch.manual_seed(0)
    params = [(torch.randn(shape) * 0.02).to(device).requires_grad_(True) for shape in shapes]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    return params


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


ours = functools.partial(Lamb, lr=LR, weight_decay=WEIGHT_DECAY)
ours_no_bc = functools.partial(ours, bias_correction=False)
timm_lamb = functools.partial(TimmLamb, lr=LR, weight_decay=WEIGHT_DECAY, max_grad_norm=None, always_adapt=True, bias_correction=True)


class FusedPathOn:
    """Ours with the fused Adam kernel path taken on exactly ``devices`` and ``lamb_triton``'s on exactly
    ``triton_devices`` when given (``("cpu",)``: CUDA's path on CPU tensors)."""

    def __init__(self, params: list, devices: tuple[str, ...], triton_devices: tuple[str, ...] | None = None) -> None:
        self.inner, self.devices, self.triton_devices = ours(params, chunk_elements=0), devices, triton_devices

    def step(self) -> None:
        saved = lamb_update.FUSED_DEVICES, lamb_triton.DEVICES
        lamb_update.FUSED_DEVICES, lamb_triton.DEVICES = self.devices, saved[1] if self.triton_devices is None else self.triton_devices
        try:
            self.inner.step()
        finally:
            lamb_update.FUSED_DEVICES, lamb_triton.DEVICES = saved


class UnderFlag:
    """Ours stepped as the engine's deferred non-finite check steps it: given a ``found_inf``
    flag of 0 (``largebatch.engine.update.step_unless``), read by the optimizer and copied to
    the host for ``settle``; the update is the plain step's."""

    def __init__(self, params: list) -> None:
        self.inner, self.flag = ours(params), torch.zeros(())

    def step(self) -> None:
        step_unless(self.inner, self.flag)


def candidates() -> list[tuple[str, Callable[[list], Any], Callable[[list], Any] | None]]:
    """(label, factory, matched factory of ours or None); ours first, the A/A control second."""
    out: list[tuple[str, Callable[[list], Any], Callable[[list], Any] | None]] = [
        ("ours foreach", ours, None),
        ("A/A control: ours foreach, second instance", ours, ours),
        ("ours per-tensor", functools.partial(ours, foreach=False), None),
        ("ours foreach under a found_inf flag of 0 (the deferred non-finite check)", UnderFlag, ours),
        ("reference: torch.optim.Adam fused (not LAMB)", functools.partial(torch.optim.Adam, lr=LR, fused=True), None),
        ("ours, CUDA's path (fused Adam kernel, whole tensors) on the CPU", functools.partial(FusedPathOn, devices=("cpu",)), ours),
        ("ours, plain multi-tensor path (other accelerators') on the CPU", functools.partial(ours, chunk_elements=0), ours),
        *((f"timm {timm.__version__} Lamb foreach={f}", functools.partial(timm_lamb, foreach=f), ours) for f in (True, False)),
    ]
    try:
        import torch_optimizer

        peer = functools.partial(torch_optimizer.Lamb, lr=LR, weight_decay=WEIGHT_DECAY, clamp_value=float("inf"), debias=False)
        out.append(("torch_optimizer 0.3.0 Lamb", peer, ours_no_bc))
    except ImportError:
        print("torch_optimizer not installed: skipped")
    colossal = colossal_lamb()
    if colossal is None:
        print("colossalai not installed: skipped")
    else:
        out.append(
            ("colossalai 0.5.0 Lamb", functools.partial(colossal, lr=LR, weight_decay=WEIGHT_DECAY, bias_correction=False), ours_no_bc)
        )
    return out


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


def update_difference(factory: Callable[[list], Any], reference: Callable[[list], Any], params: list, steps: int) -> float:
    """The largest difference between two optimizers' updates after ``steps`` steps on the same gradients."""
    torch.manual_seed(1)
    grads = [[torch.randn_like(p) * 1e-3 for p in params] for _ in range(steps)]
    start = [p.detach().clone() for p in params]  # the timed steps move params
    difference = max_difference(update_after(factory, start, grads), update_after(reference, start, grads))
    del grads, start
    gc.collect()
    return difference


def time_steps(factories: list[Callable[[list], Any]], params: list, steps: int, rounds: int) -> list[list[list[float]]]:
    """``time_blocks`` of the steps of an optimizer from each factory over ``params``, the optimizers freed after."""
    times = time_blocks([factory(params).step for factory in factories], steps, rounds)
    gc.collect()
    return times


def optimizer_bench(doc: str, steps: int, rounds: int, compare_steps: int) -> tuple[argparse.Namespace, list[torch.Tensor]]:
    """The optimizer benchmarks' options parsed and ``random_params`` of ``--model``, described."""
    model = ("vit_base_patch16_224", "timm model whose parameter shapes are used")
    parser = options(doc, steps=(steps, "timed steps per block"), rounds=(rounds, "rounds of blocks"), model=model)
    parser.add_argument("--compare-steps", type=int, default=compare_steps, help="steps for the update difference")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    params = random_params(args.model)
    print(f"Machine: {machine_description()}.")
    print(
        f"{len(params)} tensors, {sum(p.numel() for p in params) / 1e6:.1f}M params, fp32, "
        f"torch {torch.__version__}, timm {timm.__version__}, {torch.get_num_threads()} threads"
    )
    return args, params


def main() -> None:
    args, params = optimizer_bench(__doc__, steps=5, rounds=2, compare_steps=2)
    found = candidates()
    times = time_steps([factory for _, factory, _ in found], params, args.steps, args.rounds)
    ms = [[t for block in blocks for t in block] for blocks in times]
    low, median = [min(t) for t in ms], [statistics.median(t) for t in ms]
    per_round = [per_round_ratio(blocks, times[0]) for blocks in times]
    print(
        f"\n{args.rounds} rounds of {args.steps} timed steps per optimizer, blocks taking turns, the order reversed "
        "every other round; 'x ours' is the optimizer's time divided by ours (foreach); 'per round x ours' is the "
        "median over rounds of the ratio of block medians (quartiles in brackets)"
    )
    rows, peers = [], []
    for i, (label, factory, reference) in enumerate(found):
        diff = "(reference)" if "reference" in label else "(ours)"
        if reference is not None:
            diff = f"{update_difference(factory, reference, params, args.compare_steps):.1e}"
            peers += [i] if not label.startswith(("ours", "A/A")) else []
        (paired, q1, q3), x_median, x_low = per_round[i], median[i] / median[0], low[i] / low[0]
        rows.append(
            f"| {label} | {median[i]:.1f} | {low[i]:.1f} | {x_median:.2f} | {x_low:.2f} | {paired:.2f} ({q1:.2f}-{q3:.2f}) | {diff} |"
        )
    header = "optimizer | ms/step median: | ms/step min: | median x ours: | min x ours: | per round x ours: | max abs update diff vs ours:"
    print("\n" + table(header, rows))
    by_median, by_low, by_round = (min(peers, key=values.__getitem__) for values in (median, low, [r[0] for r in per_round]))
    print(
        f"\nours vs the fastest peer: {median[by_median] / median[0]:.2f}x faster by median ({found[by_median][0]}), "
        f"{low[by_low] / low[0]:.2f}x by min ({found[by_low][0]}), {per_round[by_round][0]:.2f}x per round ({found[by_round][0]})"
    )
    (aa, aa_q1, aa_q3), aa_median, aa_low = per_round[1], median[1] / median[0], low[1] / low[0]
    print(f"A/A control (ours / ours): {aa_median:.2f} by median, {aa_low:.2f} by min, {aa:.2f} per round ({aa_q1:.2f}-{aa_q3:.2f})")
    floor = next(i for i, (label, _, _) in enumerate(found) if "Adam fused" in label)
    for i, (label, _, _) in enumerate(found):
        if label.startswith("ours"):
            print(
                f"{label} / the fused Adam floor: {median[i] / median[floor]:.2f} by median, {per_round[i][0] / per_round[floor][0]:.2f} per round"
            )


if __name__ == "__main__":
    main()
