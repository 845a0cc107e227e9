"""The debugging hooks in ``hooks/``, loaded by path from a config and run on the synthetic
demo; what they record is checked against the same quantity computed directly."""

from __future__ import annotations

import copy
import json
import math
import signal

import pytest
import torch

from largebatch.engine.engine import Engine
from largebatch.engine.hook import Hook, HookError, Priority
from largebatch.launch import TrainArgs, build_run
from largebatch.tasks.classification import soft_cross_entropy
from tests.conftest import REPO, hooks_override, tiny_config, write_config

DEMO = REPO / "configs/demo/vit-tiny-synthetic.py"
FAST = [
    "global_batch_size=64",  # two micro-batches of 32 per step
    "eval.at_end=false",
    "checkpoint.interval_epochs=0",
    "checkpoint.at_end=false",
    "log.console=false",
    "log.interval=1",
]


class Recorder(Hook):
    """Keeps the weights at the start of step ``step`` (1-based) and its micro-batches."""

    priority = Priority.HIGHEST

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step
        self.weights: dict[str, torch.Tensor] = {}
        self.batches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.qkv_hooks_per_step: dict[int, int] = {}

    def before_step(self, state) -> None:
        if state.step + 1 == self.step:
            self.weights = {k: v.detach().clone() for k, v in state.run.model.state_dict().items()}

    def before_micro_step(self, state) -> None:
        if state.step + 1 == self.step:
            self.batches.append((state.current.batch.images.clone(), state.current.batch.targets.clone()))

    def after_forward(self, state) -> None:  # runs before other hooks' after_forward
        qkv = state.run.model.blocks[0].attn.qkv
        self.qkv_hooks_per_step[state.step + 1] = max(self.qkv_hooks_per_step.get(state.step + 1, 0), len(qkv._forward_hooks))

    def reference_model(self, state) -> torch.nn.Module:
        model = copy.deepcopy(state.run.model)
        model.load_state_dict(self.weights)
        return model


def run(tmp_path, hooks: list, *extra: Hook, max_steps: int = 2):
    """Build the demo run with ``hooks`` from the config, add ``extra`` hook objects, train."""
    overrides = [*FAST, f"max_steps={max_steps}", hooks_override(*hooks)]
    engine, _ = build_run(TrainArgs(str(DEMO), overrides, str(tmp_path / "run")))
    engine = Engine(engine.state, [*engine.hooks, *extra], engine.train_loader, engine.eval_loader)
    engine.run()
    return engine.state


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_grad_stats_match_norms_of_an_independent_backward(tmp_path):
    recorder = Recorder(step=2)
    state = run(tmp_path, [dict(type="hooks/grad_stats.py:GradStatsHook", interval=2)], recorder)
    records = read_jsonl(state.run.run_dir / "grad_stats.jsonl")
    assert [r["step"] for r in records] == [2]

    model = recorder.reference_model(state)
    model.zero_grad()
    for images, targets in recorder.batches:
        (soft_cross_entropy(model(images), targets) / len(recorder.batches)).backward()
    expected = {n: (torch.linalg.vector_norm(p.grad).item(), torch.linalg.vector_norm(p).item()) for n, p in model.named_parameters()}
    params = records[0]["params"]
    assert params.keys() == expected.keys()
    for name, (grad, weight) in expected.items():
        assert params[name]["grad"] == pytest.approx(grad, rel=1e-4, abs=1e-9), name
        assert params[name]["weight"] == pytest.approx(weight, rel=1e-5), name
        assert params[name]["ratio"] == pytest.approx(grad / weight, rel=1e-4, abs=1e-9), name
    total = math.sqrt(sum(g * g for g, _ in expected.values()))
    assert records[0]["grad_norm"] == pytest.approx(total, rel=1e-4)
    assert total > state.run.config.to_dict()["clip_grad_norm"]  # so the recorded norms are the ones before clipping


def manual_entropy_and_output(block: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention entropy per head of ``block`` on its input ``x``, written out; and the block's output."""
    attn = block.attn
    batch, tokens, dim = x.shape
    heads = attn.num_heads
    qkv = torch.nn.functional.linear(block.norm1(x), attn.qkv.weight, attn.qkv.bias)
    q, k = qkv[..., :dim], qkv[..., dim : 2 * dim]
    q = q.reshape(batch, tokens, heads, dim // heads).transpose(1, 2)
    k = k.reshape(batch, tokens, heads, dim // heads).transpose(1, 2)
    probs = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(dim // heads), dim=-1)
    entropy = -(probs * torch.log(probs)).sum(-1)  # [batch, heads, queries]
    return entropy.mean(dim=(0, 2)), block(x)


def test_attention_entropy_matches_a_manual_attention(tmp_path):
    recorder = Recorder(step=2)
    state = run(tmp_path, [dict(type="hooks/attention_entropy.py:AttentionEntropyHook", interval=2)], recorder, max_steps=3)
    records = read_jsonl(state.run.run_dir / "attention_entropy.jsonl")
    assert [r["step"] for r in records] == [2, 3]  # every 2nd step and the last
    assert recorder.qkv_hooks_per_step == {1: 0, 2: 1, 3: 1}  # attached on logged steps only
    assert len(state.run.model.blocks[0].attn.qkv._forward_hooks) == 0
    assert all(block.attn.fused_attn for block in state.run.model.blocks)  # so the matrix had to be recomputed

    model = recorder.reference_model(state)
    inputs = {}
    for i, block in enumerate(model.blocks):
        block.register_forward_pre_hook(lambda module, args, i=i: inputs.__setitem__(i, args[0].detach()))
    with torch.no_grad():
        model(recorder.batches[0][0])  # the step's first micro-batch
        assert records[0]["max_entropy"] == pytest.approx(math.log(inputs[0].shape[1]))
        for i, block in enumerate(model.blocks):
            entropy, output = manual_entropy_and_output(block, inputs[i])
            got = records[0]["blocks"][f"blocks.{i}"]
            assert got["entropy_per_head"] == pytest.approx(entropy.tolist(), rel=1e-5)
            assert got["entropy"] == pytest.approx(entropy.mean().item(), rel=1e-5)
            assert got["mean"] == pytest.approx(output.mean().item(), abs=1e-5)
            assert got["std"] == pytest.approx(output.std().item(), rel=1e-5)


class InjectNaN(Hook):
    """Writes a NaN into one weight at the start of step ``step`` and keeps that step's first batch."""

    priority = Priority.HIGHEST

    def __init__(self, step: int, parameter: str) -> None:
        super().__init__()
        self.step, self.parameter = step, parameter
        self.batch = None

    def before_step(self, state) -> None:
        if state.step + 1 == self.step:
            with torch.no_grad():
                state.run.model.get_parameter(self.parameter).view(-1)[0] = float("nan")

    def before_micro_step(self, state) -> None:
        if state.step + 1 == self.step and self.batch is None:
            self.batch = (state.current.batch.images.clone(), state.current.batch.targets.clone(), state.current.batch.labels.clone())


def test_first_nan_names_the_layer_step_and_batch(tmp_path):
    injector = InjectNaN(step=3, parameter="blocks.1.mlp.fc1.weight")
    with pytest.raises(HookError, match=r"step 3, micro-batch 0: forward of blocks\.1\.mlp\.fc1"):
        run(tmp_path, [dict(type="hooks/first_nan.py:FirstNaNHook")], injector, max_steps=4)
    out = tmp_path / "run" / "first_nan"
    report = json.loads((out / "report.json").read_text())
    assert report["step"] == 3 and report["micro_in_window"] == 0 and report["micro_step"] == 5
    assert (report["where"], report["module"]) == ("forward", "blocks.1.mlp.fc1")
    assert report["nonfinite_parameters"] == ["blocks.1.mlp.fc1.weight"]
    assert math.isnan(report["loss"])
    saved = torch.load(out / "batch.pt")
    for key, expected in zip(("images", "targets", "labels"), injector.batch):
        assert torch.equal(saved[key], expected), key
    weights = torch.load(out / "model.pt")
    assert torch.isnan(weights["blocks.1.mlp.fc1.weight"]).sum() == 1
    assert metrics_steps(tmp_path) == [1, 2]  # it stopped before step 3's update


def metrics_steps(tmp_path) -> list[int]:
    return [r["step"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r]


class GradToNaN(Hook):
    """From step ``step`` on, ``module``'s backward returns a NaN input gradient (its forward stays finite)."""

    def __init__(self, step: int, module: str) -> None:
        super().__init__()
        self.step, self.module = step, module

    def before_step(self, state) -> None:
        if state.step + 1 == self.step:
            nan_grads = lambda module, grad_input, grad_output: tuple(g * float("nan") for g in grad_input)  # noqa: E731
            state.run.model.get_submodule(self.module).register_full_backward_hook(nan_grads)


def test_first_nan_names_the_module_whose_backward_goes_nan(tmp_path):
    with pytest.raises(HookError, match=r"step 2, micro-batch 0: backward of blocks\.0\.mlp\.fc2"):
        run(tmp_path, [dict(type="hooks/first_nan.py:FirstNaNHook", save_weights=False)], GradToNaN(2, "blocks.0.mlp.fc2"))
    report = json.loads((tmp_path / "run" / "first_nan" / "report.json").read_text())
    assert (report["where"], report["module"], report["nonfinite_parameters"]) == ("backward", "blocks.0.mlp.fc2", [])
    assert math.isfinite(report["loss"])
    assert not (tmp_path / "run" / "first_nan" / "model.pt").exists()


def test_profiler_window_traces_only_its_steps(tmp_path):
    state = run(tmp_path, [dict(type="hooks/profiler_window.py:ProfilerWindowHook", start=2, steps=2)], max_steps=4)
    trace = json.loads((state.run.run_dir / "profile" / "trace_rank0.json").read_text())
    names = [e.get("name", "") for e in trace["traceEvents"]]
    assert sorted(n for n in names if n.startswith("largebatch_step_")) == ["largebatch_step_2", "largebatch_step_3"]
    assert sum(n.startswith("Optimizer.step#") for n in names) == 2  # two of the run's four updates
    assert sum(n == "aten::addmm" for n in names) > 0
    assert "Self CPU" in (state.run.run_dir / "profile" / "key_averages_rank0.txt").read_text()


def test_loss_spike_stops_on_a_loss_above_factor_times_the_mean(tmp_path):
    state = run(tmp_path, [dict(type="hooks/loss_spike.py:LossSpikeHook", factor=0.5, warmup=1)], max_steps=4)
    losses = [r["loss"] for r in read_jsonl(state.run.run_dir / "metrics.jsonl") if "loss" in r]
    assert state.step == 2 and len(losses) == 2  # step 1 sets the mean; step 2's loss is above half of it
    assert losses[1] > 0.5 * losses[0]
    assert state.stop_reason.startswith(f"loss {losses[1]:.4g} at step 2, running mean {losses[0]}")


@pytest.fixture
def cli_in_process():
    """``train.py`` in this process; it installs preemption signal handlers, put back after."""
    from largebatch.train_command import train_main

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR1, signal.SIGTERM)}
    yield train_main
    for sig, handler in saved.items():
        signal.signal(sig, handler)


HOOK_FILE = """
from largebatch.engine.hook import Hook

class NotAHook:
    pass

class Strict(Hook):
    def __init__(self, interval: int = 1):
        super().__init__()
        if interval < 1:
            raise ValueError(f"interval must be >= 1, got {interval}")
"""


@pytest.mark.parametrize(
    ("hook", "fragments"),
    [
        ({"type": "HOOKS/missing.py:Thing"}, ["hooks[1]", "missing.py' not found"]),
        ({"type": "HOOKS/mine.py:Strikt"}, ["hooks[1]", "no class 'Strikt'", "did you mean 'Strict'"]),
        ({"type": "HOOKS/mine.py:NotAHook"}, ["hooks[1]", "NotAHook is not a subclass", "subclass Hook"]),
        ({"type": "HOOKS/mine.py:Strict", "intervl": 2}, ["hooks[1]", "intervl", "it takes interval"]),
        ({"type": "HOOKS/mine.py:Strict", "interval": 0}, ["hooks[1]", "Strict: interval must be >= 1, got 0"]),
        ({"type": "HOOKS/broken.py:Thing"}, ["hooks[1]", "broken.py raised SyntaxError"]),
        ({"type": "hooks/grad_stats.py:GradStatsHook", "interval": 0}, ["hooks[1]", "GradStatsHook: interval must be >= 1"]),
    ],
)
def test_bad_custom_hook_is_one_error_line_naming_its_index(tmp_path, capsys, cli_in_process, hook, fragments):
    (tmp_path / "mine.py").write_text(HOOK_FILE)
    (tmp_path / "broken.py").write_text("class Thing(:\n")
    hook = {**hook, "type": hook["type"].replace("HOOKS", str(tmp_path))}
    config = write_config(tmp_path, tiny_config(hooks=["logger", hook]))
    assert cli_in_process(["--config", str(config), "--run-dir", str(tmp_path / "run")]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # nothing trained


DATACLASS_HOOK_FILE = """
from __future__ import annotations

import dataclasses
from largebatch.engine.hook import Hook

@dataclasses.dataclass
class Window:
    size: int = 3

class Windowed(Hook):
    def __init__(self, size: int = 3):
        super().__init__()
        self.window = Window(size)
"""


def test_custom_hook_file_may_define_dataclasses(tmp_path):
    # with string annotations, dataclasses look the defining module up in sys.modules while the file runs
    from largebatch.hooks import load_hook_class

    (tmp_path / "windowed.py").write_text(DATACLASS_HOOK_FILE)
    cls = load_hook_class(f"{tmp_path}/windowed.py:Windowed", "hooks[0]")
    assert cls(size=5).window.size == 5


@pytest.mark.parametrize(
    ("page", "heading"), [("README.md", "## A first custom hook"), ("docs/hooks.md", "## Write your first debugging hook")]
)
def test_first_hook_example_is_hooks_loss_spike(page, heading):
    text = (REPO / page).read_text()
    section = text[text.index(heading) :]
    code = section[section.index("```python\n") + len("```python\n") :]
    code = code[: code.index("```")]
    assert code.startswith("# hooks/loss_spike.py\n")
    source = (REPO / "hooks/loss_spike.py").read_text()
    assert source.endswith(code.removeprefix("# hooks/loss_spike.py\n"))
    assert len(code.splitlines()) < 30


INJECT_FILE = """
import torch
from largebatch.engine.hook import Hook

class InjectNaN(Hook):
    def before_step(self, state):
        if state.step == 1:
            with torch.no_grad():
                state.run.model.blocks[0].mlp.fc1.weight[0, 0] = float("nan")
"""


def test_first_nan_ends_the_command_with_one_error_line(tmp_path, capsys, cli_in_process):
    (tmp_path / "inject.py").write_text(INJECT_FILE)
    hooks = [{"type": f"{tmp_path}/inject.py:InjectNaN"}, {"type": "hooks/first_nan.py:FirstNaNHook"}]
    config = write_config(tmp_path, tiny_config(hooks=hooks))
    assert cli_in_process(["--config", str(config), "--run-dir", str(tmp_path / "run")]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "first non-finite value at step 2, micro-batch 0: forward of blocks.0.mlp.fc1" in lines[0]
    assert json.loads((tmp_path / "run" / "first_nan" / "report.json").read_text())["module"] == "blocks.0.mlp.fc1"
    assert not (tmp_path / "run" / "model.safetensors").exists()
