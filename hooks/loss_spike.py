"""Stop the run when the step loss jumps above ``factor`` x its running mean, or is not finite.

In a config::

    hooks = [dict(type='hooks/loss_spike.py:LossSpikeHook', factor=4.0)]

The README's first-hook example, word for word below the docstring. The running mean
is an exponential moving average (weight 0.1 for the newest step) that starts after
``warmup`` steps; it is checkpointed, so a resumed run keeps it. The stop reason names
the step (numbered as in ``metrics.jsonl``) and the two losses.
"""

import math

from largebatch.engine.hook import Hook, Priority


class LossSpikeHook(Hook):
    priority = Priority.LOW  # 0-100, lower runs first

    def __init__(self, factor: float = 3.0, warmup: int = 10):
        super().__init__()
        self.factor, self.warmup, self.mean = factor, warmup, None

    def after_step(self, state):
        loss = state.current.step_loss.item()  # one host sync per step
        spike = self.mean is not None and state.step > self.warmup and loss > self.factor * self.mean
        if spike or not math.isfinite(loss):
            state.request_stop(f"loss {loss:.4g} at step {state.step}, running mean {self.mean}")
        self.mean = loss if self.mean is None else 0.9 * self.mean + 0.1 * loss

    def state_dict(self):  # saved in checkpoints under the class name (#2, #3 for more of one class)
        return {"mean": self.mean}

    def load_state_dict(self, state):
        self.mean = state["mean"]
