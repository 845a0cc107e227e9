"""Names of an optimizer's parameter groups, shared by the per-group hooks."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def group_names(optimizer: torch.optim.Optimizer) -> list[str]:
    """Each group's ``name`` (``build_param_groups`` sets ``decay`` / ``no_decay`` /
    ``layer<i>_...``), or ``group<i>`` for an unnamed one; the same keys LAMB's statistics use."""
    return [str(group.get("name", f"group{i}")) for i, group in enumerate(optimizer.param_groups)]
