"""Engine overhead: images/s of the largebatch engine against a hand-written PyTorch loop.

Both run the same model, micro-batch, accumulation, optimizer, schedule and clipping on
the same pre-made micro-batches (so data generation is not measured), in alternating
rounds within one process; the engine runs with its default hooks (loss and accuracy,
throughput, metrics logger writing metrics.jsonl; checkpoints off). Reported: the median
images/s of each and the ratio engine / bare.

    python bench/engine_overhead.py [--rounds 5] [--steps 8] [--micro 32] [--accumulation 4]
"""

from __future__ import annotations

import argparse
import itertools
import pathlib
import platform
import statistics
import sys
import tempfile
import time

import torch
import yaml

REPO = pathlib.Path(__file__).resolve().parents[1]

# The clock both loops are timed with. On a machine shared with other jobs, wall time
# moves with their load (rounds differ by 2-4x); the CPU time of this process does not,
# and with one thread and pre-made batches it is the time the work took. set_clock()
# switches to wall time where the machine is quiet or threads > 1.
CLOCK = time.process_time


def set_clock(name: str) -> None:
    global CLOCK
    CLOCK = time.process_time if name == "cpu" else time.perf_counter


sys.path.insert(0, str(REPO))

from largebatch.launch import TrainArgs, build_run  # noqa: E402


class FixedBatches:
    """The loader contract over a fixed list of micro-batches (the same list each epoch)."""

    def __init__(self, batches, num_classes):
        self.batches, self.num_classes, self.num_samples = batches, num_classes, 0

    def __len__(self):
        return len(self.batches)

    def set_epoch(self, epoch):
        pass

    def __iter__(self):
        return itertools.cycle(self.batches)  # the engine takes as many as its plan says

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def make_config(args, steps: int) -> dict:
    return {
        "seed": 0,
        "device": "cpu",
        "epochs": 1,
        "global_batch_size": args.micro * args.accumulation,
        "micro_batch_size": args.micro,
        "clip_grad_norm": 1.0,
        "model": {"name": args.model, "patch_size": args.patch, "depth": args.depth},
        "optimizer": {"type": "adamw", "lr": 1e-3, "weight_decay": 0.05},
        "lr_schedule": {"type": "cosine", "warmup_steps": 1},
        "data": {
            "loader": "synthetic",
            "image_size": args.image_size,
            "num_classes": 10,
            "train_samples": steps * args.micro * args.accumulation,
            "eval_samples": 0,
        },
        "eval": {"interval_epochs": 0, "at_end": False},
        "log": {"interval": 10, "console": False},
        "checkpoint": {"interval_epochs": 0, "at_end": False},
    }


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help="cpu: this process's CPU time (robust to load)")
    parser.add_argument("--model", default="vit_tiny_patch16_224")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--patch", type=int, default=4)
    parser.add_argument("--depth", type=int, default=12)


def make_batches(args) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps x accumulation`` random micro-batches of 10-class images, seeded."""
    torch.manual_seed(0)
    return [
        (torch.randn(args.micro, 3, args.image_size, args.image_size), torch.randint(10, (args.micro,)))
        for _ in range(args.steps * args.accumulation)
    ]


def engine_round(config_path: pathlib.Path, run_dir: pathlib.Path, batches) -> float:
    engine, _ = build_run(TrainArgs(str(config_path), run_dir=str(run_dir)))
    engine.train_loader = FixedBatches(batches, 10)
    start = CLOCK()
    engine.run()
    elapsed = CLOCK() - start
    return engine.state.samples_seen / elapsed


def bare_round(config_path: pathlib.Path, run_dir: pathlib.Path, batches, accumulation: int) -> float:
    # Build the same model, optimizer and schedule the engine gets, then train by hand.
    engine, _ = build_run(TrainArgs(str(config_path), run_dir=str(run_dir)))
    state = engine.state
    model, optimizer, schedule = state.model, state.optimizer, state.schedule
    steps = len(batches) // accumulation
    samples = 0
    start = CLOCK()
    for step in range(steps):
        schedule.apply(optimizer, step)
        optimizer.zero_grad(set_to_none=True)
        for images, labels in batches[step * accumulation : (step + 1) * accumulation]:
            loss = torch.nn.functional.cross_entropy(model(images), labels) / accumulation
            loss.backward()
            samples += images.shape[0]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
    elapsed = CLOCK() - start
    return samples / elapsed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--micro", type=int, default=32)
    parser.add_argument("--accumulation", type=int, default=4)
    add_model_arguments(parser)
    args = parser.parse_args(argv)
    set_clock(args.clock)
    batches = make_batches(args)
    engine_rates, bare_rates = [], []
    with tempfile.TemporaryDirectory() as tmp:
        config_path = pathlib.Path(tmp) / "bench.yaml"
        config_path.write_text(yaml.safe_dump(make_config(args, args.steps)))
        # One full untimed round of each first: the first pass through a model pays for
        # allocator growth and kernel selection, and whichever loop ran first used to
        # carry that cost, which made the ratio depend on the order.
        engine_round(config_path, pathlib.Path(tmp) / "warmup-engine", batches)
        bare_round(config_path, pathlib.Path(tmp) / "warmup-bare", batches, args.accumulation)
        for i in range(args.rounds):
            # Alternate which goes first so drift in the machine's load hits both.
            order = [("engine", engine_rates), ("bare", bare_rates)]
            for name, rates in order if i % 2 == 0 else order[::-1]:
                run_dir = pathlib.Path(tmp) / f"{name}{i}"
                rate = (
                    engine_round(config_path, run_dir, batches)
                    if name == "engine"
                    else bare_round(config_path, run_dir, batches, args.accumulation)
                )
                rates.append(rate)
    engine_rate, bare_rate = statistics.median(engine_rates), statistics.median(bare_rates)
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}")
    print(f"clock: {'CPU time of this process' if args.clock == 'cpu' else 'wall time'}")
    print(
        f"model {args.model} depth {args.depth}, {args.image_size}px, micro {args.micro} x accumulation {args.accumulation}, {args.steps} steps x {args.rounds} rounds"
    )
    print("| loop | images/s (median) | rounds |")
    print("|---|---:|---|")
    print(f"| bare PyTorch loop | {bare_rate:.1f} | {', '.join(f'{r:.1f}' for r in bare_rates)} |")
    print(f"| largebatch engine | {engine_rate:.1f} | {', '.join(f'{r:.1f}' for r in engine_rates)} |")
    print(f"engine / bare = {engine_rate / bare_rate:.3f}")


if __name__ == "__main__":
    main()
