"""Critical batch size: steps to a target accuracy against the global batch, per optimizer.

The protocol of Shallue et al. 2019 ("Measuring the Effects of Data Parallelism on
Neural Network Training"), with the fairness rule of Nado et al. 2021 ("A Large Batch
Optimizer Reality Check"): every (optimizer, global batch) cell gets the same tuning
budget, and the study reports how many optimizer steps each cell needs to reach a
target accuracy. Under perfect scaling, doubling the batch halves the steps; the batch
where that stops is the critical batch, which McCandlish et al. 2018 ("An Empirical
Model of Large-Batch Training") predict from the gradient noise scale B_simple, measured
here by the ``noise_scale`` hook during the small-batch runs.

Data: Fashion-MNIST's 60,000 training images split into 52,500 for training (train
shards 0-6) and 7,500 held out (train shard 7), both taken from ``data/fashion-mnist``
by symbolic links (``prepare_study_data``); the 10,000 official test images are the
test set. The held-out split chooses each cell's learning rate; the test set is only
reported.

Model: the demo's ViT made smaller (7-pixel patches, width 64, 2 layers of 2 heads,
whole images), so that the whole study fits in a few hours on two CPU cores; the same
script runs on a GPU (``--set device=cuda``).

Each trial is one ``largebatch train`` subprocess with a generated config:

* the same epoch budget at every batch size (``--epochs``, 20 by default: batch 4,096
  gets 240 steps), cosine decay to zero after a linear warmup whose length in epochs
  grows with the batch (``--warmup-epochs`` at batch 256, times batch / 256, at most a
  fifth of the run), so it is about the same number of steps at every batch size (as
  LAMB's ImageNet recipes scale it); clipping at norm 1.0;
* every step uses exactly the global batch (``partial_window='drop'``), micro-batches
  of ``--micro`` images (accumulation at every batch size, so the ``noise_scale`` hook
  has two batch sizes to compare);
* held-out and test accuracy evaluated at steps spaced by a factor ``--eval-ratio``
  (20%: the same relative resolution at every batch size) until both reach the target,
  and after the last step (``StudyEval`` below); both splits are decoded once and then
  replayed from memory (``eval.cache``).

Tuning, the same for every cell: the peak learning rate from a log grid with factor 2
(``--grid-factor``), ``--initial`` points centred on the optimizer's rule (LAMB and
AdamW: square-root scaling from their batch-256 value; LARS and SGD with Nesterov
momentum: linear scaling), extended one point at a time while the best point sits at
the grid's edge, up to ``--max-trials`` trials; a cell where no trial learned (every
one diverged or ended at most twice chance on the held-out split) is extended below
its smallest rate, the usual cure for a rate rule that overshoots. The best trial of a cell for steps to
target is the one that reaches the target on the held-out split in the fewest steps
(none reached: the best final held-out accuracy); for accuracy at equal epochs, the one
with the best final held-out accuracy. Other hyperparameters (weight decay, momentum)
are fixed per optimizer.

The epoch budget bounds what the study can show: a cell that misses the target only
bounds its efficiency by (steps at the smallest batch) / (its budget) / (batch ratio),
the same for every batch under a fixed epoch budget, so a knee below 0.5 can only be
shown where the smallest batch reaches the target within half the budget. A follow-up
with ``--reference`` runs chosen batches with a longer ``--epochs``, each grid centred on
the rate the earlier study chose for the cell, and reports efficiencies against the
earlier study's smallest batch (``reference_of``).

Results go to ``STEM.json`` after every trial (a trial already there is skipped, so a
stopped study resumes where it stopped; ``--jobs N`` runs N trials side by side, and
separate invocations over disjoint ``--optimizers``/``--batches`` can run on separate
machines and be combined with ``--report-only --merge``), then to ``STEM.md`` and
``STEM.png``.

    OMP_NUM_THREADS=1 python bench/critical_batch.py --jobs 2      # the study
    python bench/critical_batch.py --quick --out /tmp/cb            # smoke run, minutes
    python bench/critical_batch.py --report-only                    # re-render from the JSON
    OMP_NUM_THREADS=1 python bench/critical_batch.py --jobs 2 --stem critical_batch_4096_40ep \\
        --batches 4096 --epochs 40 --optimizers lamb adamw sgd --reference bench/results/critical_batch.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from largebatch.engine.hook import Hook, Priority  # noqa: E402

DEMO_CONFIG = REPO / "configs" / "demo" / "vit-tiny-fmnist.py"
BASE_BATCH = 256
HELDOUT_SPLIT = "heldout"
TEST_SPLIT = "validation"  # Fashion-MNIST's official test images, as data/prepare_fmnist.py names them


@dataclass(frozen=True)
class Recipe:
    """An optimizer's grid centre at batch 256, how it moves with the batch, and its fixed settings."""

    lr: float
    scaling: str  # "sqrt" or "linear"
    weight_decay: float
    extra: dict[str, Any] = field(default_factory=dict)

    def centre(self, batch: int) -> float:
        ratio = batch / BASE_BATCH
        return self.lr * (math.sqrt(ratio) if self.scaling == "sqrt" else ratio)


RECIPES = {
    "lamb": Recipe(1e-2, "sqrt", 0.05),
    "lars": Recipe(1.0, "linear", 5e-4, {"momentum": 0.9}),
    "adamw": Recipe(1e-3, "sqrt", 0.05),
    "sgd": Recipe(0.1, "linear", 5e-4, {"momentum": 0.9, "nesterov": True}),
}
STUDY_MODEL = dict(name="vit_tiny_patch16_224", patch_size=7, embed_dim=64, depth=2, num_heads=2, mlp_ratio=2.0)
QUICK_MODEL = dict(name="vit_tiny_patch16_224", patch_size=14, embed_dim=16, depth=1, num_heads=1, mlp_ratio=1.0)


# --------------------------------------------------------------------------- the hook


def eval_schedule(total_steps: int, ratio: float, first: int = 1) -> list[int]:
    """Steps ``first, ~first*ratio, ~first*ratio^2, ...`` (distinct integers) up to ``total_steps``."""
    steps, x = [], float(first)
    while x <= total_steps:
        step = int(math.ceil(x))
        if not steps or step > steps[-1]:
            steps.append(step)
        x *= ratio
    if not steps or steps[-1] != total_steps:
        steps.append(total_steps)
    return steps


class StudyEval(Hook):
    """Evaluates on the held-out split (the engine's ``data.eval_split``) and on the test
    split at geometrically spaced steps until both reach ``target``, and adds the test
    split's numbers (``test/top1``, ``test/loss``) to every evaluation's record.

    Args:
        target: top-1 accuracy, 0-1, both splits must reach before the spaced
            evaluations stop (the epoch-end evaluations go on).
        test_split: shard name prefix of the test split.
        ratio: spacing of the evaluation steps.
        first: the first evaluation step (default: a 300th of the run, at least 1).
        batch_size: test evaluation batch per rank (default: ``eval.batch_size``).
    """

    priority = Priority.NORMAL  # before the sinks (VERY_LOW) write the evaluation record

    def __init__(
        self,
        target: float,
        test_split: str = TEST_SPLIT,
        ratio: float = 1.2,
        first: int | None = None,
        batch_size: int | None = None,
        priority: int | str | None = None,
    ) -> None:
        super().__init__(priority)
        if not 0 < target <= 1:
            raise ValueError(f"target is a top-1 accuracy between 0 and 1, got {target}")
        if ratio <= 1:
            raise ValueError(f"ratio must be above 1, got {ratio}")
        self.target, self.test_split, self.ratio, self.first, self.batch_size = target, test_split, ratio, first, batch_size
        self.reached = {"eval/top1": False, "test/top1": False}
        self._steps: set[int] = set()
        self._loader = None

    def before_run(self, state) -> None:
        from largebatch import data as data_mod

        cfg = state.run.config
        first = self.first or max(1, state.run.total_steps // 300)
        self._steps = set(eval_schedule(state.run.total_steps, self.ratio, first))
        self._loader = data_mod.build_eval_loader(
            dataclasses.replace(cfg.data, eval_split=self.test_split),
            batch_size=self.batch_size or cfg.eval.batch_size or cfg.micro_batch_size,
            rank=state.run.rank,
            world_size=state.run.world_size,
            device=state.run.backend.device,
            cache=cfg.eval.cache,
        )

    def after_step(self, state) -> None:
        if state.step in self._steps and not all(self.reached.values()):
            state.request_eval()

    def after_eval(self, state) -> None:
        metrics = state.run.task.evaluate(state.run.model, self._loader, state.run.backend, prefix="test")
        state.eval_metrics = {**state.eval_metrics, "test/loss": metrics["test/loss"], "test/top1": metrics["test/top1"]}
        for key in self.reached:
            self.reached[key] = self.reached[key] or state.eval_metrics[key] >= self.target

    def after_run(self, state) -> None:
        close = getattr(self._loader, "close", None)
        if close is not None:
            close()


# --------------------------------------------------------------------------- data


def prepare_study_data(src: pathlib.Path, dst: pathlib.Path) -> dict[str, int]:
    """``dst``: ``src``'s training shards but the last as ``train``, the last as
    ``heldout``, and ``src``'s ``validation`` shards (the test set) as they are, all
    symbolic links, with a ``dataset.json``. Returns the records per split."""
    meta = json.loads((src / "dataset.json").read_text()) if (src / "dataset.json").is_file() else None
    train = sorted(p for p in src.glob("train-*-of-*") if p.suffix != ".idx")
    test = sorted(p for p in src.glob(f"{TEST_SPLIT}-*-of-*") if p.suffix != ".idx")
    if meta is None or len(train) < 2 or not test:
        raise SystemExit(
            f"error: {src}: needs a prepared Fashion-MNIST (dataset.json, 2 or more train shards, "
            f"{TEST_SPLIT} shards); run python data/prepare_fmnist.py"
        )
    layout = {f"train-{i:05d}-of-{len(train) - 1:05d}": p for i, p in enumerate(train[:-1])}
    layout[f"{HELDOUT_SPLIT}-00000-of-00001"] = train[-1]
    layout.update({p.name: p for p in test})
    dst.mkdir(parents=True, exist_ok=True)
    counts = {"train": 0, HELDOUT_SPLIT: 0, TEST_SPLIT: 0}
    for name, target in layout.items():
        for suffix in ("", ".idx"):
            link = dst / (name + suffix)
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to((target.parent / (target.name + suffix)).resolve())
        records = len((target.parent / (target.name + ".idx")).read_text().splitlines())
        counts[name.split("-", 1)[0]] += records
    splits = {split: {"records": n, "shards": sum(1 for k in layout if k.startswith(split + "-"))} for split, n in counts.items()}
    (dst / "dataset.json").write_text(
        json.dumps({**meta, "splits": splits, "source": f"{meta.get('source', src)} (study split)"}, indent=2) + "\n"
    )
    return counts


# --------------------------------------------------------------------------- trials


def trial_key(optimizer: str, batch: int, lr: float) -> str:
    return f"{optimizer}/{batch}/{lr:.6g}"


def trial_config(optimizer: str, batch: int, lr: float, args: argparse.Namespace) -> str:
    """The Python config of one trial."""
    recipe = RECIPES[optimizer]
    steps_per_epoch = args.train_samples // batch if not args.steps_per_epoch else args.steps_per_epoch
    warmup = min(args.warmup_epochs * batch / BASE_BATCH, 0.2 * args.epochs)
    hooks = []
    if args.noise_scale and batch > args.micro:
        hooks.append(dict(type="noise_scale"))
    study_eval = dict(type=f"{pathlib.Path(__file__).resolve()}:StudyEval", target=args.target, ratio=args.eval_ratio)
    hooks.append(study_eval)
    settings = {
        "seed": args.seed,
        "epochs": args.epochs,
        "global_batch_size": batch,
        "micro_batch_size": args.micro,
        "partial_window": "drop",
        "clip_grad_norm": 1.0,
        "model": args.model,
        "optimizer": dict(type=optimizer, lr=lr, weight_decay=recipe.weight_decay, **recipe.extra),
        "lr_schedule": dict(type="cosine", warmup_epochs=warmup, min_lr=0.0, scaling="none"),
        "data": dict(root=str(args.study_data), eval_split=HELDOUT_SPLIT, num_workers=0),
        "eval": dict(interval_epochs=0, at_end=True, batch_size=args.eval_batch, cache=True),
        "checkpoint": dict(interval_epochs=0, at_end=False),
        "log": dict(interval=max(1, (steps_per_epoch * args.epochs) // 100)),
        "hooks": hooks,
    }
    if args.steps_per_epoch:
        settings["steps_per_epoch"] = args.steps_per_epoch
    lines = [f"# critical_batch trial {trial_key(optimizer, batch, lr)}", f"_base_ = {str(args.config.resolve())!r}"]
    lines += [f"{key} = {value!r}" for key, value in settings.items()]
    return "\n".join(lines) + "\n" + "".join(f"{line}\n" for line in args.config_lines)


def steps_to(curve: list[dict], key: str, target: float) -> int | None:
    """The first evaluated step whose ``key`` is at least ``target`` (None: never)."""
    for point in curve:
        if point.get(key) is not None and point[key] >= target:
            return point["step"]
    return None


def finite_or_none(value: float | None) -> float | None:
    """The hook logs NaN while its estimate is unavailable; the results file says None
    (JSON has no NaN)."""
    return value if value is not None and math.isfinite(value) else None


def read_trial(run_dir: pathlib.Path, optimizer: str, batch: int, lr: float, target: float) -> dict[str, Any]:
    """One finished trial's record from its ``metrics.jsonl`` and ``config.yaml``."""
    import yaml

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    derived = yaml.safe_load((run_dir / "config.yaml").read_text())["derived"]
    curve, seen = [], set()
    for r in records:
        if "eval/top1" in r and r["step"] not in seen:
            seen.add(r["step"])
            curve.append({"step": r["step"], "epoch": r.get("epoch"), "heldout": r["eval/top1"], "test": r.get("test/top1")})
    noise = [{"step": r["step"], "b_simple": finite_or_none(r["noise_scale/b_simple"])} for r in records if "noise_scale/b_simple" in r]
    return {
        "optimizer": optimizer,
        "batch": batch,
        "lr": lr,
        "steps": derived["total_steps"],
        "warmup_steps": derived["warmup_steps"],
        "accumulation": derived["accumulation"],
        "curve": curve,
        "noise_scale": noise,
        "final_heldout": curve[-1]["heldout"] if curve else None,
        "final_test": curve[-1]["test"] if curve else None,
        "steps_to_target_heldout": steps_to(curve, "heldout", target),
        "steps_to_target_test": steps_to(curve, "test", target),
        "diverged": False,
    }


def trial_line(record: dict) -> str:
    if record["diverged"]:
        return "diverged"
    reached = record["steps_to_target_test"]
    return f"test top-1 {100 * record['final_test']:.1f}%, test target at step {'-' if reached is None else reached}"


def diverged_trial(optimizer: str, batch: int, lr: float, message: str) -> dict[str, Any]:
    return {
        "optimizer": optimizer,
        "batch": batch,
        "lr": lr,
        "curve": [],
        "noise_scale": [],
        "final_heldout": None,
        "final_test": None,
        "steps_to_target_heldout": None,
        "steps_to_target_test": None,
        "diverged": True,
        "message": message,
    }


def start_trial(optimizer: str, batch: int, lr: float, args: argparse.Namespace) -> tuple[subprocess.Popen, pathlib.Path]:
    work = pathlib.Path(tempfile.mkdtemp(prefix="lbcrit-"))
    config = work / "trial.py"
    config.write_text(trial_config(optimizer, batch, lr, args))
    cmd = [sys.executable, "-m", "largebatch", "train", "--config", str(config), "--run-dir", str(work / "run")]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    log = open(work / "output.txt", "w")  # noqa: SIM115 - closed by finish_trial
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    proc.log = log  # type: ignore[attr-defined]
    return proc, work


def finish_trial(proc: subprocess.Popen, work: pathlib.Path, optimizer: str, batch: int, lr: float, target: float, seconds: float) -> dict:
    proc.log.close()  # type: ignore[attr-defined]
    output = (work / "output.txt").read_text()
    try:
        if proc.returncode == 0:
            record = read_trial(work / "run", optimizer, batch, lr, target)
        elif "The run is diverging" in output:
            record = diverged_trial(optimizer, batch, lr, output.strip().splitlines()[-1])
        else:
            raise SystemExit(f"error: trial {trial_key(optimizer, batch, lr)} failed (status {proc.returncode}):\n{output[-3000:]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    record["seconds"] = round(seconds, 1)
    return record


# --------------------------------------------------------------------------- tuning


def score_steps(trial: dict) -> tuple[float, float]:
    """Lower is better: held-out steps to target, then the final held-out error."""
    steps = trial["steps_to_target_heldout"]
    return (math.inf if steps is None else steps, -(trial["final_heldout"] or 0.0))


def score_accuracy(trial: dict) -> tuple[float, float]:
    """Lower is better: the final held-out error, then steps to target."""
    return (-(trial["final_heldout"] or 0.0), score_steps(trial)[0])


def initial_grid(optimizer: str, batch: int, args: argparse.Namespace) -> list[float]:
    """``--initial`` rates spaced by ``--grid-factor`` around the optimizer's rule, or
    around the rate the ``--reference`` study chose for the same cell."""
    chosen = (args.reference or {}).get("chosen", {}).get(f"{optimizer}/{batch}")
    centre = chosen if chosen is not None else RECIPES[optimizer].centre(batch)
    half = (args.initial - 1) / 2
    return [round_lr(centre * args.grid_factor ** (i - half)) for i in range(args.initial)]


def round_lr(lr: float) -> float:
    return float(f"{lr:.6g}")


CHANCE = 0.1  # Fashion-MNIST: ten balanced classes


def learned(trial: dict) -> bool:
    """False for a trial that diverged or stayed near chance (at most twice it)."""
    return not trial["diverged"] and (trial["final_heldout"] or 0.0) > 2 * CHANCE


def next_lrs(trials: list[dict], optimizer: str, batch: int, args: argparse.Namespace) -> list[float]:
    """The learning rates this cell still has to try, given its finished trials."""
    tried = {t["lr"] for t in trials}
    todo = [lr for lr in initial_grid(optimizer, batch, args) if lr not in tried]
    if todo or len(trials) >= args.max_trials:
        return todo
    lrs = sorted(tried)
    if not any(learned(t) for t in trials):
        return [round_lr(lrs[0] / args.grid_factor)]
    wanted = []
    for score in (score_steps, score_accuracy):
        best = min(trials, key=lambda t, score=score: (score(t), t["lr"]))["lr"]
        if best == lrs[0]:
            wanted.append(round_lr(lrs[0] / args.grid_factor))
        elif best == lrs[-1]:
            wanted.append(round_lr(lrs[-1] * args.grid_factor))
    return list(dict.fromkeys(wanted))[: args.max_trials - len(trials)]


# --------------------------------------------------------------------------- analysis


def cell_trials(results: dict, optimizer: str, batch: int) -> list[dict]:
    return [t for t in results["trials"] if t["optimizer"] == optimizer and t["batch"] == batch]


def summarise(results: dict) -> dict[str, Any]:
    """Per optimizer and batch: the chosen trials, steps and samples to target, scaling
    efficiency against the smallest batch (or, for a study with a ``reference``, against
    the reference study's smallest batch), and per optimizer the knee and B_simple.

    A cell that did not reach the target within its budget of steps has no efficiency,
    only an upper bound (``efficiency_below``: steps at 256 / budget, over batch / 256).
    The knee is the first batch whose efficiency is below 0.5, known or bounded; a batch
    before it whose bound is above 0.5 leaves the knee undecided between them
    (``knee_undecided`` lists such batches: a longer budget would tell)."""
    batches = sorted({t["batch"] for t in results["trials"]})
    optimizers = [o for o in RECIPES if any(t["optimizer"] == o for t in results["trials"])]
    reference = results.get("reference")
    base = reference["base"] if reference else min(batches) if batches else BASE_BATCH
    cells, per_optimizer = {}, {}
    for opt in optimizers:
        for batch in batches:
            trials = cell_trials(results, opt, batch)
            if not trials:
                continue
            by_steps = min(trials, key=lambda t: (score_steps(t), t["lr"]))
            by_acc = min(trials, key=lambda t: (score_accuracy(t), t["lr"]))
            steps = by_steps["steps_to_target_test"] if by_steps["steps_to_target_heldout"] is not None else None
            cells[(opt, batch)] = {
                "lr_steps": by_steps["lr"],
                "steps_to_target": steps,
                "steps_to_target_heldout": by_steps["steps_to_target_heldout"],
                "samples_to_target": None if steps is None else steps * batch,
                "budget": by_steps.get("steps"),
                "lr_accuracy": by_acc["lr"],
                "final_test": by_acc["final_test"],
                "trials": len(trials),
                "lrs": sorted(t["lr"] for t in trials),
                "edge": by_steps["lr"] in (min(t["lr"] for t in trials), max(t["lr"] for t in trials)) and len(trials) > 1,
            }
        ref = reference["base_steps"].get(opt) if reference else cells.get((opt, base), {}).get("steps_to_target")
        knee, undecided = None, []
        for batch in batches:
            cell = cells.get((opt, batch))
            if cell is None:
                continue
            steps, scale = cell["steps_to_target"], batch / base
            cell["efficiency"] = None if (ref is None or steps is None) else (ref / steps) / scale
            # not reached within the budget: the efficiency is only known to be below this
            cell["efficiency_below"] = ref / cell["budget"] / scale if ref is not None and steps is None and cell["budget"] else None
            if ref is None or knee is not None or batch <= base:
                continue
            if cell["efficiency"] is not None:
                below = cell["efficiency"] < 0.5
            elif cell["efficiency_below"] is not None and cell["efficiency_below"] <= 0.5:
                below = True
            else:  # the budget was too short to tell whether efficiency fell below 0.5 here
                undecided.append(batch)
                continue
            if below:
                knee = batch
        b_simple = reference["b_simple"].get(opt) if reference else b_simple_near_target(results, opt, base, cells)
        per_optimizer[opt] = {
            "base_steps": ref,
            "knee": knee,
            "knee_undecided": undecided,
            "b_simple": b_simple or {"near_target": None, "whole_run": None},
        }
    return {"batches": batches, "optimizers": optimizers, "base": base, "cells": cells, "per_optimizer": per_optimizer}


def reference_of(path: pathlib.Path) -> dict[str, Any]:
    """What a follow-up study keeps of an earlier one (``--reference``): its file name and
    settings, its smallest batch with that batch's steps to target and B_simple per
    optimizer (the base of the follow-up's efficiencies), and the rate it chose for steps
    to target in every cell (the centre of the follow-up's grid for the same cell)."""
    results = load_results(path)
    s = summarise(results)
    return {
        "file": path.name,
        "target": results.get("settings", {}).get("target"),
        "epochs": results.get("settings", {}).get("epochs"),
        "base": s["base"],
        "base_steps": {opt: cell["steps_to_target"] for (opt, batch), cell in s["cells"].items() if batch == s["base"]},
        "b_simple": {opt: info["b_simple"] for opt, info in s["per_optimizer"].items()},
        "chosen": {f"{opt}/{batch}": cell["lr_steps"] for (opt, batch), cell in s["cells"].items()},
    }


def b_simple_near_target(results: dict, optimizer: str, base: int, cells: dict) -> dict[str, float | None]:
    """B_simple from the chosen small-batch trial: the median of the logged (smoothed)
    values over the last half of the steps before the test target was reached, and over
    the whole run."""
    cell = cells.get((optimizer, base))
    if cell is None:
        return {"near_target": None, "whole_run": None}
    trial = next(t for t in cell_trials(results, optimizer, base) if t["lr"] == cell["lr_steps"])
    values = [(p["step"], p["b_simple"]) for p in trial["noise_scale"] if p["b_simple"] is not None and math.isfinite(p["b_simple"])]
    if not values:
        return {"near_target": None, "whole_run": None}
    end = cell["steps_to_target"] or trial.get("steps") or values[-1][0]
    near = [v for s, v in values if end / 2 <= s <= end] or [v for _, v in values]
    return {"near_target": median(near), "whole_run": median([v for _, v in values])}


def knee_text(info: dict, largest: int) -> str:
    """The knee column: a batch, a range the budget could not narrow, or none."""
    undecided, knee = info.get("knee_undecided", []), info["knee"]
    if not undecided:
        return f"{knee:,}" if knee else f"none up to {largest:,}"
    first = f"{undecided[0]:,}"
    if knee:
        return f"{first} to {knee:,} (undecided: target not reached at {first} in its budget)"
    return f"{first} or later (undecided: target not reached at {first} in its budget)"


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def follow_ups(out: pathlib.Path, stem: str) -> list[tuple[str, dict, dict]]:
    """``(stem, settings, summary)`` of every study in ``out`` made with ``--reference``
    pointing at ``STEM.json``: its cells are shown beside this study's."""
    found = []
    for path in sorted(out.glob("*.json")):
        if path.name == f"{stem}.json":
            continue
        try:
            other = load_results(path)
        except (ValueError, KeyError, TypeError):
            continue  # not a study's results
        if (other.get("reference") or {}).get("file") == f"{stem}.json" and other.get("trials"):
            found.append((path.stem, other.get("settings", {}), summarise(other)))
    return found


def render(results: dict, out: pathlib.Path, stem: str) -> None:
    s = summarise(results)
    extra = follow_ups(out, stem)
    settings = results.get("settings", {})
    target = settings.get("target", 0)
    batches, optimizers, cells = s["batches"], s["optimizers"], s["cells"]

    def cell_text(opt: str, batch: int, fmt) -> str:
        cell = cells.get((opt, batch))
        return "-" if cell is None else fmt(cell)

    def steps_text(c: dict) -> str:
        if c["steps_to_target"] is None:
            bound = "" if c.get("efficiency_below") is None else f", < {c['efficiency_below']:.2f}"
            return f"not reached in {c['budget']}{bound}" if c.get("budget") else "not reached"
        eff = "" if c.get("efficiency") is None else f" ({c['efficiency']:.2f})"
        return f"{c['steps_to_target']}{eff}{'*' if c['edge'] else ''}"

    header = "| optimizer | " + " | ".join(f"batch {b}" for b in batches) + " |"
    follow_up = []
    if reference := results.get("reference"):
        base_steps = ", ".join(f"{opt} {'-' if v is None else v}" for opt, v in reference["base_steps"].items())
        follow_up = [
            f"A follow-up of `{reference['file']}` ({reference['epochs']} epochs at every batch): efficiencies are against "
            f"its steps to target at batch {reference['base']} ({base_steps}), each cell's grid is centred on the rate it "
            "chose for the same cell, and the B_simple below is the one it measured.",
            "",
        ]
    rule = "|---|" + "---:|" * len(batches)
    lines = [
        "# Critical batch size: steps to a target accuracy, per optimizer",
        "",
        f"Machine: {results.get('machine', '?')}.",
        "",
        "Commands: " + "; ".join(f"`{c}`" for c in results.get("commands", ["?"])),
        "",
        f"Model: {settings.get('model', '?')}; {settings.get('epochs', '?')} epochs at every batch size over "
        f"{settings.get('train_samples', '?')} training images (7,500 held out); micro-batch {settings.get('micro', '?')}; "
        f"target {100 * target:.0f}% top-1; learning-rate grid factor {settings.get('grid_factor', '?')}, "
        f"{settings.get('initial', '?')} points then edge extensions, at most {settings.get('max_trials', '?')} trials a cell.",
        "",
        f"## Steps to {100 * target:.0f}% test top-1 (scaling efficiency against batch {s['base']})",
        "",
        *follow_up,
        "Learning rate chosen on the held-out split; `*`: the chosen rate sits at the grid's edge after the extensions "
        "allowed (the cell may be under-tuned). `not reached in N, < e`: the target was not reached in the N steps of "
        "the budget, so the efficiency is below e.",
        "",
        header,
        rule,
    ]
    lines += [f"| {opt} | " + " | ".join(cell_text(opt, b, steps_text) for b in batches) + " |" for opt in optimizers]
    for name, other_settings, other in extra:
        cells_text = "; ".join(
            f"{opt} at {batch:,}: {steps_text(cell)}"
            for (opt, batch), cell in sorted(other["cells"].items(), key=lambda kv: (kv[0][1], kv[0][0]))
        )
        lines += ["", f"Follow-up [`{name}.md`]({name}.md), {other_settings.get('epochs', '?')} epochs: {cells_text}."]
    lines += ["", "Samples to target (millions):", "", header, rule]
    lines += [
        f"| {opt} | "
        + " | ".join(
            cell_text(opt, b, lambda c: "-" if c["samples_to_target"] is None else f"{c['samples_to_target'] / 1e6:.2f}") for b in batches
        )
        + " |"
        for opt in optimizers
    ]
    lines += ["", "Chosen peak learning rate (steps to target) and the rates tried:", "", header, rule]
    lines += [
        f"| {opt} | "
        + " | ".join(cell_text(opt, b, lambda c: f"{c['lr_steps']:g} of {', '.join(f'{x:g}' for x in c['lrs'])}") for b in batches)
        + " |"
        for opt in optimizers
    ]
    lines += [
        "",
        f"## Where perfect scaling ends, and B_simple (measured at batch {s['base']})",
        "",
        "| optimizer | first batch with efficiency < 0.5 | B_simple near the target | B_simple, whole run |",
        "|---|---:|---:|---:|",
    ]
    for opt in optimizers:
        info = s["per_optimizer"][opt]
        b = info["b_simple"]
        fmt = lambda v: "-" if v is None else f"{v:,.0f}"  # noqa: E731
        if info["base_steps"] is None:
            knee = f"- (batch {s['base']} did not reach the target)"
        else:
            knee = knee_text(info, batches[-1])
        lines.append(f"| {opt} | {knee} | {fmt(b['near_target'])} | {fmt(b['whole_run'])} |")
    lines += [
        "",
        f"## Test top-1 (%) after {settings.get('epochs', '?')} epochs at every batch size",
        "",
        "Learning rate chosen by the final held-out accuracy.",
        "",
        header,
        rule,
    ]
    lines += [
        f"| {opt} | "
        + " | ".join(cell_text(opt, b, lambda c: "-" if c["final_test"] is None else f"{100 * c['final_test']:.1f}") for b in batches)
        + " |"
        for opt in optimizers
    ]
    total = sum(t.get("seconds", 0) for t in results["trials"])
    summary = f"{len(results['trials'])} trials, {total / 3600:.2f} hours of trial time in all"
    if results.get("wall_seconds"):
        summary += (
            f"; {results['wall_seconds'] / 3600:.2f} hours of wall-clock time (each invocation counted up to its last finished trial)"
        )
    lines += ["", summary + "."]
    if results.get("reading"):
        lines += ["", "## Reading", "", results["reading"]]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    plot(s, out / f"{stem}.png", target, [(other_settings.get("epochs"), other) for _, other_settings, other in extra])


def plot(s: dict, path: pathlib.Path, target: float, extra: list[tuple[int | None, dict]] = ()) -> None:
    """Steps to target and accuracy against the batch; ``extra``: follow-ups' ``(epochs,
    summary)``, whose cells that reached the target are drawn as open markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches, cells, base = s["batches"], s["cells"], s["base"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    any_steps = False
    for i, opt in enumerate(s["optimizers"]):
        color = f"C{i}"
        xs = [b for b in batches if (opt, b) in cells and cells[(opt, b)]["steps_to_target"] is not None]
        left.plot(xs, [cells[(opt, b)]["steps_to_target"] for b in xs], marker="o", color=color, label=opt)
        any_steps = any_steps or bool(xs)
        ref = cells.get((opt, base), {}).get("steps_to_target")
        if ref:
            left.plot(batches, [ref * base / b for b in batches], ":", color=color, alpha=0.6)
        for epochs, other in extra:
            points = [(b, c["steps_to_target"]) for (o, b), c in other["cells"].items() if o == opt and c["steps_to_target"]]
            if points:
                last = max(xs) if xs else None
                link = [(last, cells[(opt, last)]["steps_to_target"])] if last else []
                line = sorted(link + points)
                left.plot([b for b, _ in line], [v for _, v in line], "--", color=color, alpha=0.7)
                left.plot([b for b, _ in points], [v for _, v in points], "o", mfc="white", color=color, label=f"{opt}, {epochs} epochs")
                any_steps = True
        b_simple = s["per_optimizer"][opt]["b_simple"]["near_target"]
        if b_simple:
            left.axvline(b_simple, color=color, alpha=0.4, linestyle="-.")
        accs = [(b, cells[(opt, b)]["final_test"]) for b in batches if (opt, b) in cells and cells[(opt, b)]["final_test"] is not None]
        right.plot([b for b, _ in accs], [100 * a for _, a in accs], marker="o", color=color, label=opt)
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.set_xticks(batches, [str(b) for b in batches])
        axis.set_xlabel("global batch size")
        axis.grid(alpha=0.3)
        axis.legend()
    if any_steps:  # a log axis with no positive data warns and draws nothing useful
        left.set_yscale("log")
    left.set_ylabel(f"steps to {100 * target:.0f}% test top-1")
    left.set_title("steps to target (dotted: perfect scaling; vertical: B_simple)")
    right.set_ylabel("test top-1 (%)")
    right.set_title("accuracy after the same number of epochs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- driver


def load_results(path: pathlib.Path) -> dict:
    if not path.exists():
        return {"trials": []}
    results = json.loads(path.read_text())
    for trial in results["trials"]:  # files written before NaN became None
        for point in trial["noise_scale"]:
            point["b_simple"] = finite_or_none(point["b_simple"])
    return results


def save_results(results: dict, path: pathlib.Path) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=1) + "\n")
    os.replace(tmp, path)


def pending(results: dict, args: argparse.Namespace, running: set[str]) -> list[tuple[str, int, float]]:
    todo = []
    for batch in args.batches:
        for opt in args.optimizers:
            trials = cell_trials(results, opt, batch)
            # an extension depends on the cell's finished trials: wait for its running ones
            if trials and len(trials) >= args.initial and any(k.startswith(f"{opt}/{batch}/") for k in running):
                continue
            for lr in next_lrs(trials, opt, batch, args):
                if trial_key(opt, batch, lr) not in running:
                    todo.append((opt, batch, lr))
    return todo


def run_study(results: dict, json_path: pathlib.Path, args: argparse.Namespace) -> None:
    running: dict[str, tuple[subprocess.Popen, pathlib.Path, tuple[str, int, float], float]] = {}
    started, wall_before = time.time(), results.get("wall_seconds", 0.0)
    try:
        while True:
            for opt, batch, lr in pending(results, args, set(running)):
                if len(running) >= args.jobs:
                    break
                proc, work = start_trial(opt, batch, lr, args)
                running[trial_key(opt, batch, lr)] = (proc, work, (opt, batch, lr), time.time())
                print(f"started {trial_key(opt, batch, lr)}", flush=True)
            if not running:
                return
            time.sleep(1.0)
            for key in [k for k, (proc, *_rest) in running.items() if proc.poll() is not None]:
                proc, work, (opt, batch, lr), start = running.pop(key)
                record = finish_trial(proc, work, opt, batch, lr, args.target, time.time() - start)
                results["trials"].append(record)
                results["wall_seconds"] = round(wall_before + time.time() - started, 1)
                save_results(results, json_path)
                print(f"{key}: {trial_line(record)} ({record['seconds']:.0f}s)", flush=True)
    finally:
        for proc, work, *_rest in running.values():
            proc.kill()
            proc.wait()
            proc.log.close()  # type: ignore[attr-defined]
            shutil.rmtree(work, ignore_errors=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optimizers", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--batches", type=int, nargs="+", default=[256, 1024, 4096, 16384])
    parser.add_argument("--epochs", type=int, default=20, help="the epoch budget of every trial")
    parser.add_argument("--target", type=float, default=0.85, help="top-1 accuracy (0-1) to reach")
    parser.add_argument("--micro", type=int, default=128, help="micro-batch size of every trial")
    parser.add_argument("--warmup-epochs", type=float, default=0.05, help="warmup at batch 256; grows with the batch")
    parser.add_argument("--grid-factor", type=float, default=2.0)
    parser.add_argument("--initial", type=int, default=3, help="initial grid points per cell")
    parser.add_argument("--max-trials", type=int, default=5, help="trials per cell, extensions included")
    parser.add_argument("--eval-ratio", type=float, default=1.2, help="spacing of the evaluation steps")
    parser.add_argument("--eval-batch", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1, help="trials run side by side")
    parser.add_argument("--no-noise-scale", dest="noise_scale", action="store_false", help="leave the noise_scale hook out")
    parser.add_argument("--steps-per-epoch", type=int, help="cap steps per epoch (smoke runs)")
    parser.add_argument("--quick", action="store_true", help="a smoke run of minutes: tiny model, batches 64 and 128, 2 trials a cell")
    parser.add_argument("--config", type=pathlib.Path, default=DEMO_CONFIG, help="base config of every trial")
    parser.add_argument(
        "--set", dest="config_lines", action="append", default=[], metavar="KEY=VALUE", help="extra config line for every trial"
    )
    parser.add_argument("--data", type=pathlib.Path, default=REPO / "data" / "fashion-mnist", help="prepared Fashion-MNIST")
    parser.add_argument("--study-data", type=pathlib.Path, default=REPO / "data" / "fashion-mnist-study", help="where the split's links go")
    parser.add_argument("--out", type=pathlib.Path, default=REPO / "bench" / "results")
    parser.add_argument("--stem", default="critical_batch")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument(
        "--merge", type=pathlib.Path, nargs="+", default=[], metavar="JSON", help="with --report-only: combine these results"
    )
    parser.add_argument("--reading", type=pathlib.Path, help="a Markdown file with the results' reading, kept in the JSON")
    parser.add_argument(
        "--reference",
        type=pathlib.Path,
        metavar="JSON",
        help="an earlier study at the same target (e.g. with a longer --epochs for the large batches): efficiencies "
        "against its smallest batch, grids centred on its chosen rates",
    )
    args = parser.parse_args(argv)
    args.model = dict(STUDY_MODEL)
    if args.quick:
        args.model = dict(QUICK_MODEL)
        args.batches = [64, 128] if args.batches == parser.get_default("batches") else args.batches
        args.micro, args.epochs, args.steps_per_epoch = 32, 1, args.steps_per_epoch or 3
        args.initial, args.max_trials, args.target, args.eval_ratio = 2, 3, 0.3, 2.0
        args.eval_batch = 2500
    args.config_lines = [_config_line(item) for item in args.config_lines]
    return args


def _config_line(item: str) -> str:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise SystemExit(f"error: --set {item!r}: expected KEY=VALUE")
    return f"{key.strip()} = {value.strip()}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / f"{args.stem}.json"
    results = load_results(json_path)
    if args.merge:
        parts = [load_results(path) for path in args.merge]
        results = {**parts[0], "trials": [t for part in parts for t in part["trials"]]}
        results["commands"] = list(dict.fromkeys(c for part in parts for c in part.get("commands", [])))
        save_results(results, json_path)
    if not args.report_only:
        from bench.machine import machine_description

        if args.reference:
            args.reference = reference_of(args.reference)
            if args.reference["target"] != args.target:
                raise SystemExit(
                    f"error: --reference {args.reference['file']} aims at {args.reference['target']}, this study at {args.target}"
                )
            results["reference"] = args.reference
        counts = prepare_study_data(args.data, args.study_data)
        args.train_samples = counts["train"]
        settings = {
            "model": args.model,
            "epochs": args.epochs,
            "target": args.target,
            "micro": args.micro,
            "warmup_epochs_at_256": args.warmup_epochs,
            "grid_factor": args.grid_factor,
            "initial": args.initial,
            "max_trials": args.max_trials,
            "train_samples": counts["train"],
            "heldout_samples": counts[HELDOUT_SPLIT],
            "test_samples": counts[TEST_SPLIT],
            "steps_per_epoch": args.steps_per_epoch,
            "config_lines": args.config_lines,
            **({"reference": args.reference["file"]} if args.reference else {}),
        }
        if results["trials"] and results.get("settings") not in (None, settings):
            raise SystemExit(
                f"error: {json_path} holds trials made with other settings ({results['settings']}); use another --stem or --out"
            )
        results.setdefault("machine", machine_description())
        command = "python bench/critical_batch.py " + " ".join(argv if argv is not None else sys.argv[1:])
        results["commands"] = list(dict.fromkeys([*results.get("commands", []), command]))  # each invocation that added trials
        results["settings"] = settings
        run_study(results, json_path, args)
    if args.reading:
        results["reading"] = args.reading.read_text().strip()
        save_results(results, json_path)
    if results["trials"]:
        render(results, args.out, args.stem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
