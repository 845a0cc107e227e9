"""LAMB and LARS under ``found_inf`` (``largebatch.optim.layerwise``), on every update path.

The reference is the same run without the flagged steps: a step whose flag is 1.0 (its
gradients NaN and inf) leaves the parameters and the whole state (moments, step counts,
momentum buffers, no state at all before a first step) bit for bit as they were, as if it
had not been taken; a step whose flag is 0.0 is the plain step bit for bit, statistics
included. fp16's ``GradScaler`` still checks on the host and skips ``step``, as before.
"""

from __future__ import annotations

import pytest
import torch

from largebatch.engine.update import step_unless
from largebatch.optim import lamb_update
from largebatch.optim.lamb import Lamb
from largebatch.optim.lars import Lars
from tests.optim.test_lamb import make_grads, make_params

# Every path: LAMB's CPU kernel (whole tensors and pieces), the multi-tensor ops, torch's
# fused Adam kernel (on the CPU here), the per-tensor reference, clipping inside the step,
# decoupled decay; LARS's foreach and per-tensor paths, with and without momentum.
CASES = {
    "lamb": (Lamb, {}),
    "lamb-chunked": (Lamb, {"chunk_elements": 16}),
    "lamb-multi-tensor": (Lamb, {"chunk_elements": 0}),
    "lamb-fused-adam": (Lamb, {"chunk_elements": 0, "fused": True}),
    "lamb-per-tensor": (Lamb, {"foreach": False}),
    "lamb-clip-decoupled": (Lamb, {"max_grad_norm": 1.0, "decoupled_weight_decay": True, "max_trust_ratio": 0.5}),
    "lars": (Lars, {}),
    "lars-per-tensor": (Lars, {"foreach": False}),
    "lars-nesterov": (Lars, {"nesterov": True}),
    "lars-no-momentum": (Lars, {"momentum": 0.0}),
}


def build(case: str, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> tuple[list[torch.Tensor], torch.optim.Optimizer]:
    """The parameters of ``tests.optim.test_lamb`` (a zero tensor, a zero gradient) in a
    decayed and a no-decay group, and the case's optimizer."""
    cls, options = CASES[case]
    options = dict(options)
    if options.pop("fused", False):
        monkeypatch.setattr(lamb_update, "FUSED_DEVICES", ("cpu",))
    params = make_params(dtype=dtype)
    groups = [{"params": params[:3]}, {"params": params[3:], "weight_decay": 0.0}]
    lr = 0.01 if cls is Lamb else 0.5
    return params, cls(groups, lr=lr, weight_decay=0.1, **options)


def snapshot(params: list[torch.Tensor], optimizer: torch.optim.Optimizer) -> dict:
    state = optimizer.state_dict()["state"]
    return {
        "entries": sorted(state),  # which parameters have state, empty or not
        "params": [p.detach().clone() for p in params],
        "state": {(i, k): v.clone() if isinstance(v, torch.Tensor) else v for i, entry in state.items() for k, v in entry.items()},
    }


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (the sign of a zero too, NaNs alike)."""
    ints = {torch.float64: torch.int64, torch.float32: torch.int32}[a.dtype]
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(ints), b.view(ints))


def assert_identical(got: dict, want: dict) -> None:
    assert got["entries"] == want["entries"]
    assert got["state"].keys() == want["state"].keys()
    for key, value in want["state"].items():
        other = got["state"][key]
        assert same_bits(other, value) if isinstance(value, torch.Tensor) else other == value, key
    for ours, theirs in zip(got["params"], want["params"]):
        assert same_bits(ours, theirs)


def run(case: str, monkeypatch: pytest.MonkeyPatch, plan: list[str], stats: bool = False, dtype: torch.dtype = torch.float64) -> list[dict]:
    """Steps by ``plan``: ``plain`` (``step()``), ``zero`` (``found_inf`` 0.0), ``flagged``
    (NaN and inf gradients, ``found_inf`` 1.0), ``absent`` (no step); each step's gradients
    are those of its index. Returns a snapshot after each, and ``last_stats``."""
    params, optimizer = build(case, monkeypatch, dtype)
    snapshots = []
    for index, kind in enumerate(plan):
        for p, g in zip(params, make_grads(index, dtype)):
            p.grad = g.clone()
        if kind == "flagged":
            params[1].grad[0], params[4].grad[-1] = float("nan"), float("inf")
        if stats:
            optimizer.request_stats()
        if kind in ("zero", "flagged"):
            step_unless(optimizer, torch.tensor(1.0 if kind == "flagged" else 0.0))
        elif kind == "plain":
            optimizer.step()
        snapshots.append(snapshot(params, optimizer))
    return [*snapshots, getattr(optimizer, "last_stats", None)]


def check_flagged_steps(case: str, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype = torch.float64) -> None:
    """The first step and a later one flagged: after each, everything is as before it, and
    the steps after it go on as in the run that never took it."""
    got = run(case, monkeypatch, ["flagged", "plain", "plain", "flagged", "plain"], dtype=dtype)
    want = run(case, monkeypatch, ["absent", "plain", "plain", "absent", "plain"], dtype=dtype)
    assert not want[0]["entries"] and (want[1]["entries"] or case == "lars-no-momentum")  # no state before a first step
    for ours, theirs in zip(got[:-1], want[:-1]):
        assert_identical(ours, theirs)


def check_zero_flags(case: str, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype = torch.float64) -> None:
    """Steps under a 0.0 flag are the plain steps, statistics included."""
    got = run(case, monkeypatch, ["zero"] * 3, stats=True, dtype=dtype)
    want = run(case, monkeypatch, ["plain"] * 3, stats=True, dtype=dtype)
    for ours, theirs in zip(got[:-1], want[:-1]):
        assert_identical(ours, theirs)
    for group, entry in want[-1].items():
        for key in ("trust_ratio", "weight_norm", "update_norm"):
            assert torch.equal(got[-1][group][key], entry[key])


@pytest.mark.parametrize("case", list(CASES))
def test_a_flagged_step_is_a_step_not_taken(case, monkeypatch):
    check_flagged_steps(case, monkeypatch)


@pytest.mark.parametrize("case", list(CASES))
def test_a_zero_flag_is_the_plain_step(case, monkeypatch):
    check_zero_flags(case, monkeypatch)


@pytest.mark.parametrize("cls", [Lamb, Lars])
def test_a_pickled_or_loaded_optimizer_holds_the_settled_state(cls):
    """A copy taken right after a flagged step (``copy.deepcopy`` pickles) has the state as
    before it; loading a state dict forgets the pending flag with the state it changed."""
    import copy

    params = make_params()
    optimizer = cls(params, lr=0.01)
    for p, g in zip(params, make_grads(0)):
        p.grad = g
    optimizer.step()
    before = optimizer.state_dict()
    params[0].grad[0] = float("nan")
    step_unless(optimizer, torch.tensor(1.0))
    assert copy.deepcopy(optimizer).state_dict()["state"].keys() == before["state"].keys()
    step_unless(optimizer, torch.tensor(1.0))
    optimizer.load_state_dict(before)
    after = optimizer.state_dict()["state"]
    assert after.keys() == before["state"].keys()
    for i, entry in before["state"].items():
        assert all(torch.equal(after[i][k], v) if isinstance(v, torch.Tensor) else after[i][k] == v for k, v in entry.items())


def test_fp16_grad_scaler_steps_as_before():
    """Under ``GradScaler`` (unscale, then ``scaler.step``): finite gradients give the plain
    step on the unscaled gradients; an inf skips ``step`` on the host as before: nothing
    changes, not even the statistics asked for (the scaler does not see ``found_inf``)."""
    results = {}
    for label in ("scaler", "plain"):
        params = make_params(dtype=torch.float32)
        optimizer = Lamb(params, lr=0.01, weight_decay=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        stats = []
        for index in range(3):
            # the scale as scaler.scale(loss) applies it; a power of two: unscaling is exact
            scale = scaler.scale(torch.ones(())).item() if label == "scaler" else 1.0
            for p, g in zip(params, make_grads(index, torch.float32)):
                p.grad = g * scale
            if index == 1:
                params[2].grad[0, 0, 0] = float("inf")
            optimizer.request_stats()
            if label == "scaler":
                scaler.unscale_(optimizer)
                scaler.step(optimizer)
                scaler.update()
            elif index != 1:
                optimizer.step()
            stats.append(optimizer.last_stats)
        results[label] = (snapshot(params, optimizer), stats)
    (got, got_stats), (want, want_stats) = results["scaler"], results["plain"]
    assert_identical(got, want)
    assert got_stats[1] is got_stats[0]  # the skipped step recorded nothing
    assert torch.equal(got_stats[2]["group0"]["trust_ratio"], want_stats[2]["group0"]["trust_ratio"])
