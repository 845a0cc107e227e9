"""How a study's reports write a number: the cells' report and the arms' share it."""

from __future__ import annotations

import math


def number_text(value: float | None, digits: int = 3) -> str:
    """``value`` with thousands separators from 100 up, ``digits`` significant digits below;
    ``-`` for None, inf or NaN."""
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.{digits}g}"
