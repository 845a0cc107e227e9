"""Per-parameter gradient and weight norms, every ``interval`` optimizer steps.

In a config::

    hooks = [dict(type='hooks/grad_stats.py:GradStatsHook', interval=50)]

Output: ``grad_stats.jsonl`` in the run directory, one line per logged step::

    {"step": 50, "grad_norm": 1.83, "params": {"blocks.0.attn.qkv.weight":
        {"grad": 0.041, "weight": 5.12, "ratio": 0.0080}, ...}}

``step`` is numbered as in ``metrics.jsonl`` (1 is the first optimizer step);
``grad_norm`` is the global L2 norm over all parameters; ``ratio`` is
``grad / weight`` (how large the raw gradient is against the weight it updates, the
quantity layer-wise optimizers such as LAMB rescale). On rank 0 a console line lists the
``top_k`` parameters with the largest and the smallest ratios.

The norms are taken in ``before_optimizer_step``: the final gradients of the global
batch (accumulated, all-reduced, unscaled), before clipping and before the update. The
gradient norms are ``state.compute_grad_norms()``, the one batched
``torch._foreach_norm`` a step that clipping and the non-finite check share; the weight norms
are one more such call; both are copied to the host in one transfer, on logged steps
only. Other steps cost one integer comparison.
"""

from __future__ import annotations

import json

import torch

from largebatch.engine.hook import Hook, Priority


class GradStatsHook(Hook):
    """Write per-parameter gradient norms, weight norms and their ratio.

    Args:
        interval: log every ``interval`` optimizer steps.
        top_k: how many of the largest and smallest ratios the console line shows (0: none).
        filename: the JSON-lines file in the run directory.
        priority: runs before clipping (``NORMAL``) by default.
    """

    priority = Priority.HIGH

    def __init__(self, interval: int = 50, top_k: int = 3, filename: str = "grad_stats.jsonl", priority: int | str | None = None) -> None:
        super().__init__(priority)
        if int(interval) < 1:
            raise ValueError(f"interval must be >= 1, got {interval}")
        self.interval = int(interval)
        self.top_k = int(top_k)
        self.filename = filename

    def before_optimizer_step(self, state) -> None:
        step = state.step + 1  # the number metrics.jsonl gives this step
        if step % self.interval != 0 and step != state.run.total_steps:
            return
        grad_norms = state.compute_grad_norms()  # shared with clipping and the non-finite check: computed once a step
        if not grad_norms.params:
            return
        with torch.no_grad():
            weights = torch._foreach_norm([p.detach() for p in grad_norms.params])
            norms = torch.stack([grad_norms.norms.float(), torch.stack(weights).float()]).cpu()
        if not state.run.is_main:
            return
        grad_list, weight_list = norms.tolist()
        params = {}
        for name, g, w in zip(grad_norms.names, grad_list, weight_list):
            params[name] = {"grad": g, "weight": w, "ratio": g / w if w > 0 else float("inf")}
        total = float(norms[0].double().square().sum().sqrt())
        record = {"step": step, "grad_norm": total, "params": params}
        with open(state.run.run_dir / self.filename, "a") as file:
            file.write(json.dumps(record) + "\n")
        if self.top_k > 0:
            ranked = sorted(params, key=lambda n: params[n]["ratio"])
            show = lambda names: ", ".join(f"{n} {params[n]['ratio']:.3g}" for n in names)  # noqa: E731
            print(
                f"grad_stats step {step}: grad norm {total:.4g}; largest grad/weight: {show(ranked[::-1][: self.top_k])}; "
                f"smallest: {show(ranked[: self.top_k])}",
                flush=True,
            )
