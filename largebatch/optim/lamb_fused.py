"""LAMB's moments on accelerators: torch's fused Adam kernel over whole tensors.

On a GPU the step is bound by memory traffic, so what counts is how many times each
parameter-sized stream is read or written. Counting streams (reads + writes) per element:

* ``torch.optim.AdamW(fused=True)``, the floor: params, grads, both moments read, params
  and moments written: 7.
* LAMB on plain ``_foreach`` ops (``lamb._directions`` then the norms and the step): the
  moments' update, ``sqrt``, ``+ eps``, the division and ``+ wd * x`` are a pass each, about
  26 streams.
* this path: ``u = wd * x`` (2; a zero fill, 1, without coupled decay), torch's fused
  Adam kernel adding ``r = m_hat / (sqrt(v_hat) + eps)`` to ``u`` while it advances the
  moments (7), both norms in one ``_foreach_norm`` (2), the trust-ratio-scaled step (3):
  14, so about 2x the floor by traffic, against about 3.7x.

The kernel is what ``torch.optim.Adam(fused=True)`` runs (``torch._fused_adam_``), given
``u`` as its "parameter" and ``lr = -1`` so that it adds ``r``; bias correction comes from
a step-count tensor made on the device by a fill (inf when bias correction is off), so
nothing is copied from or read back to the host. Gradients to clip are scaled into new
tensors first (``.grad`` is left as it was).

Chosen by ``largebatch.optim.lamb.Lamb`` for buckets on ``FUSED_DEVICES`` whose tensors
``applies`` accepts and ``lamb_triton`` does not take (bfloat16 and float16 weights, no
Triton), FSDP2's local slices included; the CPU has its own path (``lamb_cpu``), other
devices the plain multi-tensor one. On an H200 it ran as a bench row (2.52x
``AdamW(fused=True)``'s step on ViT-B/16) and as the reference of the Triton kernel's
``gpu`` test; the tests run it on the CPU, where the same kernel exists, against the
paper's update.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

# Devices whose fused Adam kernel this path uses.
FUSED_DEVICES = ("cuda",)
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def applies(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor]) -> bool:
    """Whether a bucket (one device, dtype and step) takes this path: tensors on a device
    of ``FUSED_DEVICES``, one floating dtype the kernel handles, all contiguous."""
    first = params[0]
    if first.device.type not in FUSED_DEVICES or first.dtype not in _DTYPES or not hasattr(torch, "_fused_adam_"):
        return False
    tensors = [t for group in (params, grads, exp_avgs, exp_avg_sqs) for t in group]
    return all(t.dtype == first.dtype and t.is_contiguous() for t in tensors)


def directions(
    group: dict[str, Any],
    step: int,
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    clip: Tensor | None,
) -> tuple[list[Tensor], float]:
    """Advance the moments and return ``(us, decay)``: the update directions
    ``u = r + wd * x`` (``u = r`` with decoupled decay) and the factor decoupled weight
    decay multiplies the weights by (1 without it), as ``lamb._directions`` with scale 1.

    Args:
        group: the parameter group (betas, eps, weight decay, bias correction, lr).
        step: the step count of the bucket, from 1.
        params, grads, exp_avgs, exp_avg_sqs: the bucket's tensors (``applies`` holds).
        clip: the gradients' clipping coefficient (a 0-dim tensor on the device), or None.
    """
    beta1, beta2 = group["betas"]
    lr, wd, decoupled = group["lr"], group["weight_decay"], group["decoupled_weight_decay"]
    if clip is not None:
        grads = torch._foreach_mul(grads, clip)
    if not decoupled and wd != 0:
        us = torch._foreach_mul(params, wd)
    else:
        us = [torch.empty_like(p) for p in params]
        torch._foreach_zero_(us)
    count = float(step) if group["bias_correction"] else math.inf  # beta^inf = 0: no correction
    steps = [torch.full((), count, dtype=torch.float32, device=params[0].device)] * len(us)
    torch._fused_adam_(
        us, grads, exp_avgs, exp_avg_sqs, [], steps,
        lr=-1.0, beta1=beta1, beta2=beta2, weight_decay=0.0, eps=group["eps"], amsgrad=False, maximize=False,
    )  # fmt: skip
    return us, 1 - lr * wd if decoupled else 1.0
