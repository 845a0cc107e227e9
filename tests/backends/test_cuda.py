"""The CUDA backend. Tests marked ``gpu`` need a CUDA GPU and are skipped without one."""

from __future__ import annotations

import importlib.util

import pytest
import timm
import torch
from timm.layers import use_fused_attn

from largebatch.backends import create_backend
from largebatch.backends.cuda import CudaBackend, set_timm_fused_attention
from largebatch.config.sections import CudaConfig, DistConfig
from largebatch.config.typed import typed
from largebatch.errors import UserError
from tests.conftest import REPO, load_and_validate

HAS_GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")


@pytest.mark.skipif(HAS_GPU, reason="a GPU is present")
def test_asking_for_cuda_without_a_gpu_says_so():
    with pytest.raises(UserError, match="torch sees no CUDA GPU"):
        CudaBackend("bf16")


def test_the_fused_attention_switch_reaches_timm():
    try:
        set_timm_fused_attention(False)
        assert not use_fused_attn()
        assert not timm.create_model("vit_tiny_patch16_224", img_size=32, depth=1).blocks[0].attn.fused_attn
        set_timm_fused_attention(True)
        assert use_fused_attn()
    finally:
        set_timm_fused_attention(True)


@pytest.mark.skipif(HAS_GPU, reason="checks the CPU fallback")
def test_vit_b16_config_resolves_to_the_cpu_in_fp32_here():
    cfg = load_and_validate(str(REPO / "configs/vit-b16.py"), [])
    assert cfg["device"] == "auto" and cfg["precision"] == "auto" and cfg["data"]["loader"] == "dali"
    assert cfg["hpu"] == {"mode": "lazy", "fused_optimizer": True, "fused_clip_norm": True}
    assert cfg["cuda"] == {"tf32": True, "fused_attention": True, "compile_mode": None}
    typed_cfg = typed(cfg)
    backend = create_backend(typed_cfg.device, typed_cfg.precision, 0, cuda=typed_cfg.cuda, hpu=typed_cfg.hpu)
    assert (backend.name, backend.precision, backend.autocast_dtype, backend.dist_backend) == ("cpu", "fp32", None, "gloo")


def tiny_step(backend: CudaBackend) -> tuple[torch.nn.Module, torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = backend.prepare_model(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)))
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = backend.make_grad_scaler()
    x = torch.randn(8, 16, device=backend.device)
    y = torch.randint(4, (8,), device=backend.device)
    with backend.autocast():
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        backend.clip_grad_norm(list(model.parameters()), 1.0)
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        backend.clip_grad_norm(list(model.parameters()), 1.0)
        optimizer.step()
    backend.after_optimizer_step()
    backend.synchronize()
    return model, logits, before


@pytest.mark.gpu
@gpu
def test_bf16_autocast_step_on_a_gpu():
    backend = CudaBackend("bf16")
    assert backend.make_grad_scaler() is None
    model, logits, before = tiny_step(backend)
    assert logits.dtype == torch.bfloat16
    after = list(model.parameters())
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(after, before))


@pytest.mark.gpu
@gpu
def test_fp16_autocast_with_grad_scaler_step_on_a_gpu():
    backend = CudaBackend("fp16")
    assert isinstance(backend.make_grad_scaler(), torch.amp.GradScaler)
    model, logits, before = tiny_step(backend)
    assert logits.dtype == torch.float16
    after = list(model.parameters())
    assert all(torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(after, before))


@pytest.mark.gpu
@gpu
def test_memory_statistics_on_a_gpu():
    backend = CudaBackend("bf16")
    backend.reset_peak_memory()
    block = torch.empty(1 << 20, dtype=torch.uint8, device=backend.device)
    stats = backend.memory_stats()
    assert set(stats) == {"allocated", "peak_allocated", "reserved", "peak_reserved", "total"}
    assert stats["peak_allocated"] >= stats["allocated"] >= block.numel()
    assert stats["total"] >= stats["reserved"] > 0


@pytest.mark.gpu
@gpu
def test_gpu_options_tf32_ddp_and_auto():
    backend = CudaBackend("bf16", options=CudaConfig(tf32=False))
    assert torch.backends.cuda.matmul.allow_tf32 is False
    backend = CudaBackend("bf16")
    assert torch.backends.cuda.matmul.allow_tf32 is True
    dist_cfg = DistConfig(bucket_cap_mb=25.0, gradient_as_bucket_view=True, find_unused_parameters=False, static_graph=False)
    assert backend.ddp_options(dist_cfg)["device_ids"] == [backend.device.index]
    assert backend.dist_backend == "nccl"
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, depth=1)
    assert model.blocks[0].attn.fused_attn  # SDPA (flash / memory-efficient kernels)
    if importlib.util.find_spec("habana_frameworks") is None:
        assert create_backend("auto").name == "cuda"


def test_the_compile_modes_offered_are_torchs():
    import torch._inductor

    from largebatch.config.schema import COMPILE_MODES

    assert set(COMPILE_MODES) <= set(torch._inductor.list_mode_options())


@pytest.mark.gpu
@gpu
def test_vit_attention_runs_the_flash_kernel_in_bf16_on_a_gpu():
    from largebatch.backends.attention import check_flash_attention

    backend = CudaBackend("bf16")
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2).to(backend.device).eval()
    with backend.autocast():
        found = check_flash_attention(model, torch.randn(4, 3, 32, 32, device=backend.device))
    assert found.ok, found.describe()
    with torch.autocast("cuda", enabled=False):  # the reference: fp32, which the flash kernel does not take
        assert not check_flash_attention(model, torch.randn(4, 3, 32, 32, device=backend.device)).ok
