"""Model-FLOPs utilisation on the CPU: training FLOP/s over a large matmul's FLOP/s.

What it compares and how it times: BENCHMARKS.md, "End-to-end training against timm's `train.py` path, and model-FLOPs utilisation".

    python bench/mfu.py [--rounds 3] [--steps 4] [--micro 64] [--matmul 2048]
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: start again as the module (bench/common.py)
    __import__("common").run_as_module(__file__)

import pathlib
import statistics
import tempfile

import torch

from bench import engine_overhead
from bench.common import FixedBatches, build_engine, machine_description, table


def training_flops_per_image(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    """FLOPs of one forward and backward, per image (FlopCounterMode counts 2 per multiply-add)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / images.shape[0]


def matmul_flops_per_second(n: int, repeats: int) -> float:
    """Best FLOP/s of ``repeats`` fp32 ``n x n`` matmuls (2 n^3 FLOPs each)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    torch.mm(a, b, out=out)  # warm up the kernel selection and the caches
    best = float("inf")
    for _ in range(repeats):
        start = engine_overhead.CLOCK()
        torch.mm(a, b, out=out)
        best = min(best, engine_overhead.CLOCK() - start)
    return 2 * n**3 / best


def engine_images_per_second(cfg: dict, run_dir: pathlib.Path, batches) -> tuple[float, torch.nn.Module]:
    engine = build_engine(cfg, run_dir)
    engine.train_loader = FixedBatches(batches)
    start = engine_overhead.CLOCK()
    engine.run()
    return engine.state.samples_seen / (engine_overhead.CLOCK() - start), engine.state.run.model


def main(argv: list[str] | None = None) -> None:
    matmul = (2048, "side of the square fp32 matmul that sets the peak")
    parser = engine_overhead.parser(__doc__, rounds=3, steps=4, micro=64, accumulation=2, matmul=matmul, matmul_repeats=5)
    args = parser.parse_args(argv)
    engine_overhead.set_clock(args.clock)
    batches = engine_overhead.make_batches(args)
    train_rates, peaks = [], []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = engine_overhead.overrides(args, args.steps)
        _, model = engine_images_per_second(cfg, pathlib.Path(tmp) / "warmup", batches)  # warm-up run, discarded
        flops_per_image = training_flops_per_image(model, *batches[0])
        matmul_flops_per_second(args.matmul, 1)
        for i in range(args.rounds):
            rate, _ = engine_images_per_second(cfg, pathlib.Path(tmp) / f"run{i}", batches)
            train_rates.append(rate)
            peaks.append(matmul_flops_per_second(args.matmul, args.matmul_repeats))
    rate, peak = statistics.median(train_rates), statistics.median(peaks)
    achieved = rate * flops_per_image
    print(f"Machine: {machine_description()}.")
    print(f"clock: {'CPU time of this process (FLOP per CPU-second on both sides)' if args.clock == 'cpu' else 'wall time'}")
    print(
        f"model {args.model} depth {args.depth}, {args.image_size}px patch {args.patch}, micro {args.micro} x accumulation "
        f"{args.accumulation}, {args.steps} steps x {args.rounds} rounds; matmul {args.matmul}x{args.matmul} fp32"
    )
    print(table("quantity | value:"))
    print(f"| training FLOPs per image (forward + backward) | {flops_per_image / 1e9:.3f} G |")
    print(f"| engine images/s (median) | {rate:.1f} |")
    print(f"| training FLOP/s | {achieved / 1e9:.2f} G |")
    print(f"| matmul FLOP/s (median of rounds, best of {args.matmul_repeats}) | {peak / 1e9:.2f} G |")
    print(f"MFU = training FLOP/s / matmul FLOP/s = {achieved / peak:.3f}")


if __name__ == "__main__":
    main()
