"""Attention entropy and activation statistics per ViT block, every ``interval`` steps.

In a config::

    hooks = [dict(type='hooks/attention_entropy.py:AttentionEntropyHook', interval=100)]

Output: ``attention_entropy.jsonl`` in the run directory, one line per logged step::

    {"step": 100, "max_entropy": 4.19, "blocks": {"blocks.0": {"entropy": 3.91,
        "entropy_per_head": [...], "mean": 0.01, "std": 0.98}, ...}}

``entropy`` is the Shannon entropy (nats) of each query's attention distribution over
the keys, averaged over queries, heads and images; ``max_entropy`` is ``log(tokens)``,
the entropy of uniform attention. Entropy falling towards 0 means attention collapsing
onto single tokens, a known companion of large-batch instability (Zhai et al., 2023,
"Stabilizing Transformer Training by Preventing Attention Entropy Collapse").
``mean`` / ``std`` are taken over every element of the block's output.

timm's ``Attention`` calls fused ``scaled_dot_product_attention``, which never
materialises the attention matrix. On a logged step this hook reads the output of each
block's ``attn.qkv`` projection and recomputes ``softmax(q k^T * scale)`` (after the
module's ``q_norm`` / ``k_norm``) from it. The forward hooks are attached in
``before_step`` of a logged step and removed after that step's first forward pass, so
statistics come from the step's first micro-batch and other steps run without hooks.
A ``torch.compile``-d model recompiles when hooks are attached; leave ``compile`` off
while using this hook.
"""

from __future__ import annotations

import json
import math

import torch

from largebatch.engine.hook import Hook, Priority
from largebatch.errors import UserError


def attention_blocks(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The modules that own a timm-style ``attn`` with a fused ``qkv`` projection, by name."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if hasattr(getattr(module, "attn", None), "qkv") and hasattr(module.attn, "num_heads")
    ]


def attention_entropy(qkv: torch.Tensor, attn: torch.nn.Module) -> torch.Tensor:
    """Per-head entropy ``[heads]`` of ``softmax(q k^T * scale)`` from a ``qkv`` output ``[B, N, 3 * H * D]``."""
    batch, tokens, _ = qkv.shape
    q, k, _ = qkv.reshape(batch, tokens, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    logits = (q.float() * attn.scale) @ k.float().transpose(-2, -1)
    log_probs = logits.log_softmax(dim=-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)  # [B, H, N]
    return entropy.mean(dim=(0, 2))


class AttentionEntropyHook(Hook):
    """Record attention entropy and output mean/std of each block on logged steps.

    Args:
        interval: record every ``interval`` optimizer steps.
        filename: the JSON-lines file in the run directory.
    """

    priority = Priority.NORMAL

    def __init__(self, interval: int = 100, filename: str = "attention_entropy.jsonl", priority: int | str | None = None) -> None:
        super().__init__(priority)
        if int(interval) < 1:
            raise ValueError(f"interval must be >= 1, got {interval}")
        self.interval = int(interval)
        self.filename = filename
        self._handles: list = []
        self._stats: dict[str, dict[str, torch.Tensor]] = {}
        self._tokens = 0

    def before_run(self, state) -> None:
        if not attention_blocks(state.run.model):
            raise UserError(
                f"AttentionEntropyHook: {type(state.run.model).__name__} has no blocks with a timm-style attn.qkv; it reads timm ViTs"
            )

    def before_step(self, state) -> None:
        step = state.step + 1
        if step % self.interval != 0 and step != state.run.total_steps:
            return
        self._stats = {}
        for name, block in attention_blocks(state.run.model):
            self._handles.append(block.attn.qkv.register_forward_hook(self._qkv_hook(name, block.attn)))
            self._handles.append(block.register_forward_hook(self._output_hook(name)))

    def _qkv_hook(self, name: str, attn: torch.nn.Module):
        def hook(module, inputs, output):
            with torch.no_grad():
                self._tokens = output.shape[1]
                self._stats.setdefault(name, {})["entropy"] = attention_entropy(output.detach(), attn)

        return hook

    def _output_hook(self, name: str):
        def hook(module, inputs, output):
            with torch.no_grad():
                out = output.detach().float()
                self._stats.setdefault(name, {}).update(mean=out.mean(), std=out.std())

        return hook

    def after_forward(self, state) -> None:
        if not self._handles:
            return
        self._remove()
        if not state.run.is_main:
            return
        names = list(self._stats)
        host = torch.cat([torch.cat([s["entropy"], s["mean"].reshape(1), s["std"].reshape(1)]) for s in self._stats.values()]).cpu()
        blocks, offset = {}, 0
        for name in names:
            heads = self._stats[name]["entropy"].numel()
            values = host[offset : offset + heads + 2].tolist()
            offset += heads + 2
            blocks[name] = {
                "entropy": sum(values[:heads]) / heads,
                "entropy_per_head": values[:heads],
                "mean": values[-2],
                "std": values[-1],
            }
        record = {"step": state.step + 1, "max_entropy": math.log(self._tokens), "blocks": blocks}
        with open(state.run.run_dir / self.filename, "a") as file:
            file.write(json.dumps(record) + "\n")
        self._stats = {}

    def _remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def on_exception(self, state, exception: BaseException) -> None:
        self._remove()
