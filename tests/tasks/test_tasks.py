"""The task layer: each task's loss and gradient against a reference written out here; a
custom objective (``tests/support/onehot_mse.py``) trained through the unchanged engine
and through ``largebatch train``; task specs and their errors."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from largebatch.config import validate
from largebatch.config.typed import typed
from largebatch.data.mixup import MixupCutmix
from largebatch.engine.hook import Hook
from largebatch.errors import ConfigError
from largebatch.hooks.loss_accuracy import LossAccuracyHook
from largebatch.tasks import ClassificationTask, build_task
from tests.conftest import REPO, run_cli, tiny_config, write_config
from tests.engine.helpers import ListLoader
from tests.hooks.common import CLASSES, MLP, batches, build
from tests.support.onehot_mse import OneHotMSE

ONEHOT_MSE = "tests/support/onehot_mse.py:OneHotMSE"


def one_hot(labels: torch.Tensor) -> torch.Tensor:
    return F.one_hot(labels, CLASSES).float()


def loss_and_grads(model: torch.nn.Module, loss: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    return loss.detach(), list(torch.autograd.grad(loss, list(model.parameters())))


def assert_same(ours, reference) -> None:
    torch.testing.assert_close(ours[0], reference[0], rtol=1e-6, atol=1e-7)
    for a, b in zip(ours[1], reference[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mixup_alpha", [0.0, 0.4])
def test_onehot_mse_loss_and_gradient_against_a_direct_computation(mixup_alpha):
    torch.manual_seed(0)
    model = MLP()
    images, labels = batches(1)[0]
    batch = MixupCutmix(CLASSES, mixup_alpha=mixup_alpha, seed=1)(images, labels)
    lam = batch.lam
    assert (0 < lam < 1) == (mixup_alpha > 0)
    task = OneHotMSE(scale=2.0)
    ours = loss_and_grads(model, task.loss(task.forward(model, batch.images), batch))
    mixed_images = images if lam == 1 else lam * images + (1 - lam) * images.flip(0)
    targets = 2.0 * (lam * one_hot(labels) + (1 - lam) * one_hot(labels.flip(0)))
    reference = loss_and_grads(model, ((model(mixed_images) - targets) ** 2).sum(dim=1).mean())
    assert_same(ours, reference)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_classification_loss_and_gradient_against_torch_cross_entropy(label_smoothing):
    torch.manual_seed(0)
    model = MLP()
    images, labels = batches(1)[0]
    batch = MixupCutmix(CLASSES, label_smoothing=label_smoothing)(images, labels)
    task = ClassificationTask()
    ours = loss_and_grads(model, task.loss(task.forward(model, batch.images), batch))
    reference = loss_and_grads(model, F.cross_entropy(model(images), labels, label_smoothing=label_smoothing))
    assert_same(ours, reference)


class GradsBeforeStep(Hook):
    """The gradients the optimizer is about to apply, per step."""

    def __init__(self):
        super().__init__()
        self.grads = []

    def before_optimizer_step(self, state):
        self.grads.append([p.grad.clone() for p in state.run.model.parameters()])


def test_the_engine_trains_a_custom_task_with_accumulation_as_one_full_batch(tmp_path):
    grabbed = GradsBeforeStep()
    engine, records = build(tmp_path, [LossAccuracyHook(), grabbed], steps=2, accumulation=2, **{"eval.at_end": True})
    engine.state.run = dataclasses.replace(engine.state.run, task=OneHotMSE())
    eval_batches = batches(3, seed=9)
    engine.eval_loader = ListLoader(eval_batches, CLASSES)
    initial = copy.deepcopy(engine.state.run.model)
    first_step = engine.train_loader.batches[:2]
    engine.run()

    images = torch.cat([x for x, _ in first_step])
    labels = torch.cat([y for _, y in first_step])
    reference = torch.autograd.grad(((initial(images) - one_hot(labels)) ** 2).sum(1).mean(), list(initial.parameters()))
    for ours, expected in zip(grabbed.grads[0], reference, strict=True):
        torch.testing.assert_close(ours, expected, rtol=1e-6, atol=1e-7)

    assert [r["step"] for r in records.logged] == [1, 2]
    assert all("train/mse" in r and "train/top1" not in r for r in records.logged)
    ((_, result),) = records.evals
    model = engine.state.run.model
    with torch.no_grad():
        outputs = torch.cat([model(x) for x, _ in eval_batches])
    expected = ((outputs - one_hot(torch.cat([y for _, y in eval_batches]))) ** 2).sum(1).mean().item()
    assert result == {"eval/mse": pytest.approx(expected, rel=1e-6), "eval/samples": 12.0}


def test_a_custom_task_pretrains_the_vit_through_the_cli(tmp_path):
    cfg = tiny_config(epochs=3, task={"type": ONEHOT_MSE, "scale": 1.0}, **{"optimizer.lr": 3e-3})
    run_dir = tmp_path / "run"
    result = run_cli("train", "--config", str(write_config(tmp_path, cfg)), "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    assert len(train) == 12
    assert train[-1]["loss"] < 0.9 * train[0]["loss"]
    assert all("train/mse" in r and "train/top1" not in r for r in train)
    evals = [r for r in records if "eval/mse" in r]
    assert len(evals) == 3 and evals[-1]["eval/mse"] < evals[0]["eval/mse"]
    assert not any("eval/top1" in r for r in records)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"type": "classification"}, ClassificationTask),
        ({"type": "largebatch.tasks.classification:ClassificationTask"}, ClassificationTask),
        ({"type": ONEHOT_MSE, "scale": 3}, OneHotMSE),
        ({"type": str(REPO / ONEHOT_MSE), "scale": 3}, OneHotMSE),
        ({"type": "tests.support.onehot_mse:OneHotMSE", "scale": 3}, OneHotMSE),
    ],
)
def test_a_task_is_named_like_a_hook_with_its_arguments(spec, expected):
    task = build_task(typed(tiny_config(task=spec)).task)
    assert type(task).__name__ == expected.__name__  # a file is loaded as its own module: compare names
    assert getattr(task, "scale", 3) == 3


def test_the_default_task_is_classification():
    cfg = validate(tiny_config())
    assert cfg["task"] == {"type": "classification"}
    assert type(build_task(typed(cfg).task)) is ClassificationTask


@pytest.mark.parametrize(
    ("spec", "key", "fragments"),
    [
        ({"type": "clasification"}, "task.type", ["did you mean 'classification'"]),
        ({"type": "tasks/nowhere.py:Thing"}, "task.type", ["task file 'tasks/nowhere.py' not found"]),
        ({"type": "tests/support/onehot_mse.py:OneHotMS"}, "task.type", ["did you mean 'OneHotMSE'"]),
        ({"type": "tests/support/onehot_mse.py:Task"}, "task.type", ["the Task base class itself"]),
        ({"type": "tests/support/rank_weights.py:SaveRankWeights"}, "task.type", ["not a subclass of largebatch.tasks.base.Task"]),
        ({"type": "nowhere.tasks:Thing"}, "task.type", ["module 'nowhere.tasks' not found", "'package.module:Class'"]),
        ({"type": ONEHOT_MSE, "colour": "red"}, "task", ["colour", "it takes scale"]),
        ({"type": ONEHOT_MSE, "scale": "big"}, "task.scale", ["expected a number", "'big'"]),
        ({"type": 3}, "task.type", ["expected a string"]),
    ],
)
def test_bad_task_specs_name_the_key_and_the_fix(spec, key, fragments):
    with pytest.raises(ConfigError) as info:
        build_task(typed(tiny_config(task=spec)).task)
    assert info.value.key == key
    for fragment in fragments:
        assert fragment in info.value.message


def test_a_bad_task_spec_is_one_error_line_before_any_work(tmp_path):
    path = write_config(tmp_path, tiny_config(task={"type": "clasification"}))
    for command in (("train", "--config", str(path), "--run-dir", str(tmp_path / "run")), ("config", "show", str(path))):
        result = run_cli(*command)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2 and len(lines) == 1, result.stderr
        assert lines[0].startswith("error: task.type: unknown task 'clasification'; did you mean 'classification'?")
    assert not (tmp_path / "run").exists()


def test_the_docs_example_is_the_tested_task():
    page = (REPO / "docs/tasks.md").read_text()
    example = next(block for block in page.split("```python\n")[1:] if "class OneHotMSE(Task)" in block)
    source = (REPO / "tests/support/onehot_mse.py").read_text()
    assert source.endswith(example[: example.index("```")])
