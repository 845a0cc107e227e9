"""Hook cost: optimizer-step time of the engine with its default hooks against no hooks.

What it compares and how it times: BENCHMARKS.md, "Cost of the default hooks".

    OMP_NUM_THREADS=1 python bench/hook_cost.py [--rounds 4] [--steps 40] [--clip 1.0] [--hooks noise_scale] [--device cpu]
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: start again as the module (bench/common.py)
    __import__("common").run_as_module(__file__)

import collections
import contextlib
import io
import pathlib
import random
import statistics
import tempfile
import time

from bench import engine_overhead
from bench.common import MODEL, FixedBatches, build_engine, load, machine_description, options, random_batches, spread, table
from largebatch.engine.engine import Engine
from largebatch.engine.events import Event


class PairedEngine(Engine):
    """The engine firing its hooks on one step of each pair, drawn at random (seeded), and none on the
    other; records each step's wall time and the time inside each hook call."""

    def __init__(self, *args, seed: int = 0, aa: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.aa = aa  # A/A control: neither step of a pair fires the hooks
        self.all_hooks = self._by_event
        # Clipping (``--clip``) and the non-finite check are the engine's own: both sides run them.
        self.no_hooks: dict[Event, list] = {event: [] for event in Event}
        self.steps: list[tuple[bool, float]] = []  # (with hooks, seconds)
        self.state.hook_times = {}  # the engine then times every hook call
        self._order: list[bool] = []
        self._random = random.Random(seed)

    def _train_step(self, batches, window: int) -> None:
        if not self._order:
            self._order = self._random.sample([True, False], 2)
        with_hooks = self._order.pop(0)
        self._by_event = self.all_hooks if with_hooks and not self.aa else self.no_hooks
        self.state.run.backend.synchronize()
        start = time.perf_counter()
        super()._train_step(batches, window)
        self.state.run.backend.synchronize()
        self.steps.append((with_hooks, time.perf_counter() - start))
        if len(self.steps) == 2:
            self.state.hook_times = {}  # the first pair warms up (and the throughput hook counts FLOPs once): left out
        self._by_event = self.all_hooks  # once-per-run events always fire

    @property
    def hook_seconds(self) -> collections.Counter[str]:
        """Seconds inside each hook (``state.hook_times``), once-per-run events left out."""
        seconds: collections.Counter[str] = collections.Counter()
        for (name, event), (_, total) in self.state.hook_times.items():
            if event not in ONCE_PER_RUN:
                seconds[name] += total
        return seconds


ONCE_PER_RUN = {"before_run", "before_train", "after_train", "after_run"}


def overrides(args) -> dict:
    """The engine-overhead bench's config, clipping as ``--clip`` says, logging at the schema's default interval."""
    changes = {"device": args.device, "max_steps": args.steps, "clip_grad_norm": args.clip, "log": {"console": False}, "hooks": args.hooks}
    return engine_overhead.overrides(args, 4 * args.steps) | changes


def run_round(cfg: dict, run_dir: pathlib.Path, batches, seed: int, aa: bool = False) -> PairedEngine:
    built = build_engine(cfg, run_dir)
    engine = PairedEngine(built.state, built.hooks, FixedBatches(batches), seed=seed, aa=aa)
    with contextlib.redirect_stdout(io.StringIO()):  # the logger's closing line
        engine.run()
    return engine


def main() -> None:
    steps, clip = (40, "steps per round (even: pairs)"), (0.0, "clip_grad_norm (0: off); clipping runs on both sides")
    parser = options(__doc__, rounds=4, steps=steps, micro=32, accumulation=2, **MODEL | {"patch": 8, "depth": 4}, device="cpu", clip=clip)
    parser.add_argument("--hooks", nargs="*", default=[], help="hooks added to the defaults (built-in names)")
    args = parser.parse_args()
    batches = random_batches(args.accumulation * 4, args.micro, args.image_size, "cuda" if args.device == "cuda" else "cpu")
    times = {True: [], False: []}
    pair_ratios, aa_ratios, hook_seconds, steps_with_hooks = [], [], collections.Counter(), 0
    with tempfile.TemporaryDirectory() as tmp:
        cfg = overrides(args)
        for i in range(args.rounds):
            engine = run_round(cfg, pathlib.Path(tmp) / f"round{i}", batches, seed=i)
            steps = engine.steps[2:]  # the first pair of a fresh engine warms up
            for first, second in zip(steps[::2], steps[1::2]):
                on, off = (first, second) if first[0] else (second, first)
                pair_ratios.append(on[1] / off[1])
                times[True].append(on[1])
                times[False].append(off[1])
            hook_seconds.update(engine.hook_seconds)
            steps_with_hooks += sum(on for on, _ in steps)
            hook_names = [h.name for h in engine.hooks]
            control = run_round(cfg, pathlib.Path(tmp) / f"aa{i}", batches, seed=i, aa=True).steps[2:]
            aa_ratios += [a[1] / b[1] if a[0] else b[1] / a[1] for a, b in zip(control[::2], control[1::2])]
    without = statistics.median(times[False])
    print(f"Machine: {machine_description()}; {load()}; device {args.device}.")
    print(
        f"model {args.model} depth {args.depth}, {args.image_size}px patch {args.patch}, micro {args.micro} x accumulation "
        f"{args.accumulation}, clip_grad_norm {args.clip or 'off'}; {args.rounds} rounds x {args.steps} steps, {len(pair_ratios)} timed pairs; "
        f"default hooks: {', '.join(hook_names)}"
    )
    rows = [
        f"| {name} | {statistics.median(times[on]) * 1e3:.2f} | {statistics.fmean(times[on]) * 1e3:.2f} |"
        for name, on in (("no hooks", False), ("default hooks", True))
    ]
    print("\n" + table("steps | median step (ms): | mean step (ms):", rows) + "\n")
    (ratio, q1, q3), (aa, aa_q1, aa_q3) = spread(pair_ratios), spread(aa_ratios)
    print(
        f"with / without, per pair: median {ratio:.4f} ({(ratio - 1) * 100:+.2f}%), quartiles {q1:.4f} .. {q3:.4f}; "
        f"ratio of means {statistics.fmean(times[True]) / statistics.fmean(times[False]):.4f}"
    )
    print(f"A/A control (no hooks on either step), per pair: median {aa:.4f}, quartiles {aa_q1:.4f} .. {aa_q3:.4f}")
    per_step = {name: seconds / steps_with_hooks for name, seconds in hook_seconds.most_common()}
    per_step["all hooks"] = sum(per_step.values())
    rows = [f"| {name} | {seconds * 1e3:.3f} | {seconds / without * 100:.3f}% |" for name, seconds in per_step.items()]
    print("\n" + table("hook | time inside per step with hooks (ms): | share of the median step without hooks:", rows))


if __name__ == "__main__":
    main()
