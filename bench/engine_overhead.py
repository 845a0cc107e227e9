"""Engine overhead: images/s of the largebatch engine against a hand-written PyTorch loop.

What it compares and how it times: BENCHMARKS.md, "Engine overhead against a hand-written loop".

    python bench/engine_overhead.py [--rounds 5] [--steps 8] [--micro 32] [--accumulation 4]
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: start again as the module (bench/common.py)
    __import__("common").run_as_module(__file__)

import argparse
import operator
import pathlib
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from bench.common import MODEL, FixedBatches, build_engine, machine_description, model_overrides, options, random_batches, table

# The clock both loops are timed with: this process's CPU time, far steadier than wall time on a
# shared machine (BENCHMARKS.md); set_clock("wall") where it is quiet or torch threads > 1.
CLOCK = time.process_time


def set_clock(name: str) -> None:
    global CLOCK
    CLOCK = time.process_time if name == "cpu" else time.perf_counter


def overrides(args, steps: int) -> dict:
    """The base config's overrides for ``args``: ``steps`` optimizer steps of ``--micro`` x ``--accumulation``."""
    return {
        "global_batch_size": args.micro * args.accumulation,
        "micro_batch_size": args.micro,
        **model_overrides(args),
        "data.train_samples": steps * args.micro * args.accumulation,
        "log.interval": 10,
    }


def parser(doc: str, **defaults) -> argparse.ArgumentParser:
    """``options`` with the model's, ``defaults`` and ``--clock`` (``mfu.py`` shares them)."""
    parser = options(doc, **MODEL, **defaults)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help="cpu: this process's CPU time (robust to load)")
    return parser


def make_batches(args) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps x accumulation`` random micro-batches of 10-class images, seeded."""
    return random_batches(args.steps * args.accumulation, args.micro, args.image_size)


class Turns:
    """Two loops taking turns, each adding up the ``CLOCK`` time of its own turns only."""

    def __init__(self, first: str) -> None:
        self._turn = first
        self._changed = threading.Condition()
        self._started: dict[str, float] = {}
        self.seconds: dict[str, float] = {"engine": 0.0, "bare": 0.0}

    def take(self, name: str) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self._turn == name)
        self._started[name] = CLOCK()

    def give(self, name: str, to: str) -> None:
        self.seconds[name] += CLOCK() - self._started.pop(name)
        with self._changed:
            self._turn = to
            self._changed.notify_all()


class TakingTurns(FixedBatches):
    """``FixedBatches`` handing the turn to the bare loop before each optimizer step but the first."""

    def __init__(self, batches, num_classes, accumulation: int, turns: Turns) -> None:
        super().__init__(batches, num_classes)
        self.accumulation, self.turns = accumulation, turns

    def __iter__(self):
        for index, batch in enumerate(super().__iter__()):
            if index and index % self.accumulation == 0:
                self.turns.give("engine", to="bare")
                self.turns.take("engine")
            yield batch


def bare_steps(
    model, optimizer, schedule, batches, accumulation: int, turns: Turns | None = None, side: tuple[str, str] = ("bare", "engine")
) -> int:
    """The hand-written loop (one turn per step with ``turns``, ``side[0]`` handing to ``side[1]``); the samples."""
    me, other = side
    samples = 0
    for step in range(len(batches) // accumulation):
        if turns is not None:
            turns.take(me)
        schedule.apply(optimizer, step)
        optimizer.zero_grad(set_to_none=True)
        for images, labels in batches[step * accumulation : (step + 1) * accumulation]:
            loss = torch.nn.functional.cross_entropy(model(images), labels) / accumulation
            loss.backward()
            samples += images.shape[0]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        if turns is not None:
            turns.give(me, to=other)
    return samples


def bare_worker() -> ThreadPoolExecutor:
    """The one thread that runs the bare loop in every round (its caches warm once, as the engine's)."""
    threads = torch.get_num_threads()  # intra-op threads are set per thread
    return ThreadPoolExecutor(1, initializer=lambda: torch.set_num_threads(threads))


def one_round(cfg: dict, run_dir: pathlib.Path, batches, accumulation: int, worker: ThreadPoolExecutor, first: str, aa: bool = False):
    """(images/s of the engine, or with ``aa`` a bare loop in its place; of the bare loop), taking turns."""
    # The same model, optimizer and schedule the engine gets, built the same way.
    here, there = build_engine(cfg, run_dir / "engine"), build_engine(cfg, run_dir / "bare").state.run
    turns = Turns(first)
    here.train_loader = TakingTurns(batches, 10, accumulation, turns)
    done = worker.submit(lambda: bare_steps(there.model, there.optimizer, there.schedule, batches, accumulation, turns))
    if aa:
        run = here.state.run
        samples = bare_steps(run.model, run.optimizer, run.schedule, batches, accumulation, turns, side=("engine", "bare"))
    else:
        turns.take("engine")
        here.run()
        turns.give("engine", to="bare")
        samples = here.state.samples_seen
    return samples / turns.seconds["engine"], done.result() / turns.seconds["bare"]


def main(argv: list[str] | None = None) -> None:
    args = parser(__doc__, rounds=5, steps=8, micro=32, accumulation=4).parse_args(argv)
    set_clock(args.clock)
    batches = make_batches(args)
    engine_rates, bare_rates, aa_ratios = [], [], []
    worker = bare_worker()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = overrides(args, args.steps)
        # One untimed round first: the first pass pays for allocator growth and kernel selection.
        one_round(cfg, pathlib.Path(tmp) / "warmup", batches, args.accumulation, worker, "engine")
        for i in range(args.rounds):
            first = "engine" if i % 2 == 0 else "bare"  # which loop takes the first step of a round, in turn
            engine_rate, bare_rate = one_round(cfg, pathlib.Path(tmp) / f"round{i}", batches, args.accumulation, worker, first)
            engine_rates.append(engine_rate)
            bare_rates.append(bare_rate)
            aa_ratios.append(
                operator.truediv(*one_round(cfg, pathlib.Path(tmp) / f"aa{i}", batches, args.accumulation, worker, first, aa=True))
            )
    engine_rate, bare_rate = statistics.median(engine_rates), statistics.median(bare_rates)
    print(f"Machine: {machine_description()}.")
    print(f"clock: {'CPU time of this process' if args.clock == 'cpu' else 'wall time'}")
    print(
        f"model {args.model} depth {args.depth}, {args.image_size}px, micro {args.micro} x accumulation {args.accumulation}, {args.steps} steps x {args.rounds} rounds"
    )
    rows = [
        f"| {name} | {statistics.median(rates):.1f} | {', '.join(f'{r:.1f}' for r in rates)} |"
        for name, rates in (("bare PyTorch loop", bare_rates), ("largebatch engine", engine_rates))
    ]
    print(table("loop | images/s (median): | rounds", rows))
    ratios = [e / b for e, b in zip(engine_rates, bare_rates)]
    print(f"per-round engine / bare: {', '.join(f'{r:.3f}' for r in ratios)}; ratio of the medians {engine_rate / bare_rate:.3f}")
    print(f"engine / bare = {statistics.median(ratios):.3f}")
    print(f"A/A control, per round: {', '.join(f'{r:.3f}' for r in aa_ratios)}")
    print(f"A/A control: bare in the engine's place / bare = {statistics.median(aa_ratios):.3f}")


if __name__ == "__main__":
    main()
