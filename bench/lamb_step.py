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

from bench.common import machine_description, per_round_ratio, table, time_blocks
from largebatch.optim import lamb_triton, lamb_update
from largebatch.optim.lamb import Lamb

LR, WEIGHT_DECAY = 1e-3, 0.05


def random_params(name: str, device: str = "cpu") -> list[torch.Tensor]:
    """Tensors of a timm model's parameter shapes (found without allocating the model),
    seeded, with random gradients: what an optimizer steps over."""
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


def ours_paper(ps: list) -> Lamb:
    return Lamb(ps, lr=LR, weight_decay=WEIGHT_DECAY)


def ours_no_bc(ps: list) -> Lamb:
    return Lamb(ps, lr=LR, weight_decay=WEIGHT_DECAY, bias_correction=False)


AA_LABEL = "A/A control: ours foreach, second instance"


class FusedPathOn:
    """Ours with the ``lamb_update.FusedAdam`` kernel (torch's fused Adam kernel over whole
    tensors) taken on exactly ``devices`` during its steps, and ``lamb_triton``'s on exactly
    ``triton_devices`` when given: ``("cpu",)`` runs the fused path on CPU tensors, the
    stand-in here for the ratio to the fused Adam floor that ``python -m bench --device
    cuda`` measures; ``devices=("cuda",), triton_devices=()`` gives CUDA's previous path
    and ``(), ()`` its plain multi-tensor one, for that suite's comparison."""

    def __init__(self, params: list, devices: tuple[str, ...], triton_devices: tuple[str, ...] | None = None) -> None:
        self.inner = Lamb(params, lr=LR, weight_decay=WEIGHT_DECAY, chunk_elements=0)
        self.devices = devices
        self.triton_devices = triton_devices

    def step(self) -> None:
        saved, lamb_update.FUSED_DEVICES = lamb_update.FUSED_DEVICES, self.devices
        saved_triton = lamb_triton.DEVICES
        if self.triton_devices is not None:
            lamb_triton.DEVICES = self.triton_devices
        try:
            self.inner.step()
        finally:
            lamb_update.FUSED_DEVICES, lamb_triton.DEVICES = saved, saved_triton


def candidates() -> list[tuple[str, Callable[[list], Any], Callable[[list], Any] | None]]:
    """(label, factory, matched factory of ours, or None where no update is compared);
    ours first, the A/A control second."""
    from timm.optim import Lamb as TimmLamb

    ours = functools.partial(Lamb, lr=LR, weight_decay=WEIGHT_DECAY)
    timm_lamb = functools.partial(TimmLamb, lr=LR, weight_decay=WEIGHT_DECAY, max_grad_norm=None, always_adapt=True, bias_correction=True)
    out: list[tuple[str, Callable[[list], Any], Callable[[list], Any] | None]] = [
        ("ours foreach", ours_paper, None),
        (AA_LABEL, ours_paper, ours_paper),
        ("ours per-tensor", functools.partial(ours, foreach=False), None),
        ("reference: torch.optim.Adam fused (not LAMB)", functools.partial(torch.optim.Adam, lr=LR, fused=True), None),
        ("ours, CUDA's path (fused Adam kernel, whole tensors) on the CPU", functools.partial(FusedPathOn, devices=("cpu",)), ours_paper),
        ("ours, plain multi-tensor path (other accelerators') on the CPU", functools.partial(ours, chunk_elements=0), ours_paper),
        *((f"timm {timm.__version__} Lamb foreach={f}", functools.partial(timm_lamb, foreach=f), ours_paper) for f in (True, False)),
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
    """The largest difference between the updates of ``factory``'s optimizer and
    ``reference``'s after ``steps`` steps on the same random gradients, from ``params``."""
    torch.manual_seed(1)
    grads = [[torch.randn_like(p) * 1e-3 for p in params] for _ in range(steps)]
    start = [p.detach().clone() for p in params]  # the timed steps move params
    difference = max_difference(update_after(factory, start, grads), update_after(reference, start, grads))
    del grads, start
    gc.collect()
    return difference


def optimizer_arguments(parser: argparse.ArgumentParser, steps: int, rounds: int, compare_steps: int) -> None:
    """The timing options of the optimizer benchmarks."""
    parser.add_argument("--steps", type=int, default=steps, help="timed steps per block")
    parser.add_argument("--rounds", type=int, default=rounds, help="rounds of blocks")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--compare-steps", type=int, default=compare_steps, help="steps for the update difference")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    optimizer_arguments(parser, steps=5, rounds=2, compare_steps=2)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    params = random_params("vit_base_patch16_224")
    print(f"Machine: {machine_description()}.")
    print(
        f"{len(params)} tensors, {sum(p.numel() for p in params) / 1e6:.1f}M params, fp32, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    found = candidates()
    optimizers = [factory(params) for _, factory, _ in found]
    times = time_blocks([optimizer.step for optimizer in optimizers], args.steps, args.rounds)
    del optimizers
    gc.collect()
    rows = []
    for (label, factory, ours), blocks in zip(found, times):
        diff = None if ours is None else update_difference(factory, ours, params, args.compare_steps)
        ms = [t for block in blocks for t in block]
        rows.append((label, min(ms), statistics.median(ms), per_round_ratio(blocks, times[0]), diff))
    print_table(rows, args)


def print_table(rows: list[tuple[str, float, float, tuple[float, float, float], float | None]], args: argparse.Namespace) -> None:
    ours_low, ours_median = rows[0][1], rows[0][2]
    print(
        f"\n{args.rounds} rounds of {args.steps} timed steps per optimizer, blocks taking turns, the order reversed "
        "every other round; 'x ours' is the optimizer's time divided by ours (foreach); 'per round x ours' is the "
        "median over rounds of the ratio of block medians (quartiles in brackets)"
    )
    lines = []
    for label, low, median, (paired, q1, q3), diff in rows:
        shown = f"{diff:.1e}" if diff is not None else "(reference)" if "reference" in label else "(ours)"
        lines.append(
            f"| {label} | {median:.1f} | {low:.1f} | {median / ours_median:.2f} | {low / ours_low:.2f} | {paired:.2f} ({q1:.2f}-{q3:.2f}) | {shown} |"
        )
    header = "optimizer | ms/step median: | ms/step min: | median x ours: | min x ours: | per round x ours: | max abs update diff vs ours:"
    print("\n" + table(header, lines))
    control = next(row for row in rows if row[0] == AA_LABEL)
    peers = [row for row in rows if row[4] is not None and row is not control and not row[0].startswith("ours")]
    fastest_median = min(peers, key=lambda row: row[2])
    fastest_min = min(peers, key=lambda row: row[1])
    fastest_paired = min(peers, key=lambda row: row[3][0])
    print(
        f"\nours vs the fastest peer: {fastest_median[2] / ours_median:.2f}x faster by median "
        f"({fastest_median[0]}), {fastest_min[1] / ours_low:.2f}x by min ({fastest_min[0]}), "
        f"{fastest_paired[3][0]:.2f}x per round ({fastest_paired[0]})"
    )
    print(
        f"A/A control (ours / ours): {control[2] / ours_median:.2f} by median, {control[1] / ours_low:.2f} by min, "
        f"{control[3][0]:.2f} per round ({control[3][1]:.2f}-{control[3][2]:.2f})"
    )
    floor = next((row for row in rows if "Adam fused" in row[0]), None)
    if floor is not None:
        for row in rows:
            if row[0].startswith("ours"):
                print(f"{row[0]} / the fused Adam floor: {row[2] / floor[2]:.2f} by median, {row[3][0] / floor[3][0]:.2f} per round")


if __name__ == "__main__":
    main()
