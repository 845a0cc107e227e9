"""The gradient noise scale B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018).

"An Empirical Model of Large-Batch Training" (arXiv:1812.06162) predicts the critical
batch size, beyond which a larger batch no longer cuts the steps to a given loss in
proportion, from the noise scale ``B_simple = tr(Sigma) / |G|^2``: the per-sample
gradient covariance's trace over the true gradient's squared norm. Its Appendix A
estimates both, without bias, from the squared norms of gradients measured at two batch
sizes ``B_small < B_big``: since ``E|g_B|^2 = |G|^2 + tr(Sigma) / B``,

    |G|^2     ~ (B_big |g_big|^2 - B_small |g_small|^2) / (B_big - B_small)
    tr(Sigma) ~ (|g_small|^2 - |g_big|^2) / (1 / B_small - 1 / B_big)

This hook uses the two gradients every accumulating step already has:

* ``g_small``: the first micro-batch's gradient on each rank, read right after its
  backward (``after_backward`` of micro-batch 0), before any other micro-batch is added
  and before any synchronisation (DDP does not synchronise inside the accumulation
  window). ``B_small`` is the micro-batch size. With several ranks the estimate uses the
  mean of the ranks' ``|g_small|^2`` (one all-reduce of one number per step). Under
  ``dist.strategy`` fsdp/hsdp a gradient exists only once reduced, so the hook asks the
  engine for one more reduce-scatter, after the first micro-batch
  (``state.request_first_micro_sync()``): ``g_small`` is then the ranks' mean first micro-batch
  gradient and ``B_small`` the micro-batch size x world size (the cost: one more
  gradient reduction per step).
* ``g_big``: the step's complete gradient, accumulated over the window and averaged
  over ranks, unscaled and before clipping (``before_optimizer_step``, the norms
  ``state.compute_grad_norms()`` computes for clipping and logging anyway). ``B_big`` is
  the step's global batch: micro-batch x window x world size.

Both are corrected for the engine's loss weight (``1 / window``) and the fp16 grad
scaler's scale. The two estimates are smoothed separately with exponential moving
averages (``beta``, bias-corrected as Adam's moments), as the paper advises, and their
ratio is B_simple. Logged on logging steps: ``noise_scale/grad_sq``,
``noise_scale/trace_sigma`` and ``noise_scale/b_simple`` (NaN until the smoothed
``|G|^2`` is positive; single-step estimates are noisy and may be negative).

Unavailable, a ``UserError`` at the start, when ``B_big / B_small`` is below
``min_ratio`` (default 2; at 1, accumulation 1 with micro-batch = global batch / world
size, the first micro-batch's gradient is the step's). The estimator's variance falls as
the two batch sizes move apart: ``min_ratio=8`` asks for a micro-batch at most an eighth
of the step's batch, as the studies' runs use (``largebatch.study``). A step whose window
has a single micro-batch (a trailing partial window) is left out of the averages, as is
a step with non-finite gradients.

**At a fixed held-out loss** (``at_eval_loss``). B_simple grows as the loss falls, so values
read at the same step of two runs (at two batch sizes, or with two optimizers) are not
comparable. With ``at_eval_loss`` set, the first evaluation whose ``eval/loss`` is at or
below it adds the smoothed estimates of that moment to its own record:
``noise_scale/at_loss/b_simple``, ``.../grad_sq``, ``.../trace_sigma``, ``.../step`` and
``.../batch_ratio`` (``B_big / B_small``), once per run (kept in checkpoints).

**The adaptive batch's criterion.** With ``batch_schedule.type`` adaptive and criterion
``noise_scale``, each step hands its smoothed B_simple to the engine
(``state.current.criterion``), which compares it with the batch in force at each check
(``largebatch.batch_schedule``); the accumulation check above then applies to the
schedule's start batch, the smallest. (Under a ramp, steps whose window has a single
micro-batch are left out, as above.)

**AdaScale's gain.** With ``batch_schedule.lr_scaling = 'adascale'`` the hook hands its smoothed
B_simple to the batch controller after each step's estimate (and after a resume restores the
averages), and the next step's learning-rate multiplier is AdaScale's gain from it
(``largebatch.batch_schedule``); as it comes from the averages saved in checkpoints, a resumed
run takes the same rates. The cost: one host sync per step.

Cost: one ``torch._foreach_norm`` over the gradients per step (reading them once), no
host sync; measured in ``bench/hook_cost.py``. The smoothed values are saved in
checkpoints, so a resumed run continues the same averages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from largebatch.dist import all_reduce_sum
from largebatch.engine.hook import Hook, Priority
from largebatch.errors import UserError

if TYPE_CHECKING:
    import torch


class NoiseScaleHook(Hook):
    """Estimate |G|^2, tr(Sigma) and B_simple from the first micro-batch's gradient and the step's.

    Args:
        beta: EMA coefficient of the two estimates (0: no smoothing).
        min_ratio: the smallest ``B_big / B_small`` accepted (at least 2).
        at_eval_loss: record the estimates at the first evaluation whose ``eval/loss`` is
            at most this (None: off).
    """

    priority = Priority.ABOVE_NORMAL  # before clipping (NORMAL): the norms before clipping; before the sinks write an evaluation

    def __init__(
        self, beta: float = 0.99, min_ratio: int = 2, at_eval_loss: float | None = None, priority: int | str | None = None
    ) -> None:
        super().__init__(priority)
        if not 0 <= beta < 1:
            raise ValueError(f"beta must be in [0, 1), got {beta}")
        if min_ratio < 2:
            raise ValueError(f"min_ratio must be at least 2, got {min_ratio}")
        self.beta = float(beta)
        self.min_ratio = int(min_ratio)
        self.at_eval_loss = None if at_eval_loss is None else float(at_eval_loss)
        self.at_loss: dict[str, float] | None = None  # what was recorded at at_eval_loss
        # sums (|G|^2, tr(Sigma), weight): the averages are the first two over the third,
        # which is 1 - beta^n after n finite steps (Adam's bias correction)
        self._ema: torch.Tensor | None = None
        self._loaded: dict[str, Any] | None = None
        self._small_sq: torch.Tensor | None = None
        self._b_small = 0
        self._sharded = False

    def before_run(self, state) -> None:
        # Sharded gradients exist only once reduced: ask for a reduction after the first
        # micro-batch too, so g_small is the ranks' mean first micro-batch gradient.
        self._sharded = state.run.sharded
        batches = state.run.batch.schedule
        # the adaptive batch needs the estimate from its start, its smallest batch; otherwise the config's batch
        checked = batches.batches[0] if batches.type == "adaptive" else batches.reference_batch
        accumulation, world = batches.accumulation(checked), state.run.world_size
        ratio = accumulation * (1 if self._sharded else world)
        if accumulation < 2 or ratio < self.min_ratio:
            cfg = state.run.config
            needed = max(2, self.min_ratio if self._sharded else -(-self.min_ratio // world))  # the accumulation it takes
            largest = checked // (world * needed)
            same = (
                "which are the same with accumulation 1"
                if accumulation < 2
                else f"B_big / B_small = {ratio}, below min_ratio {self.min_ratio}"
            )
            raise UserError(
                f"the noise_scale hook compares the first micro-batch's gradient with the step's, {same} (micro_batch_size "
                f"{cfg.micro_batch_size} x {world} rank(s), {'batch_schedule.start_batch_size' if checked != batches.reference_batch else 'global_batch_size'} "
                f"{checked}); set micro_batch_size "
                f"to at most {max(largest, 1)}, or drop the hook",
                key="hooks",
            )
        if self._sharded:
            state.request_first_micro_sync()
        import torch  # here, not at the top: loading the hook's class (checking a config) imports no torch

        self._ema = torch.zeros(3, dtype=torch.float64, device=state.run.backend.device)
        if self._loaded is not None:
            self._ema.copy_(torch.tensor(self._loaded["ema"], dtype=torch.float64))
        self._publish(state)

    def before_step(self, state) -> None:
        self._small_sq = None

    def after_backward(self, state) -> None:
        from largebatch import dtensors
        from largebatch.engine.accumulation import micro_loss_weight

        if state.current.micro_in_window != 0 or state.current.window_size < 2:
            return
        grads = [p.grad for p in state.run.model.parameters() if p.grad is not None]
        if not grads:
            return
        factor = 1.0 / micro_loss_weight(state.current.window_size)
        sq = dtensors.grad_norms(grads).double().square().sum() * factor**2
        scale = getattr(state.run.scaler, "_scale", None) if state.run.scaler is not None else None
        if scale is not None:
            sq = sq / scale.double().square().reshape(())
        self._small_sq = sq
        self._b_small = state.current.batch.images.shape[0] * (state.run.world_size if self._sharded else 1)

    def before_optimizer_step(self, state) -> None:
        self._estimate(state)
        if state.run.batch.schedule.type == "adaptive":
            grad_sq, trace = self._averages()
            state.current.criterion = _ratio(trace, grad_sq)  # the adaptive batch's criterion: the smoothed B_simple
        self._publish(state)

    def _publish(self, state) -> None:
        """``lr_scaling = 'adascale'``: hand the smoothed B_simple to the batch controller, which
        sets the next step's learning rate from it (one host sync per step)."""
        if state.run.batch.schedule.lr_rule == "adascale":
            state.run.batch.b_simple = self.estimates()["b_simple"]

    def _estimate(self, state) -> None:
        import torch

        if self._small_sq is None:
            return
        big_sq = state.compute_grad_norms().total.double().square()
        small_sq = self._small_sq
        if state.run.world_size > 1 and not self._sharded:
            small_sq = all_reduce_sum(small_sq.reshape(1).clone())[0] / state.run.world_size
        b_small = float(self._b_small)
        b_big = b_small * state.current.window_size * (1 if self._sharded else state.run.world_size)
        grad_sq = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
        trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
        estimate = torch.stack([grad_sq, trace, torch.ones_like(grad_sq)]).to(self._ema.device)
        updated = self.beta * self._ema + (1.0 - self.beta) * estimate
        self._ema = torch.where(torch.isfinite(estimate).all(), updated, self._ema)  # no host sync

    def _averages(self) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        grad_sq, trace, weight = self._ema.unbind()
        weight = torch.where(weight > 0, weight, torch.ones_like(weight))
        return grad_sq / weight, trace / weight

    def after_step(self, state) -> None:
        if not state.is_log_step or self._ema is None:
            return
        grad_sq, trace = self._averages()
        state.current.metrics["noise_scale/grad_sq"] = grad_sq
        state.current.metrics["noise_scale/trace_sigma"] = trace
        state.current.metrics["noise_scale/b_simple"] = _ratio(trace, grad_sq)

    def after_eval(self, state) -> None:
        loss = state.eval_metrics.get("eval/loss")
        if self.at_eval_loss is None or self.at_loss is not None or loss is None or not float(loss) <= self.at_eval_loss:
            return
        self.at_loss = {**self.estimates(), "step": float(state.step), "batch_ratio": self._ratio(state)}
        state.add_eval_metrics({f"noise_scale/at_loss/{k}": v for k, v in self.at_loss.items()})

    def _ratio(self, state) -> float:
        batches = state.run.batch.schedule
        return float(batches.accumulation(state.run.batch.batch) * (1 if self._sharded else state.run.world_size))

    def estimates(self) -> dict[str, float]:
        """The current bias-corrected averages as floats (one host sync): grad_sq,
        trace_sigma, b_simple."""
        if self._ema is None or float(self._ema[2]) == 0:
            return {"grad_sq": float("nan"), "trace_sigma": float("nan"), "b_simple": float("nan")}
        grad_sq, trace = self._averages()
        return {"grad_sq": float(grad_sq), "trace_sigma": float(trace), "b_simple": float(_ratio(trace, grad_sq))}

    def state_dict(self) -> dict[str, Any]:
        return {"ema": self._ema.tolist() if self._ema is not None else [0.0, 0.0, 0.0], "beta": self.beta, "at_loss": self.at_loss}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._loaded = dict(state)
        self.at_loss = state.get("at_loss")
        if self._ema is not None:
            import torch

            self._ema.copy_(torch.tensor(state["ema"], dtype=torch.float64))


def _ratio(trace: torch.Tensor, grad_sq: torch.Tensor) -> torch.Tensor:
    """B_simple, NaN while the averaged |G|^2 is not positive."""
    import torch

    return torch.where(grad_sq > 0, trace / grad_sq, torch.full_like(grad_sq, float("nan")))
