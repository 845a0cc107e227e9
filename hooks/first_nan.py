"""Find the first module whose output or gradient goes non-finite, save the batch, stop.

In a config::

    hooks = [dict(type='hooks/first_nan.py:FirstNaNHook')]

Every step's non-finite check (the config's ``nan_guard`` section) stops a step whose
gradients are not finite and names the first such parameter; this hook goes further, for
the run you are debugging: it finds the module where the first NaN or inf appeared and keeps the batch.

After every micro-batch's backward pass the hook checks that the micro-batch's loss and
the accumulated gradients are finite (one batched ``torch._foreach_norm`` and one host
sync per micro-batch: a debugging cost, not for production runs; with fp16 and a
GradScaler only the loss, since overflowing scaled gradients are routine). On the first
non-finite value it re-runs that micro-batch with a forward hook and a full backward
hook on every module and a gradient hook on every parameter, and names:

* the input batch, when the images themselves are not finite;
* else the first module (in execution order, so the innermost) whose forward output is
  not finite;
* else ``loss``, when only the loss is;
* else the first module whose backward turns a finite gradient at its output into a
  non-finite gradient at its input (inner modules are reached before the blocks that
  hold them), or the first parameter whose gradient is not finite, in the order
  backward reaches them (from the loss towards the input).

It writes to ``first_nan/`` in the run directory:

* ``report.json``: ``step`` (numbered as in ``metrics.jsonl``: 1 is the first
  optimizer step), ``micro_in_window`` (0-based), ``micro_step`` (forward/backward
  passes so far on this rank, this one included), ``module``, ``where``
  (``input``, ``forward``, ``loss``, ``backward``, or ``not reproduced`` when the
  re-run stays finite), the loss, and the parameter names that hold non-finite values;
* ``batch.pt``: the micro-batch (``images``, ``targets``, ``labels``) as fed to the model,
  mixup applied, on the CPU;
* ``model.pt`` (``save_weights=True``): the weights that produced it;

then stops the run at once (before the optimizer step, so the saved weights are the
ones that produced it) with one ``error:`` line naming the module and step. Under
DDP a rank that finds a non-finite loss on a micro-batch before the window's last
stops alone and the others end at the collective timeout; gradients of the last
micro-batch are all-reduced, so every rank finds those. The re-run is in train mode:
with dropout it draws new masks, which is why the original micro-batch is saved as it
was.
"""

from __future__ import annotations

import json
import warnings

import torch

from largebatch.engine.hook import Hook, Priority
from largebatch.errors import UserError


class NonFiniteTraining(UserError):
    """Training produced a NaN or an infinity; the message says where."""


def _finite(value) -> bool:
    tensors = [t for t in (value if isinstance(value, (tuple, list)) else [value]) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return all(bool(torch.isfinite(t).all()) for t in tensors)


class FirstNaNHook(Hook):
    """Locate the first non-finite forward output or gradient and stop.

    Args:
        directory: the folder in the run directory for the report and the batch.
        save_weights: also save the model's weights (``model.pt``).
    """

    priority = Priority.VERY_HIGH

    def __init__(self, directory: str = "first_nan", save_weights: bool = True, priority: int | str | None = None) -> None:
        super().__init__(priority)
        self.directory = directory
        self.save_weights = save_weights
        self.report: dict = {}

    def after_backward(self, state) -> None:
        # Under fp16 a GradScaler's overflowing gradients are routine (it skips the step and
        # lowers the scale), so then only the loss is checked.
        grads = [] if state.run.scaler is not None else [p.grad for p in state.run.model.parameters() if p.grad is not None]
        check = state.current.loss.detach().float().reshape(1)
        if grads:
            check = torch.cat([check, torch.stack(torch._foreach_norm(grads)).float().sum().reshape(1)])
        if bool(torch.isfinite(check).all()):
            return
        self.report = self._diagnose(state)
        self.report["loss"] = float(state.current.loss.detach().float())
        if state.run.is_main:
            self._save(state)
        raise NonFiniteTraining(
            f"first non-finite value at step {self.report['step']}, micro-batch {self.report['micro_in_window']}: "
            f"{self.report['where']} of {self.report['module']}; batch and report in {state.run.run_dir / self.directory}"
        )

    def _diagnose(self, state) -> dict:
        model, batch = state.run.model, state.current.batch
        report = {"step": state.step + 1, "micro_in_window": state.current.micro_in_window, "micro_step": state.micro_step}
        report["nonfinite_parameters"] = [n for n, p in model.named_parameters() if not torch.isfinite(p.detach()).all()]
        if not _finite(batch.images):
            return {**report, "where": "input", "module": "input batch"}
        names = {module: name or type(model).__name__ for name, module in model.named_modules()}
        forward_bad: list[str] = []
        backward_bad: list[str] = []

        def on_output(module, inputs, output):
            if not forward_bad and not _finite(output):
                forward_bad.append(names[module])

        def on_backward(module, grad_input, grad_output):
            if not backward_bad and _finite(grad_output) and not _finite(grad_input):
                backward_bad.append(names[module])

        def on_param_grad(name):
            return lambda grad: backward_bad.append(name) if not backward_bad and not _finite(grad) else None

        handles = [m.register_forward_hook(on_output) for m in model.modules()]
        handles += [m.register_full_backward_hook(on_backward) for m in model.modules()]
        handles += [p.register_hook(on_param_grad(n)) for n, p in model.named_parameters() if p.requires_grad]
        try:
            with torch.enable_grad(), state.run.backend.autocast(), warnings.catch_warnings():
                # the first module's inputs (the images) need no gradient; torch warns about it
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                loss = state.run.task.loss(state.run.task.forward(model, batch.images), batch)
                params = [p for p in model.parameters() if p.requires_grad]
                if not forward_bad and _finite(loss):
                    torch.autograd.grad(loss, params, allow_unused=True)
                elif not forward_bad:
                    return {**report, "where": "loss", "module": "loss"}
        finally:
            for handle in handles:
                handle.remove()
        if forward_bad:
            return {**report, "where": "forward", "module": forward_bad[0]}
        if backward_bad:
            return {**report, "where": "backward", "module": backward_bad[0]}
        return {**report, "where": "not reproduced", "module": "none (the re-run stayed finite)"}

    def _save(self, state) -> None:
        out = state.run.run_dir / self.directory
        out.mkdir(parents=True, exist_ok=True)
        batch = state.current.batch
        torch.save(
            {"images": batch.images.detach().cpu(), "targets": batch.targets.detach().cpu(), "labels": batch.labels.cpu()}, out / "batch.pt"
        )
        if self.save_weights:
            torch.save({k: v.detach().cpu() for k, v in state.run.model.state_dict().items()}, out / "model.pt")
        (out / "report.json").write_text(json.dumps(self.report, indent=2) + "\n")
        print(f"first_nan: {self.report['where']} of {self.report['module']} at step {self.report['step']}; saved to {out}", flush=True)
