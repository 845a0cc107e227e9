"""LAMB against Algorithm 2 of You et al. (arXiv:1904.00962) written out per tensor."""

from __future__ import annotations

import copy
import io
import itertools

import pytest
import torch

from largebatch.config import validate
from largebatch.config.typed import typed
from largebatch.errors import ConfigError, UserError
from largebatch.optim import build_optimizer, optimizer_kwargs
from largebatch.optim.lamb import Lamb
from tests.conftest import tiny_config

LR, BETAS, EPS = 0.01, (0.9, 0.99), 1e-6
# (shape, weight scale, gradient scale): a zero weight tensor, a zero gradient, a tensor
# small enough to hit the lower clamp, tensors larger than the test chunk size.
TENSORS = [
    ((5, 7), 1.0, 1.0),
    ((13,), 1.0, 1.0),
    ((3, 4, 5), 0.0, 1.0),
    ((6,), 1.0, 0.0),
    ((40, 3), 1e-4, 1.0),
]


def reference_step(p, g, m, v, t, *, wd, bias_correction, decoupled, adapt, clamp):
    """One step of Algorithm 2 for one tensor; returns (p, m, v, ratio, ||x||, ||u||)."""
    b1, b2 = BETAS
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    m_hat, v_hat = (m / (1 - b1**t), v / (1 - b2**t)) if bias_correction else (m, v)
    r = m_hat / (v_hat.sqrt() + EPS)
    if decoupled:
        p = p * (1 - LR * wd)
        u = r
    else:
        u = r + wd * p
    w_norm, u_norm = p.norm(), u.norm()
    ratio = torch.tensor(1.0, dtype=p.dtype)
    if adapt and w_norm > 0 and u_norm > 0:
        ratio = w_norm / u_norm
        if clamp:
            ratio = ratio.clamp(clamp[0], clamp[1])
    return p - LR * ratio * u, m, v, ratio, w_norm, u_norm


def make_params(seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=gen, dtype=dtype) * scale).requires_grad_(True) for shape, scale, _ in TENSORS]


def make_grads(step, dtype=torch.float64):
    gen = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(shape, generator=gen, dtype=dtype) * scale for shape, _, scale in TENSORS]


# foreach: the default (on the CPU, torch's fused Adam kernel in chunks of 512Ki); chunked:
# the CPU kernel with tensors split into pieces; unchunked: plain foreach ops, the path
# other devices take and the fallback of the CPU kernel; per_tensor: the reference path.
MODES = {
    "foreach": {"foreach": True},
    "chunked": {"foreach": True, "chunk_elements": 16},
    "unchunked": {"foreach": True, "chunk_elements": 0},
    "per_tensor": {"foreach": False},
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize(
    "bias_correction,decoupled,clamp,adapt_second",
    list(itertools.product([True, False], [False, True], [None, (0.01, 0.5)], [True, False])),
)
def test_matches_paper_update(mode, bias_correction, decoupled, clamp, adapt_second):
    assert_matches_paper_update(MODES[mode], bias_correction, decoupled, clamp, adapt_second)


def assert_matches_paper_update(mode_options, bias_correction, decoupled, clamp, adapt_second):
    """20 steps of two groups against ``reference_step``, to 1e-12 in float64."""
    wd = 0.1
    params = make_params()
    # Two groups: the second has no decay (so its zero-gradient tensor has a zero update)
    # and may switch adaptation off.
    groups = [
        {"params": params[:3], "name": "first"},
        {
            "params": params[3:],
            "name": "second",
            "weight_decay": 0.0,
            "adapt": adapt_second,
        },
    ]
    optimizer = Lamb(
        groups,
        lr=LR,
        betas=BETAS,
        eps=EPS,
        weight_decay=wd,
        bias_correction=bias_correction,
        decoupled_weight_decay=decoupled,
        max_trust_ratio=clamp and clamp[1],
        min_trust_ratio=clamp and clamp[0],
        **mode_options,
    )
    ref = [p.detach().clone() for p in params]
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in ref]
    for t in range(1, 21):
        grads = make_grads(t)
        for p, g in zip(params, grads):
            p.grad = g
        optimizer.step()
        for i, g in enumerate(grads):
            second = i >= 3
            ref[i], m, v, *_ = reference_step(
                ref[i],
                g,
                *moments[i],
                t,
                wd=0.0 if second else wd,
                bias_correction=bias_correction,
                decoupled=decoupled,
                adapt=adapt_second if second else True,
                clamp=clamp,
            )
            moments[i] = (m, v)
    for p, r in zip(params, ref):
        torch.testing.assert_close(p.detach(), r, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", list(MODES))
def test_adam_mode_and_no_adaptation_equal_torch_adam(mode):
    for options in ({"adapt": False}, {"adam": True}):
        params, adam_params = make_params(), make_params()
        ours = Lamb(params, lr=LR, betas=BETAS, eps=EPS, **options, **MODES[mode])
        adam = torch.optim.Adam(adam_params, lr=LR, betas=BETAS, eps=EPS)
        for t in range(1, 11):
            for p, q, g in zip(params, adam_params, make_grads(t)):
                p.grad, q.grad = g, g.clone()
            ours.step()
            adam.step()
        for p, q in zip(params, adam_params):
            torch.testing.assert_close(p, q, rtol=0, atol=1e-12)


def test_skips_params_without_grad_and_rejects_sparse():
    params = make_params()
    optimizer = Lamb(params, lr=LR)
    before = params[1].detach().clone()
    for i, (p, g) in enumerate(zip(params, make_grads(1))):
        p.grad = None if i == 1 else g
    optimizer.step()
    assert torch.equal(params[1], before)
    assert params[1] not in optimizer.state
    params[0].grad = params[0].grad.to_sparse()
    with pytest.raises(UserError, match="sparse gradient"):
        optimizer.step()


@pytest.mark.parametrize("mode", list(MODES))
def test_state_dict_round_trip_is_exact(mode):
    def run(steps, optimizer, params, start=1):
        for t in range(start, start + steps):
            for p, g in zip(params, make_grads(t, torch.float32)):
                p.grad = g
            optimizer.step()

    options = dict(lr=LR, weight_decay=0.1, **MODES[mode])
    straight = make_params(dtype=torch.float32)
    run(10, Lamb([{"params": straight, "name": "all"}], **options), straight)

    first = make_params(dtype=torch.float32)
    optimizer = Lamb([{"params": first, "name": "all", "param_names": list("abcde")}], **options)
    run(5, optimizer, first)
    buffer = io.BytesIO()
    torch.save({"params": [p.detach() for p in first], "optim": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    resumed = [p.clone().requires_grad_(True) for p in saved["params"]]
    fresh = Lamb([{"params": resumed, "name": "all", "param_names": list("abcde")}], **options)
    fresh.load_state_dict(saved["optim"])
    assert fresh.param_groups[0]["param_names"] == list("abcde")
    run(5, fresh, resumed, start=6)
    for a, b in zip(straight, resumed):
        assert torch.equal(a, b)


def test_deepcopy_keeps_optimizer_wide_switches():
    params = make_params()
    optimizer = Lamb(
        params,
        lr=LR,
        adam=True,
        no_decay_adapt=False,
        max_grad_norm=1.0,
        foreach=False,
        chunk_elements=16,
    )
    clone = copy.deepcopy(optimizer)
    switches = ("adam", "no_decay_adapt", "max_grad_norm", "foreach", "chunk_elements")
    assert [getattr(clone, key) for key in switches] == [True, False, 1.0, False, 16]
    for p, g in zip(clone.param_groups[0]["params"], make_grads(1)):
        p.grad = g
    clone.step()
    chunked = copy.deepcopy(Lamb(make_params(), lr=LR, chunk_elements=16))  # its CPU kernel's buffers are made anew
    for p, g in zip(chunked.param_groups[0]["params"], make_grads(1)):
        p.grad = g
    chunked.step()
    assert chunked._buffers


@pytest.mark.parametrize("mode", list(MODES))
def test_stats_are_free_when_not_requested_and_match_direct_computation(mode):
    options = dict(lr=LR, betas=BETAS, eps=EPS, weight_decay=0.1, **MODES[mode])
    names = [f"p{i}" for i in range(len(TENSORS))]
    quiet_params, loud_params = make_params(), make_params()
    quiet = Lamb([{"params": quiet_params, "name": "g", "param_names": names}], **options)
    loud = Lamb([{"params": loud_params, "name": "g", "param_names": names}], **options)
    ref = [p.detach().clone() for p in loud_params]
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in ref]
    for t in range(1, 4):
        grads = make_grads(t)
        for p, q, g in zip(quiet_params, loud_params, grads):
            p.grad, q.grad = g, g.clone()
        quiet.step()
        loud.request_stats()
        loud.step()
        expected = []
        for i, g in enumerate(grads):
            ref[i], m, v, ratio, w_norm, u_norm = reference_step(
                ref[i],
                g,
                *moments[i],
                t,
                wd=0.1,
                bias_correction=True,
                decoupled=False,
                adapt=True,
                clamp=None,
            )
            moments[i] = (m, v)
            expected.append((ratio, w_norm, u_norm))
        stats = loud.last_stats["g"]
        assert stats["param_names"] == names
        for k, key in enumerate(("trust_ratio", "weight_norm", "update_norm")):
            torch.testing.assert_close(
                stats[key],
                torch.stack([e[k] for e in expected]),
                rtol=1e-12,
                atol=1e-12,
            )
    assert quiet.last_stats == {}
    for p, q in zip(quiet_params, loud_params):
        assert torch.equal(p, q)
    loud.step()  # not requested: the last recorded statistics stay
    assert loud.last_stats["g"]["param_names"] == names


@pytest.mark.parametrize("mode", list(MODES))
def test_internal_clipping_equals_clipping_first(mode):
    inside_params, outside_params = make_params(), make_params()
    inside = Lamb(inside_params, lr=LR, weight_decay=0.1, max_grad_norm=1.0, **MODES[mode])
    outside = Lamb(outside_params, lr=LR, weight_decay=0.1, **MODES[mode])
    for t in range(1, 6):
        grads = make_grads(t)
        for p, q, g in zip(inside_params, outside_params, grads):
            p.grad, q.grad = g.clone(), g.clone()
        torch.nn.utils.clip_grad_norm_(outside_params, 1.0)
        inside.step()
        outside.step()
        for p, g in zip(inside_params, grads):
            assert torch.equal(p.grad, g)  # .grad is left as it was
    for p, q in zip(inside_params, outside_params):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "options,match",
    [
        ({"lr": -1.0}, "lr"),
        ({"betas": (0.9, 1.0)}, "betas"),
        ({"weight_decay": -0.1}, "weight_decay"),
        ({"max_trust_ratio": 0.0}, "max_trust_ratio"),
        ({"min_trust_ratio": 2.0, "max_trust_ratio": 1.0}, "min_trust_ratio"),
        ({"max_grad_norm": 0.0}, "max_grad_norm"),
        ({"param_names": ["only one"]}, "param_names"),
    ],
)
def test_bad_options_are_user_errors(options, match):
    options = dict(options)
    names = options.pop("param_names", None)
    params = make_params() if names is None else [{"params": make_params(), "param_names": names}]
    with pytest.raises(UserError, match=match):
        Lamb(params, **options)


@pytest.mark.parametrize("chunk_elements", [None, 16, 0])
def test_non_contiguous_params_match_per_tensor_path(chunk_elements):
    # A transposed parameter keeps the CPU path off torch's fused kernel and off the
    # flat pieces: the plain foreach ops must give the same steps.
    def build():
        gen = torch.Generator().manual_seed(3)
        base = [
            torch.randn(7, 5, generator=gen, dtype=torch.float64).t(),
            torch.randn(40, generator=gen, dtype=torch.float64),
        ]
        return [p.requires_grad_(True) for p in base]

    fast, slow = build(), build()
    assert not fast[0].is_contiguous()
    options = {"lr": LR, "weight_decay": 0.1, "max_trust_ratio": 2.0}
    ours = Lamb(fast, foreach=True, chunk_elements=chunk_elements, **options)
    reference = Lamb(slow, foreach=False, **options)
    for t in range(1, 6):
        gen = torch.Generator().manual_seed(t)
        for p, q in zip(fast, slow):
            g = (
                torch.randn(q.shape[::-1], generator=gen, dtype=torch.float64).t()
                if q.ndim == 2
                else torch.randn(q.shape, generator=gen, dtype=torch.float64)
            )
            p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        reference.step()
    for p, q in zip(fast, slow):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", list(MODES))
def test_no_decay_adapt_off_matches_timm_defaults(mode):
    # timm (always_adapt=False), apex and Habana give groups without decay ratio 1.
    from timm.optim import Lamb as TimmLamb

    def groups(params):
        return [
            {"params": params[:3], "weight_decay": 0.1},
            {"params": params[3:], "weight_decay": 0.0},
        ]

    ours_params, timm_params, paper_params = make_params(), make_params(), make_params()
    options = dict(lr=LR, betas=BETAS, eps=EPS)
    ours = Lamb(groups(ours_params), no_decay_adapt=False, **options, **MODES[mode])
    peer = TimmLamb(groups(timm_params), max_grad_norm=None, **options)
    paper = Lamb(groups(paper_params), **options, **MODES[mode])
    for t in range(1, 11):
        for p, q, r, g in zip(ours_params, timm_params, paper_params, make_grads(t)):
            p.grad, q.grad, r.grad = g, g.clone(), g.clone()
        ours.step()
        peer.step()
        paper.step()
    for p, q in zip(ours_params, timm_params):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)
    # The paper adapts the no-decay tensors: they end elsewhere.
    assert (ours_params[4] - paper_params[4]).abs().max() > 1e-3


def test_config_refuses_clipping_twice():
    lamb = {"optimizer.type": "lamb", "optimizer.max_grad_norm": 1.0}
    with pytest.raises(ConfigError, match="clip_grad_norm 1.0 clips once per step") as info:
        validate(tiny_config(clip_grad_norm=1.0, **lamb))
    assert info.value.key == "optimizer.max_grad_norm"
    assert validate(tiny_config(clip_grad_norm=None, **lamb))["optimizer"]["max_grad_norm"] == 1.0


def test_config_builds_lamb_with_its_options_and_groups():
    overrides = {
        "optimizer.type": "lamb",
        "optimizer.weight_decay": 0.1,
        "optimizer.no_decay_adapt": False,
        "optimizer.betas": [0.9, 0.99],
    }
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    optimizer = build_optimizer(typed(tiny_config(**overrides)).optimizer, model)
    assert isinstance(optimizer, Lamb) and optimizer.no_decay_adapt is False
    groups = {g["name"]: g for g in optimizer.param_groups}
    assert groups["decay"]["param_names"] == ["0.weight"]
    assert groups["no_decay"]["param_names"] == ["0.bias", "1.weight", "1.bias"]
    assert groups["decay"]["weight_decay"] == 0.1 and groups["no_decay"]["weight_decay"] == 0.0
    assert groups["decay"]["betas"] == (0.9, 0.99)
    with pytest.raises(ConfigError, match="adamw does not take 'no_decay_adapt'"):
        optimizer_kwargs(validate(tiny_config(**{"optimizer.no_decay_adapt": False}))["optimizer"])
