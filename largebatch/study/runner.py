"""One trial: a ``largebatch train`` subprocess with ``--set`` overrides in its own run
directory, and what it measured, read back from its ``metrics.jsonl``.

The overrides, in order: the optimizer's type, the study's ``set``, the optimizer's
``set``, the cell (global batch, micro-batch, seed, the held-out split as the evaluation
split), the evaluation and checkpoint settings the protocol needs (evaluations placed by
``largebatch.study.evaluation.TargetEvalHook``, cached evaluation batches, no
checkpoints: a trial run again starts afresh), the trial's parameters, then the hooks:
the base config's, the study's evaluation hook and, in re-runs, the ``noise_scale`` hook.
They are kept with the trial (``overrides``), so any trial can be run again by hand.

Trials are forked from a fork server that imported torch, timm and largebatch once
(``multiprocessing``'s ``forkserver`` with ``PRELOAD``): a trial then runs exactly what
``largebatch train`` runs (``largebatch.train_command.train_main``, the training entry
point, which imports nothing of the other commands and so nothing of the study's) without
paying seconds of imports.
A trial's process ends with its worker: it holds the read end of a pipe whose only write
end is the worker's, and a thread of its own kills it at the pipe's end of file, so a
worker killed with ``kill -9`` leaves no training behind. (Its parent is the fork server,
which itself lives on while any process it forked does, so neither the parent-death
signal nor the server's own exit would do.)
"""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import os
import pathlib
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import largebatch
from largebatch.rundir import RunDir, read_metrics
from largebatch.study import arm_trials, ledger
from largebatch.study.evaluation import OUTCOME
from largebatch.study.space import overrides as param_overrides
from largebatch.study.spec import StudySpec
from largebatch.study.target import Crossing, first_crossing

EVAL_HOOK = "largebatch.study.evaluation:TargetEvalHook"
# What the fork server imports once; every trial then starts in well under a second.
PRELOAD = ["torch", "timm", "largebatch.train_command", "largebatch.launch", "largebatch.study.evaluation", "largebatch.hooks.noise_scale"]
_SERVER_LOCK = threading.Lock()
_CONTEXT: Any = None


@dataclasses.dataclass(frozen=True)
class Base:
    """What a study reads from its base config (with the study's ``set``), once."""

    epochs: int
    beta2: float
    micro_batch_size: int
    hooks: tuple[Any, ...]
    longest: dict[tuple[str, int], int] = dataclasses.field(default_factory=dict)  # cell -> steps at the top of its budget
    arm_hooks: dict[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)  # arm label -> its config's hooks


def micro_batch(spec: StudySpec, base: Base, batch: int) -> int:
    """A cell's micro-batch: the largest divisor of ``batch`` at most ``micro_batch_size``
    and, with ``noise_scale``, at most ``batch / min_ratio`` (every trial of a cell uses it)."""
    limit = min(spec.micro_batch_size or base.micro_batch_size, batch)
    if spec.noise_scale is not None:
        limit = min(limit, max(1, batch // int(spec.noise_scale["min_ratio"])))
    return max(d for d in range(1, limit + 1) if batch % d == 0)


def trial_overrides(
    spec: StudySpec, base: Base, info: dict[str, Any], params: dict[str, float], stop_after: list[float | None] | None
) -> list[str]:
    """The ``--set`` overrides of one trial (``info``: its user attributes; ``stop_after``:
    per target, the step by which a tuning trial must have reached it)."""
    opt, batch = spec.optimizer(info["optimizer"]), int(info["batch"])
    sets = [f"optimizer.type={opt.type}", *spec.overrides, *opt.overrides]
    sets += [f"global_batch_size={batch}", f"micro_batch_size={micro_batch(spec, base, batch)}", f"seed={info['seed']}"]
    sets += protocol_overrides(spec)
    sets += param_overrides(params, opt.type, base.epochs, base.beta2)
    seed_run = info["phase"] == ledger.SEED
    hooks = [*base.hooks, evaluation_hook(spec, seed_run, None if seed_run else stop_after)]
    if seed_run and spec.noise_scale is not None:
        hooks.append({"type": "noise_scale", **spec.noise_scale})
    sets.append("hooks=" + json.dumps(hooks))
    return sets


def protocol_overrides(spec: StudySpec) -> list[str]:
    """The ``--set`` overrides every trial of the study's protocol takes: the held-out split
    as the evaluation split (from the carved shards with ``data.carve``), evaluations placed
    by the study's hook only, cached, at the end too, and no checkpoints."""
    sets = [f"data.eval_split={spec.data['heldout']}"]
    if spec.data["carve"]:
        sets.append(f"data.root={spec.folder / 'data'}")
    sets += ["eval.interval_epochs=0", "eval.at_end=true", "eval.cache=true"]
    if spec.evaluation["batch_size"]:
        sets.append(f"eval.batch_size={spec.evaluation['batch_size']}")
    return sets + [
        "checkpoint.interval_epochs=0",
        "checkpoint.at_end=false",
        "checkpoint.interval_steps=null",
        "checkpoint.interval_minutes=null",
    ]


def evaluation_hook(spec: StudySpec, measured: bool, stop_after: list[float | None] | None, stop_at_target: bool = True) -> dict[str, Any]:
    """The study's ``TargetEvalHook`` entry: its targets and schedule; a ``measured`` trial (a
    re-run or an arm) evaluates the test split beside the held-out one."""
    hook = {
        "type": EVAL_HOOK,
        "metric": spec.target.metric,
        "targets": [t.value for t in spec.targets],
        "mode": spec.target.mode,
        "test_split": spec.data["test"] if measured else None,
        **{k: spec.evaluation[k] for k in ("coarse", "fine", "dense_within", "first_fraction", "refine")},
        "stop_after": stop_after,
    }
    return hook if stop_at_target else {**hook, "stop_at_target": False}


def arm_overrides(spec: Any, hooks: tuple[Any, ...], info: dict[str, Any]) -> list[str]:
    """The ``--set`` overrides of one arm trial (``hooks``: its arm's config's hooks)."""
    arm = next(a for a in spec.arms if a.label == info["arm"])
    sets = [*spec.overrides, *arm.overrides, f"seed={info['seed']}", *protocol_overrides(spec)]
    hook = evaluation_hook(spec, True, None, stop_at_target=False)
    return [*sets, "hooks=" + json.dumps([*hooks, hook])]


def run_dir_name(number: int, info: dict[str, Any]) -> str:
    return f"{number:04d}-" + info["key"].replace("/", "-")


def _context() -> Any:
    """The fork server's multiprocessing context, made once per process."""
    global _CONTEXT
    with _SERVER_LOCK:
        if _CONTEXT is None:
            package_root = str(pathlib.Path(largebatch.__file__).resolve().parents[1])
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(PRELOAD)
            _CONTEXT = context
        return _CONTEXT


def _train(argv: list[str], log: str, threads: int, worker: Any) -> None:
    """A trial's process: ``largebatch train ARGV`` with its output in ``log``, in a session
    of its own (a terminal's Ctrl-C reaches the worker, which stops it), killed when
    ``worker`` (the read end of the worker's pipe) reaches its end."""
    threading.Thread(target=_die_with, args=(worker,), name="die-with-worker", daemon=True).start()
    os.setsid()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the process's own streams
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)
    from largebatch.train_command import train_main

    status = train_main(argv, prog="largebatch train")
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(status)


def _die_with(worker: Any) -> None:
    """Block until the worker's end of the pipe closes (the worker ended, however), then
    end this process at once."""
    try:
        worker.recv_bytes()
    except (EOFError, OSError):
        pass
    os.kill(os.getpid(), signal.SIGKILL)


def run(argv: list[str], run_dir: pathlib.Path, threads: int, beat: Callable[[], None], every: float, stop: Callable[[], bool]) -> int:
    """Run ``largebatch train ARGV`` in a process forked from the fork server, with its
    output in ``run_dir/train.log``, calling ``beat`` every ``every`` seconds; stopped
    (SIGTERM, then SIGKILL) when ``stop()`` turns true. Returns its exit status (negative:
    the signal that ended it)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    context = _context()
    reader, writer = context.Pipe(duplex=False)
    process = context.Process(target=_train, args=(argv, str(run_dir / "train.log"), threads, reader), daemon=False)
    try:
        process.start()
        reader.close()  # the trial holds the read end; this process, the only write end
        return _watch(process, beat, every, stop)
    finally:
        writer.close()


def _watch(process: Any, beat: Callable[[], None], every: float, stop: Callable[[], bool]) -> int:
    """Wait for ``process``, calling ``beat`` every ``every`` seconds; stop it (SIGTERM,
    then SIGKILL) when ``stop()`` turns true. Its exit status."""
    last_beat = time.monotonic()
    while True:
        process.join(timeout=min(every, 1.0))
        if process.exitcode is not None:
            return int(process.exitcode)
        if stop():
            process.terminate()
            process.join(timeout=60)
            if process.exitcode is None:
                process.kill()
                process.join()
            return int(process.exitcode or -signal.SIGKILL)
        if time.monotonic() - last_beat >= every:
            beat()
            last_beat = time.monotonic()


def read_outcome(run_dir: pathlib.Path, spec: StudySpec, seconds: float) -> dict[str, Any]:
    """What a finished trial measured: its evaluations (``curve``: step, held-out value,
    test value, held-out loss), the crossings of every target on both splits
    (``crossings``: target key -> 'eval'/'test' -> crossing), the held-out value at its end
    and at its best, B_simple at the fixed loss, why it stopped."""
    metric, mode = spec.target.metric, spec.target.mode
    records = read_metrics(RunDir(run_dir).metrics) if RunDir(run_dir).metrics.is_file() else []
    evaluations = {r["step"]: r for r in records if f"eval/{metric}" in r}
    ended = json.loads((run_dir / OUTCOME).read_text()) if (run_dir / OUTCOME).is_file() else {}
    rows = {s: [s, _num(r.get(f"eval/{metric}")), _num(r.get(f"test/{metric}")), _num(r.get("eval/loss"))] for s, r in evaluations.items()}
    for step, *values in ended.pop("refined", []):  # the kept weights evaluated around a crossing
        rows.setdefault(int(step), [int(step), *map(_num, values)])
    curve = [rows[s] for s in sorted(rows)]
    progress = [[0, 0, 0.0], *ended.get("progress", [])]
    crossings = {
        t.key: {
            split: _with_cost(first_crossing(((p[0], p[i]) for p in curve), t.value, mode), progress)
            for split, i in (("eval", 1), ("test", 2))
        }
        for t in spec.targets
    }
    values = [p[1] for p in curve if p[1] is not None]
    noise = next(
        (
            {k.rsplit("/", 1)[1]: v for k, v in r.items() if k.startswith("noise_scale/at_loss/")}
            for r in records
            if "noise_scale/at_loss/b_simple" in r
        ),
        None,
    )
    return {
        **ended,
        "curve": curve,
        "crossings": crossings,
        "final_eval": values[-1] if values else None,
        "best_eval": (max(values) if mode == "max" else min(values)) if values else None,
        "noise_at_loss": noise,
        "seconds": round(seconds, 1),
    }


def read_arm_outcome(run_dir: pathlib.Path, spec: Any, seconds: float) -> dict[str, Any]:
    """``read_outcome`` with the totals, the final values and the ``batch/*`` log."""
    outcome = read_outcome(run_dir, spec, seconds)
    last = (outcome.get("progress") or [[0, 0, 0.0]])[-1]
    final = outcome["curve"][-1] if outcome["curve"] else [None, None, None, None]
    return {
        **outcome,
        "steps_total": last[0],
        "samples_total": last[1],
        "train_seconds": last[2],
        "final_test": final[2] if spec.data["test"] else final[1],
        "batch_log": arm_trials.batch_log(run_dir),
    }


def _with_cost(crossing: Crossing | None, progress: list[list[float]]) -> dict[str, float] | None:
    """A crossing as stored, with the samples seen and training seconds at its step, read
    linearly between the recorded steps around it (``progress``: ``[step, samples, seconds]``
    from step 0; none recorded: the steps alone)."""
    if crossing is None:
        return None
    out: dict[str, float] = crossing.record()
    after = next((i for i, p in enumerate(progress) if p[0] >= crossing.steps), None)
    if after is None or len(progress) < 2:
        return out
    (s0, n0, t0), (s1, n1, t1) = progress[max(after - 1, 0)], progress[after]
    share = 0.0 if s1 == s0 else (crossing.steps - s0) / (s1 - s0)
    return {**out, "samples": n0 + share * (n1 - n0), "seconds": round(t0 + share * (t1 - t0), 3)}


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def tail(path: pathlib.Path, lines: int = 25) -> str:
    """The last lines of a trial's log (its error, for the study's record)."""
    if not path.is_file():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
