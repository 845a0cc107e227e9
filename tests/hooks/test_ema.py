"""The ``ema`` hook (timm's ModelEmaV3) against a written-out EMA recurrence, across a
resume, in evaluation and in the final and exported weights."""

from __future__ import annotations

import json
import pathlib
import subprocess
import types

import pytest
import timm
import torch
import yaml
from safetensors.torch import load_file

from largebatch import preemption
from largebatch.backends.cpu import CpuBackend
from largebatch.config import validate
from largebatch.config.typed import typed
from largebatch.data import build_eval_loader
from largebatch.engine.hook import Hook, Priority
from largebatch.errors import ConfigError, UserError
from largebatch.export import load_run
from largebatch.hooks.ema import ModelEmaHook
from largebatch.launch import TrainArgs, train
from largebatch.rundir import RunDir
from largebatch.tasks import ClassificationTask
from tests.conftest import PYTHON, RANK_WEIGHTS, REPO, clean_env, run_cli, tiny_config, write_config
from tests.hooks.common import build
from tests.support.config_hooks import config_hooks

EMA_WEIGHTS = RunDir(".").weights("ema").name  # model_ema.safetensors


class WeightsAfterEachStep(Hook):
    """The model's weights at the start and after every optimizer step, and the steps
    ``skip`` lists are skipped (``state.current.skipped``)."""

    priority = Priority.LOWEST

    def __init__(self, skip: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.skip = skip
        self.weights: list[dict[str, torch.Tensor]] = []

    def before_run(self, state) -> None:
        self.weights.append({k: v.detach().clone() for k, v in state.run.model.state_dict().items()})

    def before_optimizer_step(self, state) -> None:
        if state.step + 1 in self.skip:
            state.current.request_skip("a step the test skips")

    def after_step(self, state) -> None:
        self.weights.append({k: v.detach().clone() for k, v in state.run.model.state_dict().items()})


def timm_decay(n: int, decay: float, warmup: bool) -> float:
    """The decay of the update after ``n`` optimizer steps (timm's ``get_decay(step=n)``):
    0 for the first (a copy), then ``decay``, or with warmup ``1 - n^(-2/3)`` capped at it."""
    if n <= 1:
        return 0.0
    return min(1 - (1 + (n - 1)) ** (-2 / 3), decay) if warmup else decay


def ema_recurrence(weights: list[dict[str, torch.Tensor]], decay: float, warmup: bool, skipped: tuple[int, ...] = ()) -> dict:
    """ema_0 = the initial weights; after step n (unless skipped): ema = d * ema + (1 - d) * w_n."""
    ema = {k: v.double() for k, v in weights[0].items()}
    for n, w in enumerate(weights[1:], start=1):
        if n in skipped:
            continue
        d = timm_decay(n, decay, warmup)
        ema = {k: d * ema[k] + (1 - d) * w[k].double() for k in ema}
    return ema


@pytest.mark.parametrize("warmup", [False, True])
def test_ema_follows_the_recurrence_over_the_weights_after_each_step(tmp_path, warmup):
    decay, skipped = 0.7, (4,)  # step 4 is skipped: no update there
    recorder = WeightsAfterEachStep(skip=skipped)
    hook = ModelEmaHook(decay, warmup=warmup)
    engine, _ = build(tmp_path, [hook, recorder], steps=8, accumulation=1)
    engine.run()
    assert len(recorder.weights) == 9
    assert torch.equal(recorder.weights[4]["fc1.weight"], recorder.weights[3]["fc1.weight"])  # the skip happened
    expected = ema_recurrence(recorder.weights, decay, warmup, skipped)
    got = hook.ema.module.state_dict()
    for key, value in expected.items():
        torch.testing.assert_close(got[key].double(), value, rtol=1e-6, atol=1e-7)
        assert not torch.allclose(got[key], recorder.weights[-1][key])  # an average, not the last weights
    assert engine.state.extra_models == {"ema": hook.ema.module}


def test_warmup_decay_matches_timm():
    from timm.utils import ModelEmaV3

    ema = ModelEmaV3(torch.nn.Linear(2, 2), decay=0.99, use_warmup=True)
    assert [ema.get_decay(n) for n in range(1, 2000, 37)] == [timm_decay(n, 0.99, True) for n in range(1, 2000, 37)]


def test_ema_hook_is_added_when_ema_decay_is_set():
    hooks = config_hooks(typed(tiny_config(**{"ema.decay": 0.9, "ema.warmup": True, "ema.eval": False})))
    (ema,) = [h for h in hooks if isinstance(h, ModelEmaHook)]
    assert (ema.decay, ema.warmup, ema.evaluate) == (0.9, True, False)
    assert not any(isinstance(h, ModelEmaHook) for h in config_hooks(typed(tiny_config())))
    listed = validate(tiny_config(**{"ema.decay": 0.9, "hooks": [{"type": "ema", "warmup": True}]}))
    (ema,) = [h for h in config_hooks(typed(listed)) if isinstance(h, ModelEmaHook)]  # one EMA, not two
    assert (ema.decay, ema.warmup, ema.evaluate) == (0.9, True, True)


@pytest.mark.parametrize("decay", [0.0, 1.0, -0.5])
def test_ema_decay_outside_0_1_is_refused(decay):
    with pytest.raises(ConfigError, match="ema.decay"):
        validate(tiny_config(**{"ema.decay": decay}))


def test_sharded_parameters_are_refused_at_the_start():
    cfg = typed(validate(tiny_config(**{"dist.strategy": "fsdp"})))
    state = types.SimpleNamespace(run=types.SimpleNamespace(sharded=True, config=cfg, model=torch.nn.Linear(2, 2)))
    with pytest.raises(UserError, match="not available with sharded parameters"):
        ModelEmaHook(0.9).before_run(state)


def run_in_process(tmp_path: pathlib.Path, cfg: dict, run_dir: pathlib.Path, resume: str | None = None):
    path = write_config(tmp_path, cfg, name=f"{run_dir.name}.yaml")
    preemption.clear()
    # A resumed run keeps its saved config: the stop at max_steps is lifted as a user would.
    overrides = ["max_steps=null"] if resume else []
    return train(TrainArgs(config=str(path), overrides=overrides, run_dir=str(run_dir), resume=resume))


@pytest.mark.slow
def test_resumed_run_ends_with_the_uninterrupted_runs_ema(tmp_path):
    cfg = tiny_config(
        **{"epochs": 2, "mixup.mixup_alpha": 0.4, "model.drop_rate": 0.1, "checkpoint.at_end": True, "ema.decay": 0.8, "ema.warmup": True}
    )
    run_in_process(tmp_path, cfg, tmp_path / "straight")
    stopped = tmp_path / "stopped"
    assert run_in_process(tmp_path, {**cfg, "max_steps": 3}, stopped).step == 3
    saved = torch.load(stopped / "checkpoints" / "step-00000003.pt", weights_only=True)["hooks"]["ModelEmaHook"]
    assert torch.equal(saved["weights"]["head.weight"], load_file(stopped / EMA_WEIGHTS)["head.weight"])
    (stopped / EMA_WEIGHTS).unlink()
    assert run_in_process(tmp_path, cfg, stopped, resume="auto").step == 8
    assert (stopped / EMA_WEIGHTS).read_bytes() == (tmp_path / "straight" / EMA_WEIGHTS).read_bytes()
    assert (stopped / "model.safetensors").read_bytes() == (tmp_path / "straight" / "model.safetensors").read_bytes()


def evaluate_file(run_dir: pathlib.Path) -> dict[str, float]:
    """``model_ema.safetensors`` evaluated with the task on the run's evaluation split."""
    cfg, model = load_run(RunDir(run_dir), "ema")
    backend = CpuBackend("fp32")
    loader = build_eval_loader(cfg.data, batch_size=cfg.micro_batch_size, rank=0, world_size=1, device=backend.device)
    return ClassificationTask().evaluate(model, loader, backend, prefix="eval_ema")


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("ema")
    preemption.clear()
    run_in_process(work, tiny_config(**{"epochs": 2, "ema.decay": 0.6}), work / "run")
    return work / "run"


def test_eval_ema_metrics_are_those_of_the_saved_ema_weights(ema_run):
    evals = [r for r in map(json.loads, (ema_run / "metrics.jsonl").read_text().splitlines()) if "eval/top1" in r]
    assert [r["step"] for r in evals] == [4, 8] and all("eval_ema/top1" in r for r in evals)
    expected = evaluate_file(ema_run)
    assert evals[-1]["eval_ema/top1"] == expected["eval_ema/top1"]
    assert evals[-1]["eval_ema/loss"] == pytest.approx(expected["eval_ema/loss"], rel=1e-12)
    assert evals[-1]["eval_ema/samples"] == 32
    ema, model = load_file(ema_run / EMA_WEIGHTS), load_file(ema_run / "model.safetensors")
    assert ema.keys() == model.keys() and not torch.equal(ema["head.weight"], model["head.weight"])


def test_ema_eval_off_skips_the_evaluation_but_keeps_the_weights(tmp_path):
    run_in_process(tmp_path, tiny_config(**{"ema.decay": 0.6, "ema.eval": False}), tmp_path / "run")
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("eval/top1" in r for r in records) and not any(k.startswith("eval_ema") for r in records for k in r)
    assert (tmp_path / "run" / EMA_WEIGHTS).is_file()


@pytest.mark.slow
def test_export_ema_writes_a_folder_timm_loads_with_the_ema_weights(ema_run, tmp_path):
    result = run_cli("export", str(ema_run), "--out", str(tmp_path / "out"), "--ema")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert "the EMA of its weights" in (tmp_path / "out" / "README.md").read_text()  # the model card says which
    loaded = timm.create_model(f"local-dir:{tmp_path / 'out'}", pretrained=True)
    ema = load_file(ema_run / EMA_WEIGHTS)
    assert loaded.state_dict().keys() == ema.keys()
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, ema[key]), key


@pytest.mark.slow
def test_export_ema_of_a_run_without_ema_is_one_error_line(ema_run, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("config.yaml", "model.safetensors"):
        (plain / name).write_bytes((ema_run / name).read_bytes())
    cfg = yaml.safe_load((plain / "config.yaml").read_text())
    assert cfg["ema"]["decay"] == 0.6
    result = run_cli("export", str(plain), "--out", str(tmp_path / "out"), "--ema")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "has no model_ema.safetensors" in result.stderr and "ema.decay" in result.stderr
    assert not (tmp_path / "out").exists()


def test_ema_eval_may_change_on_resume_but_not_the_decay():
    from largebatch.checkpoint import config_differences

    saved = validate(tiny_config(**{"ema.decay": 0.9}))
    assert config_differences(saved, validate(tiny_config(**{"ema.decay": 0.9, "ema.eval": False}))) == []
    assert config_differences(saved, validate(tiny_config(**{"ema.decay": 0.99, "ema.warmup": True}))) == ["ema.decay", "ema.warmup"]


def torchrun_two_ranks(tmp_path: pathlib.Path, cfg: dict) -> subprocess.CompletedProcess:
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(REPO / "train.py")]
    cmd += ["--config", str(write_config(tmp_path, cfg)), "--run-dir", str(tmp_path / "run")]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=clean_env())


@pytest.mark.dist
@pytest.mark.slow
def test_two_ranks_keep_the_same_ema(tmp_path):
    cfg = tiny_config(**{"ema.decay": 0.8, "hooks": [{"type": RANK_WEIGHTS, "prefix": "ema_rank", "extra": "ema"}]})
    result = torchrun_two_ranks(tmp_path, cfg)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rank0, rank1 = (load_file(tmp_path / "run" / f"ema_rank{r}.safetensors") for r in (0, 1))
    written = load_file(tmp_path / "run" / EMA_WEIGHTS)
    for key, value in written.items():
        assert torch.equal(rank0[key], value) and torch.equal(rank1[key], value), key


@pytest.mark.dist
@pytest.mark.slow
def test_ema_with_sharded_parameters_is_one_error_line(tmp_path):
    result = torchrun_two_ranks(tmp_path, tiny_config(**{"ema.decay": 0.8, "dist.strategy": "fsdp"}))
    assert result.returncode != 0
    assert "error: " in result.stderr and "not available with sharded parameters" in result.stderr, result.stderr[-3000:]
