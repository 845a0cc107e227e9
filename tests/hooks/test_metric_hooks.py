"""Each metric hook's logged values against a direct computation in the test."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from largebatch.data.mixup import MixupCutmix
from largebatch.engine.hook import Hook
from largebatch.errors import UserError
from largebatch.hooks.grad_norm import GradNormHook
from largebatch.hooks.loss_accuracy import LossAccuracyHook
from largebatch.hooks.lr import LearningRateHook
from largebatch.hooks.memory import MemoryHook
from largebatch.hooks.throughput import ThroughputHook
from largebatch.hooks.trust_ratio import TrustRatioHook
from tests.hooks.common import CLASSES, FEATURES, build


class SeeLogits(Hook):
    """Per step: (logits, labels, labels_b, lam) of every micro-batch."""

    def __init__(self):
        super().__init__()
        self.steps = []

    def before_step(self, state):
        self.steps.append([])

    def after_forward(self, state):
        b = state.current.batch
        self.steps[-1].append(
            (state.current.outputs.detach().clone(), b.labels.clone(), None if b.labels_b is None else b.labels_b.clone(), float(b.lam))
        )


def test_train_top1_and_top5_are_mixup_aware_against_topk_by_hand(tmp_path):
    seen = SeeLogits()
    engine, records = build(tmp_path, [LossAccuracyHook(), seen], steps=4, accumulation=2, **{"log.interval": 2})
    engine.state.run = dataclasses.replace(engine.state.run, mixup=MixupCutmix(CLASSES, mixup_alpha=0.4, seed=3))
    engine.run()
    assert [r["step"] for r in records.logged] == [2, 4]
    for record, steps in zip(records.logged, [seen.steps[0:2], seen.steps[2:4]]):
        top1 = top5 = samples = 0.0
        for logits, labels, labels_b, lam in (m for step in steps for m in step):
            assert labels_b is not None and 0 < lam < 1
            top = torch.topk(logits, 5, dim=1).indices
            for row, a, b in zip(top.tolist(), labels.tolist(), labels_b.tolist()):
                top5 += lam * (a in row) + (1 - lam) * (b in row)
                top1 += lam * (row[0] == a) + (1 - lam) * (row[0] == b)
            samples += len(labels)
        assert record["train/top5"] == pytest.approx(top5 / samples, abs=1e-6)
        assert record["train/top1"] == pytest.approx(top1 / samples, abs=1e-6)
        assert record["train/top5"] > record["train/top1"]


def test_eval_loss_top1_top5_against_a_direct_computation(tmp_path):
    from tests.engine.helpers import ListLoader
    from tests.hooks.common import batches

    engine, records = build(tmp_path, [LossAccuracyHook()], steps=2, **{"eval.at_end": True})
    eval_batches = batches(3, seed=9)
    engine.eval_loader = ListLoader(eval_batches, CLASSES)
    engine.run()
    ((_, result),) = records.evals
    model = engine.state.run.model
    with torch.no_grad():
        logits = torch.cat([model(x) for x, _ in eval_batches])
    labels = torch.cat([y for _, y in eval_batches])
    assert result["eval/loss"] == pytest.approx(torch.nn.functional.cross_entropy(logits, labels).item(), rel=1e-5)
    top = torch.topk(logits, 5, dim=1).indices
    assert result["eval/top1"] == pytest.approx((top[:, 0] == labels).float().mean().item())
    assert result["eval/top5"] == pytest.approx((top == labels[:, None]).any(1).float().mean().item())


def test_lr_per_group_follows_the_schedule_and_lr_scale(tmp_path):
    engine, records = build(tmp_path, [LearningRateHook()], steps=5, **{"lr_schedule.warmup_steps": 2})
    engine.state.run.optimizer.param_groups[1]["lr_scale"] = 0.5  # as layer decay sets it
    engine.run()
    schedule = engine.state.run.schedule
    assert [r["step"] for r in records.logged] == [1, 2, 3, 4, 5]
    for record in records.logged:
        expected = schedule.lr_at(record["step"] - 1)  # the logged step's own rate
        assert record["lr/decay"] == pytest.approx(expected)
        assert record["lr/no_decay"] == pytest.approx(0.5 * expected)
    assert len({r["lr/decay"] for r in records.logged}) > 2  # warmup then cosine: it moves


class GradsByHand(Hook):
    """Norms computed independently from ``.grad``: before clipping (``before_optimizer_step``)
    or after it (``after=True``: ``after_optimizer_step``, the gradients the update used)."""

    def __init__(self, after: bool = False):
        super().__init__()
        self.after, self.seen = after, []

    def before_optimizer_step(self, state):
        if not self.after:
            self.record(state)

    def after_optimizer_step(self, state):
        if self.after:
            self.record(state)

    def record(self, state):
        groups = {}
        for group in state.run.optimizer.param_groups:
            norms = [torch.linalg.vector_norm(p.grad.double()) for p in group["params"]]
            groups[group["name"]] = torch.linalg.vector_norm(torch.stack(norms)).item()
        total = torch.linalg.vector_norm(torch.tensor(list(groups.values()), dtype=torch.float64)).item()
        self.seen.append((total, groups))


@pytest.mark.parametrize("max_norm", [None, 0.05])
def test_grad_norm_global_and_per_group_before_and_after_clipping(tmp_path, max_norm):
    before, after = GradsByHand(), GradsByHand(after=True)
    engine, records = build(tmp_path, [GradNormHook(), before, after], steps=4, clip_grad_norm=max_norm, **{"log.interval": 2})
    engine.run()
    assert [r["step"] for r in records.logged] == [2, 4]
    for record in records.logged:
        total, groups = before.seen[record["step"] - 1]
        assert record["grad_norm"] == pytest.approx(total, rel=1e-5)
        for name, value in groups.items():
            assert record[f"grad_norm/{name}"] == pytest.approx(value, rel=1e-5)
        if max_norm is None:
            assert not any(k.startswith("grad_norm_clipped") for k in record)
            continue
        clipped_total, clipped_groups = after.seen[record["step"] - 1]
        assert clipped_total == pytest.approx(max_norm, rel=1e-4) and total > max_norm  # it did clip
        assert record["grad_norm_clipped"] == pytest.approx(clipped_total, rel=1e-5)
        for name, value in clipped_groups.items():
            assert record[f"grad_norm_clipped/{name}"] == pytest.approx(value, rel=1e-5)


def test_clipping_matches_torch_clip_grad_norm(tmp_path):
    from largebatch.backends.cpu import CpuBackend

    torch.manual_seed(1)
    params = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(4))]
    grads = [torch.randn_like(p) * 3 for p in params]
    reference = [g.clone() for g in grads]
    for p, g in zip(params, grads):
        p.grad = g
    total = CpuBackend("fp32").clip_grad_norm(params, 1.0)
    ref_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, g in zip(ref_params, reference):
        p.grad = g
    expected = torch.nn.utils.clip_grad_norm_(ref_params, 1.0)
    assert total.item() == pytest.approx(expected.item())
    for p, q in zip(params, ref_params):
        assert torch.allclose(p.grad, q.grad)


class LambByHand(Hook):
    """The trust ratio ||w|| / ||u|| of LAMB's first step written out (m_hat = g,
    v_hat = g^2, u = g / (|g| + eps) + wd * w), from the weights and final gradients."""

    priority = 100

    def __init__(self):
        super().__init__()
        self.ratios = {}

    def before_optimizer_step(self, state):
        if state.step != 0:
            return
        for group in state.run.optimizer.param_groups:
            for name, p in zip(group["param_names"], group["params"]):
                g, w = p.grad.double(), p.detach().double()
                u = g / (g.abs() + group["eps"]) + group["weight_decay"] * w
                self.ratios[name] = (torch.linalg.vector_norm(w) / torch.linalg.vector_norm(u)).item()


def test_trust_ratios_against_one_lamb_step_by_hand(tmp_path):
    by_hand = LambByHand()
    engine, records = build(tmp_path, [TrustRatioHook(top_k=2), by_hand], steps=3, optimizer="lamb", **{"log.interval": 2})
    requested = []
    original = engine.state.run.optimizer.request_stats
    engine.state.run.optimizer.request_stats = lambda: (requested.append(engine.state.step), original())[1]
    engine.run()
    assert requested == [1, 2]  # only the steps that are logged (2 and the last, 3) ask for statistics
    assert [r["step"] for r in records.logged] == [2, 3]
    # Step 1 (index 0) is not logged; check step 1's ratios through a run logging it.
    by_hand = LambByHand()
    engine, records = build(tmp_path / "every", [TrustRatioHook(top_k=2), by_hand], steps=1, optimizer="lamb")
    engine.run()
    (record,) = records.logged
    groups = {g["name"]: g["param_names"] for g in engine.state.run.optimizer.param_groups}
    for group, names in groups.items():
        values = sorted(by_hand.ratios[n] for n in names)
        assert record[f"trust_ratio/{group}/min"] == pytest.approx(values[0], rel=1e-4)
        assert record[f"trust_ratio/{group}/max"] == pytest.approx(values[-1], rel=1e-4)
        assert record[f"trust_ratio/{group}/median"] == pytest.approx(values[(len(values) - 1) // 2], rel=1e-4)
    lowest = min(by_hand.ratios, key=by_hand.ratios.get)
    highest = max(by_hand.ratios, key=by_hand.ratios.get)
    assert record["trust_ratio/lowest"].startswith(f"{lowest}=")
    assert record["trust_ratio/highest"].startswith(f"{highest}=")


def test_trust_ratios_of_lars_against_its_rule_by_hand(tmp_path):
    class LarsByHand(Hook):
        priority = 100

        def __init__(self):
            super().__init__()
            self.ratios = {}

        def before_optimizer_step(self, state):
            for group in state.run.optimizer.param_groups:
                wd = group["weight_decay"]
                for name, p in zip(group["param_names"], group["params"]):
                    w, g = torch.linalg.vector_norm(p.detach().double()), torch.linalg.vector_norm(p.grad.double())
                    # biases and norms (weight decay 0) keep ratio 1: LARS's usual exclusion
                    self.ratios[name] = (1e-3 * w / (g + wd * w + 1e-8)).item() if wd else 1.0

    by_hand = LarsByHand()
    engine, records = build(tmp_path, [TrustRatioHook(top_k=1), by_hand], steps=1, optimizer="lars")
    engine.run()
    (record,) = records.logged
    for group in engine.state.run.optimizer.param_groups:
        values = sorted(by_hand.ratios[n] for n in group["param_names"])
        assert record[f"trust_ratio/{group['name']}/min"] == pytest.approx(values[0], rel=1e-4)
        assert record[f"trust_ratio/{group['name']}/max"] == pytest.approx(values[-1], rel=1e-4)
    assert record["trust_ratio/no_decay/max"] == 1.0 and record["trust_ratio/decay/max"] < 0.01


def test_trust_ratio_with_a_non_lamb_optimizer_is_a_clear_error(tmp_path):
    engine, _ = build(tmp_path, [TrustRatioHook()], steps=1)
    with pytest.raises(Exception) as error:
        engine.run()
    assert isinstance(error.value.__cause__, UserError) and "optimizer.type='lamb'" in str(error.value)


def test_throughput_flops_against_a_hand_count(tmp_path):
    engine, records = build(tmp_path, [ThroughputHook(peak_tflops=1e-6)], steps=2, accumulation=2)
    engine.run()
    hook = engine.hooks[0]
    # MLP forward: 2 FLOPs per multiply-add in fc1 (6x8) and fc2 (8x7), per sample.
    per_sample = 2 * (FEATURES * 8 + 8 * CLASSES)
    assert hook.flops_per_sample == {(FEATURES,): per_sample}
    for record in records.logged:
        samples_per_sec = record["samples_per_sec_per_device"]
        assert record["samples_per_sec"] == pytest.approx(samples_per_sec)  # one rank
        assert record["tflops_per_device"] == pytest.approx(3 * per_sample * samples_per_sec / 1e12, rel=1e-3)
        assert record["mfu"] == pytest.approx(record["tflops_per_device"] / 1e-6, rel=1e-3)
        assert 0 <= record["data_wait_fraction"] <= 1


class Balloon(Hook):
    """At step 1 holds 256 MiB of touched memory for a moment, and notes the RSS."""

    def __init__(self):
        super().__init__()
        self.rss_before = 0.0

    def before_step(self, state):
        if state.step == 0:
            self.rss_before = rss_gib()
            balloon = torch.ones(64 * 2**20, dtype=torch.float32)  # 256 MiB, every page touched
            del balloon


def rss_gib() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    raise AssertionError("no VmRSS")


def test_memory_reports_the_host_peak_per_interval(tmp_path):
    balloon = Balloon()
    engine, records = build(tmp_path, [MemoryHook(), balloon], steps=2)
    engine.run()
    first, second = (r["memory/host_peak_gib"] for r in records.logged)
    assert first >= balloon.rss_before + 0.25 * 0.95  # the balloon is in the first interval's peak
    assert second < first - 0.2  # and not in the second's: the peak was reset
    assert all("memory/device_peak_gib" not in r for r in records.logged)  # a CPU has no device statistics
