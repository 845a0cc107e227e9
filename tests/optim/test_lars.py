"""LARS against You et al. 2017 (arXiv:1708.03888) written out per tensor, and against
timm's ``Lars`` with the same options."""

from __future__ import annotations

import copy
import itertools

import pytest
import timm.optim
import torch

from largebatch.config import validate
from largebatch.config.typed import typed
from largebatch.errors import ConfigError, UserError
from largebatch.optim import build_optimizer, optimizer_kwargs
from largebatch.optim.lars import Lars
from tests.conftest import tiny_config
from tests.optim.test_lamb import make_grads, make_params

LR, MOMENTUM, ETA, EPS = 0.5, 0.9, 1e-3, 1e-8
DECAYED = (0, 2, 4)  # a weight, a zero weight, a tiny weight; the others form the no-decay group


def reference(params, grads_per_step, *, wd, nesterov, momentum=MOMENTUM, adapt_all=False):
    """The update rule of the module docstring, one tensor at a time, in float64 and
    without any of the optimizer's code; returns the final weights and each step's ratios."""
    weights = [p.detach().clone() for p in params]
    buffers = [None] * len(weights)
    ratios = []
    for grads in grads_per_step:
        step_ratios = []
        for i, (x, g) in enumerate(zip(weights, grads)):
            decay = wd if i in DECAYED else 0.0
            ratio = 1.0
            if decay != 0 or adapt_all:
                w_norm, g_norm = float(x.norm()), float(g.norm())
                if w_norm > 0 and g_norm > 0:
                    ratio = ETA * w_norm / (g_norm + decay * w_norm + EPS)
            d = ratio * (g + decay * x)
            if momentum:
                buffers[i] = d.clone() if buffers[i] is None else momentum * buffers[i] + d
                d = d + momentum * buffers[i] if nesterov else buffers[i]
            weights[i] = x - LR * d
            step_ratios.append(ratio)
        ratios.append(step_ratios)
    return weights, ratios


def groups(params, wd):
    decayed = [params[i] for i in DECAYED]
    others = [p for i, p in enumerate(params) if i not in DECAYED]
    return [
        {"params": decayed, "weight_decay": wd, "name": "decay", "param_names": [f"p{i}" for i in DECAYED]},
        {
            "params": others,
            "weight_decay": 0.0,
            "name": "no_decay",
            "param_names": [f"p{i}" for i in range(len(params)) if i not in DECAYED],
        },
    ]


def run(optimizer, params, grads_per_step):
    for grads in grads_per_step:
        for p, g in zip(params, grads):
            p.grad = g.clone()
        optimizer.step()
    return [p.detach() for p in params]


@pytest.mark.parametrize(("foreach", "nesterov", "wd"), list(itertools.product([True, False], [False, True], [0.0, 1e-2])))
def test_lars_matches_the_written_out_rule(foreach, nesterov, wd):
    params = make_params()
    steps = [make_grads(t) for t in range(4)]
    expected, _ = reference(params, steps, wd=wd, nesterov=nesterov)
    opt = Lars(groups(params, wd), lr=LR, momentum=MOMENTUM, eta=ETA, eps=EPS, nesterov=nesterov, foreach=foreach)
    for got, want in zip(run(opt, params, steps), expected):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("window", [1, 7, 40])
def test_windows_of_the_cpu_update_change_nothing(monkeypatch, window):
    """The CPU path updates windows of whole tensors of at most N elements (one tensor
    alone when larger): any split gives the written-out rule, stats included."""
    import largebatch.optim.lars as lars_module

    assert len(lars_module._windows(make_params(), window)) > 1  # the split is real
    monkeypatch.setattr(lars_module, "CPU_WINDOW_ELEMENTS", window)
    params = make_params()
    steps = [make_grads(t) for t in range(4)]
    expected, _ = reference(params, steps, wd=1e-2, nesterov=True)
    opt = Lars(groups(params, 1e-2), lr=LR, momentum=MOMENTUM, eta=ETA, eps=EPS, nesterov=True)
    for got, want in zip(run(opt, params, steps), expected):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


def test_windows_cover_every_tensor_once_in_order():
    from largebatch.optim.lars import _windows

    sizes = [torch.empty(n) for n in (5, 3, 10, 1, 1, 2)]
    assert _windows(sizes, 8) == [[0, 1], [2], [3, 4, 5]]
    assert _windows(sizes, 0) == [[0, 1, 2, 3, 4, 5]]
    assert _windows(sizes, 1) == [[0], [1], [2], [3], [4], [5]]


def test_no_decay_adapt_puts_every_group_under_the_ratio_and_zero_norms_get_ratio_one():
    params = make_params()
    steps = [make_grads(t) for t in range(3)]
    expected, ratios = reference(params, steps, wd=1e-2, nesterov=False, adapt_all=True)
    opt = Lars(groups(params, 1e-2), lr=LR, momentum=MOMENTUM, eta=ETA, eps=EPS, no_decay_adapt=True)
    opt.request_stats()
    run(opt, params, steps[:1])
    first = opt.last_stats  # the first step's: tensor 2 has a zero weight and tensor 3 a zero gradient
    for got, want in zip(run(opt, params, steps[1:]), expected):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    assert first["decay"]["param_names"] == ["p0", "p2", "p4"]
    torch.testing.assert_close(first["decay"]["trust_ratio"], torch.tensor([ratios[0][i] for i in DECAYED], dtype=torch.float64))
    assert first["decay"]["trust_ratio"][1] == 1.0  # ||x|| = 0
    assert first["no_decay"]["trust_ratio"][1] == 1.0  # tensor 3: ||g|| = 0
    assert 0 < first["decay"]["trust_ratio"][0] < 0.01  # eta-sized


def test_plain_momentum_sgd_when_no_group_adapts():
    # with weight decay 0 and no_decay_adapt=False, LARS is torch's momentum SGD
    params = make_params()
    twins = [p.detach().clone().requires_grad_(True) for p in params]
    steps = [make_grads(t) for t in range(3)]
    ours = run(Lars(params, lr=LR, momentum=MOMENTUM, nesterov=True), params, steps)
    torch_sgd = run(torch.optim.SGD(twins, lr=LR, momentum=MOMENTUM, nesterov=True), twins, steps)
    for a, b in zip(ours, torch_sgd):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("foreach", [True, False])
def test_lars_matches_timm(nesterov, foreach):
    wd = 5e-3
    params = make_params(dtype=torch.float32)
    twins = [p.detach().clone().requires_grad_(True) for p in params]
    steps = [make_grads(t, dtype=torch.float32) for t in range(5)]
    ours = Lars(groups(params, wd), lr=LR, momentum=MOMENTUM, eta=ETA, eps=EPS, nesterov=nesterov, foreach=foreach)
    timms = timm.optim.Lars(groups(twins, wd), lr=LR, momentum=MOMENTUM, trust_coeff=ETA, eps=EPS, nesterov=nesterov)
    for a, b in zip(run(ours, params, steps), run(timms, twins, steps)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_config_builds_lars_with_biases_and_norms_excluded():
    cfg = validate(tiny_config(optimizer=dict(type="lars", lr=2.0, weight_decay=1e-4, momentum=0.9, eta=2e-3, nesterov=True)))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3))
    opt = build_optimizer(typed(cfg).optimizer, model)
    assert isinstance(opt, Lars)
    by_name = {g["name"]: g for g in opt.param_groups}
    assert by_name["decay"]["weight_decay"] == 1e-4 and by_name["no_decay"]["weight_decay"] == 0.0
    assert all(p.ndim == 2 for p in by_name["decay"]["params"]) and all(p.ndim == 1 for p in by_name["no_decay"]["params"])
    assert opt.defaults["eta"] == 2e-3 and opt.defaults["nesterov"] is True
    model(torch.randn(5, 4)).sum().backward()
    opt.request_stats()
    opt.step()
    assert torch.all(opt.last_stats["no_decay"]["trust_ratio"] == 1.0)
    assert torch.all(opt.last_stats["decay"]["trust_ratio"] < 1.0)


def test_unknown_lars_option_names_the_key():
    # timm calls eta trust_coeff: the message lists the names this one takes
    with pytest.raises(ConfigError, match=r"optimizer.trust_coeff: lars does not take 'trust_coeff'; Lars takes: .*eta"):
        optimizer_kwargs(validate(tiny_config(optimizer=dict(type="lars", lr=1.0, trust_coeff=1e-3)))["optimizer"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"momentum": 1.0}, "momentum must be in"),
        ({"eta": 0.0}, "eta must be > 0"),
        ({"lr": -1.0}, "lr must be >= 0"),
        ({"momentum": 0.0, "nesterov": True}, "nesterov needs momentum"),
    ],
)
def test_bad_options_are_user_errors(kwargs, message):
    with pytest.raises(UserError, match=message):
        Lars([torch.nn.Parameter(torch.ones(2))], **kwargs)


def test_state_survives_a_state_dict_round_trip():
    params = make_params()
    steps = [make_grads(t) for t in range(4)]
    whole = Lars(groups(params, 1e-2), lr=LR, nesterov=True)
    expected = run(whole, params, steps)
    again = make_params()
    first = Lars(groups(again, 1e-2), lr=LR, nesterov=True)
    run(first, again, steps[:2])
    resumed = Lars(groups(again, 1e-2), lr=LR, nesterov=True)
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    for a, b in zip(run(resumed, again, steps[2:]), expected):
        assert torch.equal(a, b)


def test_deepcopy_keeps_optimizer_wide_switches_and_sparse_gradients_are_refused():
    params = make_params()
    clone = copy.deepcopy(Lars(params, lr=LR, no_decay_adapt=True, foreach=False))
    assert (clone.no_decay_adapt, clone.foreach) == (True, False)
    clone_params = clone.param_groups[0]["params"]
    for p, g in zip(clone_params, make_grads(1)):
        p.grad = g
    clone.step()
    clone_params[0].grad = clone_params[0].grad.to_sparse()
    with pytest.raises(UserError, match="Lars got a sparse gradient for parameter 'group0.0'; LARS needs dense"):
        clone.step()
