"""Engine overhead: images/s of the largebatch engine against a hand-written PyTorch loop.

What it compares and how it times: BENCHMARKS.md, "Engine overhead against a hand-written loop".

    python bench/engine_overhead.py [--rounds 5] [--steps 8] [--micro 32] [--accumulation 4]
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: start again as the module (bench/common.py)
    __import__("common").run_as_module(__file__)

import argparse
import pathlib
import statistics
import tempfile
import threading
import time

import torch

from bench.common import FixedBatches, add_model_arguments, build_engine, machine_description, model_overrides, random_batches, table

# The clock both loops are timed with. On a machine shared with other jobs, wall time
# moves with their load (rounds differ by 2-4x); the CPU time of this process moves far
# less, and with one torch thread, pre-made batches and one loop running at a time it is
# the time the running loop's work took. set_clock() switches to wall time where the
# machine is quiet or torch threads > 1.
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--clock`` and the model's options (``mfu.py`` shares them)."""
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help="cpu: this process's CPU time (robust to load)")
    add_model_arguments(parser)


def make_batches(args) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps x accumulation`` random micro-batches of 10-class images, seeded."""
    return random_batches(args.steps * args.accumulation, args.micro, args.image_size)


class Turns:
    """Two loops taking turns: one runs while the other waits, and each adds up the
    ``CLOCK`` time of its own turns only."""

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
    """``FixedBatches`` that hands the turn to the bare loop before each optimizer step
    but the first (at the first micro-batch of its window): the engine's steps and the
    bare loop's alternate."""

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
    """The hand-written loop (one turn per optimizer step when ``turns`` is given, as
    ``side[0]`` handing over to ``side[1]``); returns the samples trained on."""
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


class BareWorker:
    """One thread that runs the bare loop for every round (the same thread each time, so
    its thread-local caches warm up once, as the engine's main thread's do)."""

    def __init__(self) -> None:
        self._jobs: list = []
        self._ready = threading.Condition()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._num_threads = torch.get_num_threads()
        self._thread.start()

    def _serve(self) -> None:
        torch.set_num_threads(self._num_threads)  # intra-op threads are set per thread
        while True:
            with self._ready:
                self._ready.wait_for(lambda: self._jobs)
                job, done = self._jobs.pop(0)
            try:
                done["result"] = job()
            except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
                done["error"] = exc
            done["event"].set()

    def submit(self, job) -> dict:
        done = {"event": threading.Event()}
        with self._ready:
            self._jobs.append((job, done))
            self._ready.notify_all()
        return done


def paired_round(cfg: dict, run_dir: pathlib.Path, batches, accumulation: int, worker: BareWorker, first: str) -> tuple[float, float]:
    """One round: a fresh engine and a fresh bare loop taking turns step by step; returns
    (engine images/s, bare images/s)."""
    engine = build_engine(cfg, run_dir / "engine")
    # The same model, optimizer and schedule the engine gets, built the same way.
    bare = build_engine(cfg, run_dir / "bare").state.run
    turns = Turns(first)
    engine.train_loader = TakingTurns(batches, 10, accumulation, turns)
    done = worker.submit(lambda: bare_steps(bare.model, bare.optimizer, bare.schedule, batches, accumulation, turns))
    turns.take("engine")
    engine.run()
    turns.give("engine", to="bare")
    return engine.state.samples_seen / turns.seconds["engine"], finished(done) / turns.seconds["bare"]


def aa_round(cfg: dict, run_dir: pathlib.Path, batches, accumulation: int, worker: BareWorker, first: str) -> float:
    """The A/A control of one round: the bare loop in the engine's place (this thread, the
    engine's turns) against the bare loop on the worker; returns their ratio of images/s."""
    here, there = (build_engine(cfg, run_dir / name).state.run for name in ("aa-here", "aa-there"))
    turns = Turns(first)
    done = worker.submit(lambda: bare_steps(there.model, there.optimizer, there.schedule, batches, accumulation, turns))
    samples = bare_steps(here.model, here.optimizer, here.schedule, batches, accumulation, turns, side=("engine", "bare"))
    return (samples / turns.seconds["engine"]) / (finished(done) / turns.seconds["bare"])


def finished(done: dict) -> int:
    """The worker's result once it has finished (its error raised here)."""
    done["event"].wait()
    if "error" in done:
        raise done["error"]
    return done["result"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--micro", type=int, default=32)
    parser.add_argument("--accumulation", type=int, default=4)
    add_arguments(parser)
    args = parser.parse_args(argv)
    set_clock(args.clock)
    batches = make_batches(args)
    engine_rates, bare_rates, aa_ratios = [], [], []
    worker = BareWorker()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = overrides(args, args.steps)
        # One untimed round first: the first pass through a model pays for allocator
        # growth and kernel selection.
        paired_round(cfg, pathlib.Path(tmp) / "warmup", batches, args.accumulation, worker, "engine")
        for i in range(args.rounds):
            # Alternate which loop takes the first step of a round.
            first = "engine" if i % 2 == 0 else "bare"
            engine_rate, bare_rate = paired_round(cfg, pathlib.Path(tmp) / f"round{i}", batches, args.accumulation, worker, first)
            engine_rates.append(engine_rate)
            bare_rates.append(bare_rate)
            aa_ratios.append(aa_round(cfg, pathlib.Path(tmp) / f"aa{i}", batches, args.accumulation, worker, first))
    engine_rate, bare_rate = statistics.median(engine_rates), statistics.median(bare_rates)
    print(f"Machine: {machine_description()}.")
    print(f"clock: {'CPU time of this process' if args.clock == 'cpu' else 'wall time'}")
    print(
        f"model {args.model} depth {args.depth}, {args.image_size}px, micro {args.micro} x accumulation {args.accumulation}, {args.steps} steps x {args.rounds} rounds"
    )
    print(table("loop | images/s (median): | rounds"))
    print(f"| bare PyTorch loop | {bare_rate:.1f} | {', '.join(f'{r:.1f}' for r in bare_rates)} |")
    print(f"| largebatch engine | {engine_rate:.1f} | {', '.join(f'{r:.1f}' for r in engine_rates)} |")
    ratios = [e / b for e, b in zip(engine_rates, bare_rates)]
    print(f"per-round engine / bare: {', '.join(f'{r:.3f}' for r in ratios)}; ratio of the medians {engine_rate / bare_rate:.3f}")
    print(f"engine / bare = {statistics.median(ratios):.3f}")
    print(f"A/A control, per round: {', '.join(f'{r:.3f}' for r in aa_ratios)}")
    print(f"A/A control: bare in the engine's place / bare = {statistics.median(aa_ratios):.3f}")


if __name__ == "__main__":
    main()
