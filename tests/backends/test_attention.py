"""``check_flash_attention``: on the CPU (whose flash kernel is
``_scaled_dot_product_flash_attention_for_cpu``) the logic; on a GPU, ``tests/backends/test_cuda.py``."""

from __future__ import annotations

import timm
import torch

from largebatch.backends.attention import check_flash_attention
from largebatch.backends.cuda import set_timm_fused_attention

DEPTH = 3


def vit() -> torch.nn.Module:
    return timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=DEPTH, num_classes=10).eval()


def test_every_attention_module_runs_the_flash_kernel_once():
    found = check_flash_attention(vit(), torch.randn(2, 3, 32, 32))
    assert (found.modules, found.fused, found.flash_calls, found.error) == (DEPTH, DEPTH, DEPTH, None)
    assert found.ok and found.describe().startswith("flash attention: yes (3 attention modules")


def test_attention_multiplied_out_is_not_fused():
    try:
        set_timm_fused_attention(False)
        model = vit()
    finally:
        set_timm_fused_attention(True)
    found = check_flash_attention(model, torch.randn(2, 3, 32, 32))
    assert (found.modules, found.fused, found.flash_calls) == (DEPTH, 0, 0) and not found.ok


def test_a_forward_flash_cannot_run_is_reported():
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=DEPTH, attn_drop_rate=0.1).train()
    found = check_flash_attention(model, torch.randn(2, 3, 32, 32))  # the CPU's flash kernel takes no dropout
    assert found.error is not None and found.flash_calls == 0 and not found.ok
    assert "the forward failed" in found.describe()
