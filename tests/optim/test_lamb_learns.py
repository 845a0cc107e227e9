"""LAMB trains a small ViT on scikit-learn's digits at a large batch via accumulation."""

from __future__ import annotations

import math

import pytest
import timm
import torch
from sklearn.datasets import load_digits

from largebatch.optim.lamb import Lamb
from largebatch.optim.param_groups import build_param_groups

GLOBAL_BATCH, MICRO_BATCH, STEPS, WARMUP, PEAK_LR = 1024, 128, 200, 20, 0.05
ACCUMULATION = GLOBAL_BATCH // MICRO_BATCH
# Measured: 0.96-0.97 on the 360 held-out digits (chance is 0.10; peak lr 0.1 diverges,
# 0.02 reaches ~0.5 in this budget); the bar leaves headroom.
MIN_ACCURACY = 0.85


def learning_rate(step: int) -> float:
    """Linear warmup, then cosine decay to zero."""
    if step < WARMUP:
        return PEAK_LR * (step + 1) / WARMUP
    progress = (step - WARMUP) / (STEPS - WARMUP)
    return PEAK_LR * 0.5 * (1 + math.cos(math.pi * progress))


@pytest.mark.slow
def test_lamb_learns_digits_at_batch_1024():
    torch.manual_seed(0)
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target)
    order = torch.randperm(len(labels))
    test_idx, train_idx = order[:360], order[360:]
    model = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=8,
        patch_size=2,
        in_chans=1,
        num_classes=10,
        depth=2,
        embed_dim=32,
        num_heads=2,
        global_pool="avg",
    )
    optimizer = Lamb(build_param_groups(model, weight_decay=0.05), lr=PEAK_LR)
    model.train()
    for step in range(STEPS):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step) * group.get("lr_scale", 1.0)
        # One global batch sampled from the (small) training set, run as micro-batches
        # whose losses are scaled so the summed gradient is the global-batch mean.
        batch = train_idx[torch.randint(len(train_idx), (GLOBAL_BATCH,))]
        optimizer.zero_grad(set_to_none=True)
        for micro in batch.split(MICRO_BATCH):
            loss = torch.nn.functional.cross_entropy(model(images[micro]), labels[micro])
            (loss / ACCUMULATION).backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(images[test_idx]).argmax(1) == labels[test_idx]).float().mean().item()
    print(f"held-out accuracy {accuracy:.3f}")
    assert accuracy >= MIN_ACCURACY
