"""The deferred non-finite check (``largebatch.engine.update``): with an optimizer that skips
an update on a device flag (fused AdamW, LAMB, LARS), ``nan_guard`` reads no flag on the
host per step, and every outcome equals the synchronous check's, the reference (the same
run with the optimizer's device skip hidden from the guard): parameters, optimizer state,
counts, logged metrics, messages, checkpoints and a resume across a skipped step."""

from __future__ import annotations

import math

import pytest
import torch

from largebatch import checkpoint as ckpt
from largebatch.engine.hook import Hook, Priority
from largebatch.engine.update import NonFiniteError, defers
from largebatch.hooks.checkpoint import CheckpointHook
from largebatch.hooks.trust_ratio import TrustRatioHook
from tests.hooks.common import build
from tests.hooks.test_nan_guard import POISON_STEP, PoisonGrad, PoisonInput, Snapshots
from tests.support.host_reads import HostReads

STEPS = 6
# fused AdamW reads ``found_inf`` in torch's kernel; LAMB and LARS on their CPU paths here
# (``tests/optim/test_found_inf.py`` has every path)
OPTIMIZERS = ["adamw", "lamb", "lars"]
TIMINGS = ("time", "elapsed_seconds", "images_per_second", "data_wait_fraction", "step_seconds")


class SeesSkip(Hook):
    """What a hook reading ``state.current.skipped`` after the update sees, and the gradients then."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, bool, bool]] = []

    def after_optimizer_step(self, state) -> None:
        skipped = state.current.skipped  # first: the gradients of a skipped step are zeroed once it is known
        self.seen.append((state.step, skipped, all(not p.grad.any() for p in state.run.model.parameters())))


def hide_device_skip(optimizer: torch.optim.Optimizer) -> None:
    """The same optimizer, its device skip hidden: the guard checks on the host."""
    optimizer._step_supports_amp_scaling = False
    optimizer.skips_on_found_inf = False


def run(tmp_path, hooks, *, deferred: bool, optimizer: str = "adamw", **overrides):
    """A run of ``STEPS`` steps with ``optimizer``; ``deferred=False``: the synchronous reference."""
    engine, records = build(tmp_path, hooks, steps=STEPS, optimizer=optimizer, clip_grad_norm=1.0, **overrides)
    if not deferred:
        hide_device_skip(engine.state.run.optimizer)
    run_state = engine.state.run
    assert defers(run_state.guard.action, run_state) is deferred
    return engine, records


def plain(record: dict) -> dict:
    """A logged record without its timings, NaN as a string, so two records compare with ``==``."""
    return {k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in record.items() if k not in TIMINGS}


def outcome(engine) -> dict:
    run = engine.state.run
    optimizer = run.optimizer.state_dict()
    return {
        "weights": {k: v.clone() for k, v in run.model.state_dict().items()},
        "optimizer": {(i, k): torch.as_tensor(v).clone() for i, entry in optimizer["state"].items() for k, v in entry.items()},
        "guard": run.guard.state_dict(),
        "counters": engine.state.counters.state_dict(),
    }


def assert_same(got: dict, want: dict) -> None:
    assert got["guard"] == want["guard"] and got["counters"] == want["counters"]
    for part in ("weights", "optimizer"):
        assert got[part].keys() == want[part].keys()
        for key, value in want[part].items():
            assert torch.equal(got[part][key], value), (part, key)


@pytest.mark.parametrize("log_interval", [1, 10])  # 1: settled by the logging of the step itself; 10: by the next step
@pytest.mark.parametrize("poison", ["grad", "input"])
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_a_deferred_skip_is_the_synchronous_skip_bit_for_bit(tmp_path, capsys, optimizer, poison, log_interval):
    results = {}
    for deferred in (False, True):
        seen = SeesSkip()
        hooks = [PoisonGrad("fc2.weight") if poison == "grad" else PoisonInput(), seen]
        if optimizer != "adamw":  # the ratios logged, but not a skipped step's
            hooks.append(TrustRatioHook())
        overrides = {"nan_guard.action": "skip", "log.interval": log_interval}
        engine, records = run(tmp_path / str(deferred), hooks, deferred=deferred, optimizer=optimizer, **overrides)
        engine.run()
        printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("nan_guard:")]
        results[deferred] = (outcome(engine), [plain(r) for r in records.logged], printed, seen.seen)
    (want, want_logged, want_out, want_seen), (got, got_logged, got_out, got_seen) = results[False], results[True]
    assert want["guard"]["skipped"] == 1 and f"skipping the update: non-finite values at step {POISON_STEP} " in want_out[0]
    assert_same(got, want)
    assert got_logged == want_logged and got_out == want_out
    assert got_seen == want_seen and want_seen[POISON_STEP] == (POISON_STEP, True, True)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_the_deferred_check_reads_nothing_on_the_host(tmp_path, optimizer):
    counts = {}
    for label, action, deferred in (("off", "off", False), ("sync", "skip", False), ("deferred", "skip", True)):
        engine, _ = build(tmp_path / label, [], steps=STEPS, optimizer=optimizer, **{"nan_guard.action": action})
        if not deferred:
            hide_device_skip(engine.state.run.optimizer)
        with HostReads() as reads:
            engine.run()
        counts[label] = len(reads.seen)
    assert counts["sync"] == counts["off"] + STEPS  # the synchronous check: one read per step
    assert counts["deferred"] == counts["off"]


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_a_deferred_stop_stops_a_step_later_without_the_bad_update(tmp_path, optimizer):
    errors, checkpoints, weights = {}, {}, {}
    for deferred in (False, True):
        saver = CheckpointHook(interval_steps=1, interval_epochs=0, keep=10, at_end=False)
        snaps = Snapshots()
        engine, _ = run(tmp_path / str(deferred), [PoisonGrad("fc2.bias"), saver, snaps], deferred=deferred, optimizer=optimizer)
        with pytest.raises(NonFiniteError) as error:
            engine.run()
        errors[deferred] = (str(error.value), engine.state.step)
        checkpoints[deferred] = [p.name for p in ckpt.list_checkpoints(tmp_path / str(deferred))]
        weights[deferred] = (snaps.before[POISON_STEP], engine.state.run.model.state_dict())
    assert errors[False] == (errors[True][0], POISON_STEP) and errors[True][1] == POISON_STEP + 1
    assert f"at step {POISON_STEP} " in errors[True][0] and "fc2.bias" in errors[True][0]
    assert checkpoints[True] == checkpoints[False] == [f"step-{s:08d}.pt" for s in range(1, POISON_STEP + 1)]
    before, after = weights[True]  # the bad step's update was not applied
    assert all(torch.equal(after[k], v) for k, v in before.items())


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_a_resume_across_a_deferred_skip_is_exact(tmp_path, optimizer):
    hooks = [PoisonGrad("fc2.weight"), CheckpointHook(interval_steps=1, interval_epochs=0, keep=10, at_end=False)]
    straight, _ = run(tmp_path / "straight", hooks, deferred=True, optimizer=optimizer, **{"nan_guard.action": "skip"})
    straight.run()
    path = tmp_path / "straight" / "checkpoints" / f"step-{POISON_STEP + 1:08d}.pt"  # just after the skipped step
    assert torch.load(path, weights_only=False)["nan_guard"] == {"skipped": 1, "overflows": 0, "in_a_row": 1}
    resumed, _ = run(tmp_path / "resumed", [PoisonGrad("fc2.weight")], deferred=True, optimizer=optimizer, **{"nan_guard.action": "skip"})
    ckpt.load_checkpoint(path, resumed.state, resumed.hooks, resumed.train_loader, ignore_config=True)
    resumed.run()
    assert_same(outcome(resumed), outcome(straight))


class SyncsAreErrors(Hook):
    """From the last ``before_optimizer_step`` hook on, a host sync raises (torch's sync debug
    mode), on the steps that are neither logged nor the first (which builds the optimizer's state)."""

    priority = Priority.LOWEST

    def before_optimizer_step(self, state) -> None:
        if state.step > 0 and not state.will_log:
            torch.cuda.set_sync_debug_mode("error")


class SyncsAllowed(Hook):
    """Ends ``SyncsAreErrors``' span after the last ``after_step`` hook: the update and the
    default hooks after it (``preemption``'s flag among them) do not sync either."""

    priority = Priority.LOWEST

    def after_step(self, state) -> None:
        torch.cuda.set_sync_debug_mode("default")


# the optimizer's settings, and whether the check is deferred with it (foreach AdamW: not)
ON_A_GPU = {"fused-adamw": ({"optimizer.fused": True}, True), "lamb": ({"optimizer.type": "lamb"}, True), "adamw": ({}, False)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("optimizer", list(ON_A_GPU))
def test_on_a_gpu_the_deferred_check_clip_and_step_do_not_sync(tmp_path, optimizer):
    from bench.common import build_engine
    from largebatch.engine.engine import Engine

    changes, deferred = ON_A_GPU[optimizer]
    cfg = {"device": "cuda", "precision": "bf16", "max_steps": 4, "model": {"name": "vit_tiny_patch16_224", "patch_size": 8, "depth": 1}}
    built = build_engine({**cfg, **changes}, tmp_path / "run")
    engine = Engine(built.state, [*built.hooks, SyncsAreErrors(), SyncsAllowed()], built.train_loader)
    try:
        if deferred:
            engine.run()  # the check, the clipping and the update: no host sync
            assert engine.state.step == 4
        else:  # the reference: the synchronous check reads its flag on the host
            with pytest.raises(RuntimeError, match="called a synchronizing CUDA operation"):
                engine.run()
    finally:
        torch.cuda.set_sync_debug_mode("default")
        engine.close()


class StateAtEachStep(Hook):
    """The parameters and the optimizer's state at each ``before_step``."""

    def __init__(self) -> None:
        super().__init__()
        self.at: dict[int, dict] = {}

    def before_step(self, state) -> None:
        optimizer = state.run.optimizer.state_dict()["state"]
        self.at[state.step] = {
            "weights": {k: v.clone() for k, v in state.run.model.state_dict().items()},
            "optimizer": {(i, k): v.clone() for i, entry in optimizer.items() for k, v in entry.items()},
        }


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("optimizer", ["fused-adamw", "lamb"])  # LAMB: its Triton kernel reads the flag
def test_on_a_gpu_a_deferred_skip_changes_nothing(tmp_path, optimizer):
    from bench.common import build_engine
    from largebatch.engine.engine import Engine

    cfg = {"device": "cuda", "precision": "bf16", "max_steps": POISON_STEP + 3, "nan_guard.action": "skip", **ON_A_GPU[optimizer][0]}
    built = build_engine({**cfg, "model": {"name": "vit_tiny_patch16_224", "patch_size": 8, "depth": 1}}, tmp_path / "run")
    assert defers(built.state.run.guard.action, built.state.run)
    states = StateAtEachStep()
    engine = Engine(built.state, [*built.hooks, PoisonGrad("head.weight"), states], built.train_loader)
    try:
        engine.run()  # the flag read through pinned memory after a CUDA event
    finally:
        engine.close()
    assert engine.state.run.guard.state_dict() == {"skipped": 1, "overflows": 0, "in_a_row": 0}
    before, after = states.at[POISON_STEP], states.at[POISON_STEP + 1]  # the skipped step changed nothing
    for part in ("weights", "optimizer"):
        assert all(torch.equal(after[part][key], value) for key, value in before[part].items()), part
    assert not torch.equal(states.at[POISON_STEP - 1]["weights"]["head.weight"], before["weights"]["head.weight"])
