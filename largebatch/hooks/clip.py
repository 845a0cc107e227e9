"""Clip the global gradient norm, once per optimizer step, after unscaling.

Registered by the engine's launcher when ``clip_grad_norm`` is set (0 or None: off). It
runs in ``before_optimizer_step``, where gradients are complete (all-reduced by DDP and
unscaled by the grad scaler), so the norm is the norm of the true global-batch gradient.
Hooks with a lower priority number see the gradient before clipping; higher, after.
The pre-clip norm is kept in ``state.grad_norm`` as a tensor (no host sync). The
per-parameter norms come from ``state.compute_grad_norms()``, the one norm computation of
the step that the NaN guard and the gradient-norm hook share; the clipping factor is
kept beside them (``state.grad_norms.clip_coef``) so post-clip norms need no second pass.
A step the NaN guard skips is not clipped. The clipping itself is the backend's ``clip_grad_norm`` (torch's foreach clip, or Habana's
``FusedClipNorm`` on an HPU with ``hpu.fused_clip_norm``).
"""

from __future__ import annotations

from largebatch.backends.base import clip_coefficient
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
        if state.skip_step:
            return
        norms = state.compute_grad_norms()
        state.grad_norm = state.backend.clip_grad_norm(norms.params, self.max_norm, norms.norms)
        norms.clip_coef = clip_coefficient(state.grad_norm, self.max_norm)
