"""Whether a model's attention runs the fused flash kernel.

timm's ``Attention`` calls ``F.scaled_dot_product_attention`` when its ``fused_attn`` is on
(``cuda.fused_attention``, ``largebatch.backends.cuda``), and otherwise multiplies out
``softmax(q k^T) v`` itself; torch picks the kernel behind that call (flash,
memory-efficient, cuDNN or the math fallback) by dtype, head size and device. The check
runs one forward with only the flash backend allowed
(``torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)``), which raises where flash
cannot run, and counts the flash kernel's calls: the attention is fused exactly when every
attention module has ``fused_attn`` on and each called the flash kernel once. Habana's
equivalent is its ``FusedSDPA`` (not checked here).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

FLASH_OPS = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu")


@dataclasses.dataclass(frozen=True)
class AttentionCheck:
    """What ``check_flash_attention`` found.

    Attributes:
        modules: the model's attention modules (those with timm's ``fused_attn``).
        fused: how many of them have ``fused_attn`` on.
        flash_calls: flash kernel calls in the forward.
        error: the forward's error with only the flash backend allowed (first line), or None.
    """

    modules: int
    fused: int
    flash_calls: int
    error: str | None

    @property
    def ok(self) -> bool:
        """Every attention module ran the flash kernel, once."""
        return self.error is None and self.modules > 0 and self.fused == self.modules == self.flash_calls

    def describe(self) -> str:
        """One line: the verdict and the counts."""
        verdict = "yes" if self.ok else "no"
        why = f"; the forward failed: {self.error}" if self.error else ""
        return (
            f"flash attention: {verdict} ({self.modules} attention modules, {self.fused} with fused_attn on, "
            f"{self.flash_calls} flash kernel calls in one forward with only the flash backend allowed{why})"
        )


class _FlashCalls(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.overloadpacket.__name__ in FLASH_OPS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def check_flash_attention(model: torch.nn.Module, images: torch.Tensor) -> AttentionCheck:
    """Run one forward of ``model`` on ``images`` (under the caller's autocast, without
    gradients) with only the flash backend allowed, counting the flash kernel's calls.

    Args:
        model: a timm vision transformer (or any model whose attention modules carry ``fused_attn``).
        images: one batch on the model's device.

    Returns:
        The counts and, when the forward raised, its error (flash cannot run there).
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    flags = [bool(m.fused_attn) for m in model.modules() if hasattr(m, "fused_attn")]
    error = None
    with _FlashCalls() as calls, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # torch says why a kernel is not used in warnings
        try:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.no_grad():
                model(images)
        except RuntimeError as exc:  # "No available kernel": flash cannot run for this dtype, shape or device
            reasons = dict.fromkeys(str(w.message).split(" (Triggered internally")[0] for w in caught)
            error = "; ".join([str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__, *reasons])
    return AttentionCheck(len(flags), sum(flags), calls.count, error)
