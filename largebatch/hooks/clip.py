"""Clip the global gradient norm, once per optimizer step, after unscaling.

Registered by the engine's launcher when ``clip_grad_norm`` is set (0 or None: off). It
runs in ``before_optimizer_step``, where gradients are complete (all-reduced by DDP and
unscaled by the grad scaler), so the norm is the norm of the true global-batch gradient.
Hooks with a lower priority number see the gradient before clipping; higher, after.
The pre-clip norm is kept in ``state.grad_norm`` as a tensor (no host sync). The clipping
itself is the backend's ``clip_grad_norm`` (torch's foreach clip, or Habana's
``FusedClipNorm`` on an HPU with ``hpu.fused_clip_norm``).
"""

from __future__ import annotations

from largebatch.engine.hook import Hook, Priority


class ClipGradNormHook(Hook):
    """Clip gradients to a global L2 norm of ``max_norm``.

    Args:
        max_norm: the largest global gradient norm allowed.
    """

    priority = Priority.NORMAL

    def __init__(self, max_norm: float, priority: int | str | None = None) -> None:
        super().__init__(priority)
        self.max_norm = float(max_norm)

    def before_optimizer_step(self, state) -> None:
        params = [p for p in state.model.parameters() if p.grad is not None]
        state.grad_norm = state.backend.clip_grad_norm(params, self.max_norm)
