"""Stand-in for ``hpex.normalization.FusedClipNorm``: records; clips with torch on the CPU."""

import torch

from habana_frameworks._record import record


class FusedClipNorm:
    def __init__(self, parameters, max_norm):
        self.max_norm = max_norm
        record("FusedClipNorm", max_norm=max_norm)

    def clip_norm(self, parameters):
        record("FusedClipNorm.clip_norm")
        return torch.nn.utils.clip_grad_norm_(list(parameters), self.max_norm)
