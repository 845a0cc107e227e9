"""Stand-in for ``hpex.optimizers.FusedLamb``: records its arguments and steps; updates nothing."""

import torch

from habana_frameworks._record import record


class FusedLamb(torch.optim.Optimizer):
    def __init__(
        self,
        params,
        lr=1e-3,
        bias_correction=True,
        betas=(0.9, 0.999),
        eps=1e-6,
        weight_decay=0.01,
        amsgrad=False,
        adam_w_mode=True,
        grad_averaging=True,
        set_grad_none=True,
        max_grad_norm=1.0,
        use_lamb=False,
    ):
        defaults = dict(
            lr=lr, bias_correction=bias_correction, betas=betas, eps=eps, weight_decay=weight_decay, max_grad_norm=max_grad_norm
        )
        super().__init__(params, defaults)
        record(
            "FusedLamb",
            lr=lr,
            bias_correction=bias_correction,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            adam_w_mode=adam_w_mode,
            max_grad_norm=max_grad_norm,
            use_lamb=use_lamb,
            groups=len(self.param_groups),
        )

    def zero_grad(self):  # the signature some bridge releases have: no set_to_none
        record("FusedLamb.zero_grad")

    def step(self, closure=None):
        record("optimizer.step")
