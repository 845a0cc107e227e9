"""Model FLOPs (``largebatch.flops``) against counts written out by hand, and the peak table."""

from __future__ import annotations

import pytest
import torch
from timm.models.vision_transformer import Block

from largebatch.flops import forward_flops_per_sample, lookup_peak, number_format


def test_linear_layer_is_two_flops_per_multiply_add():
    layer = torch.nn.Linear(12, 5)
    assert forward_flops_per_sample(layer, (12,)) == 2 * 12 * 5
    assert forward_flops_per_sample(layer, (3, 12)) == 2 * 3 * 12 * 5  # 3 tokens


@pytest.mark.parametrize("fused", [True, False])
def test_vit_block_against_a_hand_count(fused):
    dim, tokens, heads, hidden = 32, 10, 2, 64
    block = Block(dim, num_heads=heads, mlp_ratio=hidden / dim)
    block.attn.fused_attn = fused  # the CPU's fused attention kernel must be counted too
    qkv = 2 * tokens * dim * 3 * dim
    scores = 2 * tokens * tokens * dim  # Q K^T over all heads
    mix = 2 * tokens * tokens * dim  # softmax(.) V
    proj = 2 * tokens * dim * dim
    mlp = 2 * tokens * dim * hidden * 2
    block.train()
    assert forward_flops_per_sample(block, (tokens, dim)) == qkv + scores + mix + proj + mlp
    assert block.training  # its mode is restored


def test_peak_lookup():
    assert lookup_peak("NVIDIA H100 80GB HBM3", number_format("bf16", tf32=True)) == 989.0
    assert lookup_peak("NVIDIA H100 PCIe", "16") == 756.0
    assert lookup_peak("NVIDIA A100-SXM4-80GB", number_format("fp32", tf32=True)) == 156.0
    assert lookup_peak("NVIDIA H200", "16") == 989.0
    assert lookup_peak("GAUDI2", "16") == 432.0
    assert lookup_peak("NVIDIA A100-SXM4-80GB", number_format("fp32", tf32=False)) == 19.5
    assert lookup_peak("NVIDIA H200", number_format("fp32", tf32=False)) == 67.0
    assert lookup_peak("GAUDI2", number_format("fp32", tf32=False)) is None
    assert lookup_peak("Some Future Chip", "16") is None
