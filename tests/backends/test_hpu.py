"""The HPU backend against a recording stand-in for Habana's packages.

The stand-in (``tests/backends/fake_habana``) records calls and computes nothing on a
Gaudi: the backend under test keeps its tensors on the CPU (``CpuHpuBackend``), so these
tests check where and how largebatch calls Habana's API, not what a Gaudi does with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import pathlib
import sys

import pytest
import torch

from largebatch.backends import create_backend, hpu, resolve_device_name
from largebatch.backends.base import Backend
from largebatch.config.sections import DistConfig, HpuConfig, OptimizerConfig
from largebatch.config.typed import section
from largebatch.dist import DistInfo
from largebatch.errors import UserError
from largebatch.optim import build_optimizer
from largebatch.optim.lamb import Lamb
from tests.engine.helpers import make_engine

FAKE = pathlib.Path(__file__).parent / "fake_habana"


@pytest.fixture
def environ_restored():
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def fake_habana(monkeypatch, environ_restored):
    """Put the stand-in on sys.path; return its record module; forget it afterwards."""
    monkeypatch.delenv("PT_HPU_LAZY_MODE", raising=False)
    monkeypatch.syspath_prepend(str(FAKE))
    importlib.invalidate_caches()
    record = importlib.import_module("habana_frameworks._record")
    record.events.clear()
    yield record
    for name in [n for n in sys.modules if n == "habana_frameworks" or n.startswith("habana_frameworks.")]:
        del sys.modules[name]


class CpuHpuBackend(hpu.HpuBackend):
    """The HPU backend with its tensors on the CPU, for the recording stand-in."""

    def make_device(self) -> torch.device:
        super().make_device()
        return torch.device("cpu")


@pytest.fixture
def recorded_autocast(monkeypatch, fake_habana):
    """torch.autocast replaced by a recorder (torch alone has no 'hpu' autocast)."""

    def autocast(device_type, dtype=None, **kwargs):
        fake_habana.record("autocast", device_type=device_type, dtype=dtype)
        return contextlib.nullcontext()

    monkeypatch.setattr(torch, "autocast", autocast)
    return fake_habana


def run_engine(backend, accumulation: int, steps: int, record) -> list[str]:
    """Train a linear model for ``steps`` optimizer steps; return the recorded event names."""
    micro = 4
    torch.manual_seed(0)
    batches = [(torch.randn(micro, 6), torch.randint(4, (micro,))) for _ in range(steps * accumulation)]
    model = torch.nn.Linear(6, 4)
    model.weight.register_hook(lambda grad: record.record("backward"))
    engine = make_engine(
        model,
        batches,
        global_batch_size=micro * accumulation,
        micro_batch_size=micro,
        num_samples=micro * accumulation * steps,
        **{"data.num_classes": 4},
    )
    engine.state.run = dataclasses.replace(engine.state.run, backend=backend)
    optimizer = engine.state.run.optimizer
    original_step = optimizer.step

    def step(*args, **kwargs):
        record.record("optimizer.step")
        return original_step(*args, **kwargs)

    optimizer.step = step
    engine.run()
    return [name for name in record.names() if name in ("backward", "mark_step", "optimizer.step", "autocast")]


@pytest.mark.parametrize("accumulation", [1, 2])
def test_lazy_mode_marks_a_step_after_every_backward_and_every_optimizer_step(recorded_autocast, accumulation):
    backend = CpuHpuBackend("bf16", options=HpuConfig(mode="lazy"))
    recorded_autocast.events.clear()
    steps = 2
    seen = run_engine(backend, accumulation, steps, recorded_autocast)
    per_micro = ["autocast", "backward", "mark_step"]
    assert seen == (per_micro * accumulation + ["optimizer.step", "mark_step"]) * steps
    autocasts = [details for name, details in recorded_autocast.events if name == "autocast"]
    assert autocasts and all(d == {"device_type": "hpu", "dtype": torch.bfloat16} for d in autocasts)


@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_eager_and_compile_modes_mark_no_step(fake_habana, mode):
    backend = CpuHpuBackend("fp32", options=HpuConfig(mode=mode))
    fake_habana.events.clear()
    seen = run_engine(backend, 2, 1, fake_habana)
    assert seen == ["backward", "backward", "optimizer.step"]


def test_the_lazy_flag_is_in_the_environment_before_the_bridge_is_imported(fake_habana):
    backend = CpuHpuBackend("bf16", options=HpuConfig(mode="lazy"))
    imports = [d for name, d in fake_habana.events if name == "import habana_frameworks.torch"]
    assert imports == [{"PT_HPU_LAZY_MODE": "1"}]
    assert backend.describe() == "hpu (cpu, bf16, lazy mode)"


def test_a_contradicting_environment_is_refused(fake_habana, monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    with pytest.raises(UserError, match=r"PT_HPU_LAZY_MODE=0 but hpu.mode 'lazy' needs PT_HPU_LAZY_MODE=1"):
        CpuHpuBackend("bf16", options=HpuConfig(mode="lazy"))
    assert "import habana_frameworks.torch" not in fake_habana.names()


def test_a_bridge_imported_in_the_other_mode_is_refused(fake_habana, monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    importlib.import_module("habana_frameworks.torch")  # someone imported it first, eager
    monkeypatch.delenv("PT_HPU_LAZY_MODE")
    with pytest.raises(UserError, match="runs in eager mode but hpu.mode is 'lazy'"):
        CpuHpuBackend("bf16", options=HpuConfig(mode="lazy"))


def test_compile_mode_uses_habanas_compiler_backend(fake_habana, monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: calls.append(kwargs) or model)
    model = torch.nn.Linear(2, 2)
    assert CpuHpuBackend("fp32", options=HpuConfig(mode="compile")).compile(model, False) is model
    assert calls == [{"backend": "hpu_backend"}]


def test_lazy_mode_compiles_nothing_and_refuses_compile_true(fake_habana, monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: calls.append(kwargs) or model)
    model = torch.nn.Linear(2, 2)
    backend = CpuHpuBackend("fp32", options=HpuConfig(mode="lazy"))
    assert backend.compile(model, False) is model and calls == []
    with pytest.raises(UserError, match="compile=True needs hpu.mode 'compile'"):
        backend.compile(model, True)


def test_hccl_is_imported_with_the_ranks_set_before_the_process_group(fake_habana, monkeypatch):
    import largebatch.dist

    monkeypatch.setattr(
        largebatch.dist, "init_process_group", lambda info, backend, timeout: fake_habana.record("init_process_group", backend=backend)
    )
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    backend = CpuHpuBackend("bf16")
    assert backend.dist_backend == "hccl"
    fake_habana.events.clear()
    backend.init_process_group(DistInfo(rank=1, world_size=2, local_rank=1, launcher="openmpi"), backend.dist_backend, 1.0)
    assert fake_habana.events == [
        (
            "import hccl",
            {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
        ),
        ("initialize_distributed_hpu", {"world_size": 2, "rank": 1, "local_rank": 1}),
        ("init_process_group", {"backend": "hccl"}),
    ]


def test_a_single_process_imports_no_hccl(fake_habana, monkeypatch):
    import largebatch.dist

    monkeypatch.setattr(largebatch.dist, "init_process_group", lambda *args: None)
    CpuHpuBackend("bf16").init_process_group(DistInfo(), "hccl", 1.0)
    assert "import hccl" not in fake_habana.names()


def test_ddp_options_follow_habanas_references(fake_habana):
    dist_cfg = DistConfig(bucket_cap_mb=100.0, gradient_as_bucket_view=True, find_unused_parameters=False, static_graph=False)
    options = CpuHpuBackend("bf16").ddp_options(dist_cfg)
    assert options == {
        "device_ids": None,
        "bucket_cap_mb": 100.0,
        "gradient_as_bucket_view": True,
        "find_unused_parameters": False,
        "static_graph": False,
        "broadcast_buffers": False,
    }


def lamb_cfg(**optimizer) -> OptimizerConfig:
    values = {
        "type": "lamb",
        "lr": 0.02,
        "weight_decay": 0.1,
        "no_weight_decay": ["*.bias"],
        "exclude_1d": True,
        "layer_decay": None,
        **optimizer,
    }
    return section("optimizer", values)


def hpu_optimizer(cfg: OptimizerConfig, model: torch.nn.Module, backend: Backend | None = None) -> torch.optim.Optimizer:
    """The optimizer as launch builds it: the optim layer's, with what the backend supplies."""
    return build_optimizer(cfg, model, fused_lamb=(backend or CpuHpuBackend("bf16")).fused_lamb())


def test_fused_lamb_is_chosen_when_present_and_set_up_as_the_papers_lamb(fake_habana):
    backend = CpuHpuBackend("bf16")
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    optimizer = hpu_optimizer(lamb_cfg(betas=[0.9, 0.99]), model, backend)
    (name, details), *_ = [e for e in fake_habana.events if e[0] == "FusedLamb"]
    assert details["adam_w_mode"] is True and details["use_lamb"] is True
    assert details["max_grad_norm"] is None  # clipping stays in clip_grad_norm, once per step
    assert details["lr"] == 0.02 and details["weight_decay"] == 0.1 and details["betas"] == (0.9, 0.99)
    assert details["groups"] == 2
    model(torch.randn(2, 3)).sum().backward()
    optimizer.zero_grad(set_to_none=True)  # the engine's call works on a release without set_to_none
    assert all(p.grad is None for p in model.parameters())


def test_fused_lamb_without_adaptation_of_the_no_decay_group(fake_habana):
    hpu_optimizer(lamb_cfg(no_decay_adapt=False), torch.nn.Linear(2, 2))
    (name, details), *_ = [e for e in fake_habana.events if e[0] == "FusedLamb"]
    assert details["use_lamb"] is False


def test_fused_lamb_refuses_settings_it_cannot_reproduce(fake_habana):
    with pytest.raises(UserError, match="cannot reproduce optimizer.decoupled_weight_decay=True"):
        hpu_optimizer(lamb_cfg(decoupled_weight_decay=True), torch.nn.Linear(2, 2))


def test_other_optimizers_and_the_switch_off_keep_largebatchs_own(fake_habana):
    cfg = lamb_cfg(type="adamw")
    optimizer = hpu_optimizer(cfg, torch.nn.Linear(2, 2))
    assert isinstance(optimizer, torch.optim.AdamW)
    assert "FusedLamb" not in fake_habana.names()
    switched_off = CpuHpuBackend("bf16", options=HpuConfig(fused_optimizer=False))
    assert switched_off.fused_lamb() is None
    assert isinstance(hpu_optimizer(lamb_cfg(), torch.nn.Linear(2, 2), switched_off), Lamb)
    assert "FusedLamb" not in fake_habana.names()


def test_fused_clip_norm_is_used_when_present(fake_habana):
    model = torch.nn.Linear(4, 4)
    model(torch.randn(3, 4)).pow(2).sum().mul(100).backward()
    params = list(model.parameters())
    expected = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
    norm = CpuHpuBackend("bf16").clip_grad_norm(params, 1.0)
    assert torch.allclose(norm, expected)
    assert fake_habana.names().count("FusedClipNorm") == 1 and "FusedClipNorm.clip_norm" in fake_habana.names()
    fake_habana.events.clear()
    CpuHpuBackend("bf16", options=HpuConfig(fused_clip_norm=False)).clip_grad_norm(params, 1.0)
    assert "FusedClipNorm.clip_norm" not in fake_habana.names()


def test_memory_statistics_come_from_the_bridge(fake_habana):
    stats = CpuHpuBackend("bf16").memory_stats()
    assert stats == {"allocated": 1024.0, "peak_allocated": 2048.0, "total": 4096.0}  # the stand-in's constants
    assert "memory_stats" in fake_habana.names()


def test_auto_picks_hpu_first_and_sets_the_mode_before_probing(fake_habana):
    assert resolve_device_name("auto", "eager") == "hpu"
    assert os.environ["PT_HPU_LAZY_MODE"] == "0"
    assert [d for n, d in fake_habana.events if n == "import habana_frameworks.torch"] == [{"PT_HPU_LAZY_MODE": "0"}]


@pytest.mark.parametrize(("hpu_present", "cuda_present", "expected"), [(True, True, "hpu"), (False, True, "cuda"), (False, False, "cpu")])
def test_auto_resolution_order(monkeypatch, hpu_present, cuda_present, expected):
    import largebatch.backends

    monkeypatch.setattr(largebatch.backends, "_hpu_available", lambda mode: hpu_present)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_present)
    assert resolve_device_name("auto") == expected
    assert resolve_device_name("cpu") == "cpu"


def test_without_habanas_bridge_there_is_no_hpu_and_asking_for_one_says_why(environ_restored):
    if importlib.util.find_spec("habana_frameworks") is not None:
        pytest.skip("a habana_frameworks package is installed here")
    assert hpu.is_available() is False
    with pytest.raises(UserError, match="needs Habana's PyTorch bridge"):
        create_backend("hpu", "bf16")
