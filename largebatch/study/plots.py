"""A study's three figures (matplotlib, written as PNG files), each drawn for every target
of the study (one ``Series`` per target: the colour names the optimizer, the marker and
the line style the target, so the curves of a higher target stand beside those of a lower
one and the critical batch's growth shows as the bend moving right):

* ``steps_vs_batch.png``: steps to target against the global batch, log-log, per
  optimizer: the median over seeds with the seeds' range, the censored fit
  S_min (1 + B_crit / B) (solid; dashed and dash-dot for further targets) and its perfect-scaling line E_min / B up to B_crit
  (dotted); a cell
  without a median (most re-runs did not reach the target) is an open triangle at its
  budget (the steps are above it);
* ``steps_vs_samples.png``: the same cells as steps against samples (S against E = S B),
  with the fitted curve (S / S_min - 1)(E / E_min - 1) = 1: the trade-off between time and
  compute;
* ``noise_scale.png``: B_simple from the ``noise_scale`` hook at the study's fixed held-out
  loss, per cell, beside each optimizer's fitted B_crit with its bootstrap interval.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from largebatch.study.analysis import CellResult
from largebatch.study.statistics import CellStats, OptimizerStats


class Series(NamedTuple):
    """One target's cells and fits; ``name`` labels them in a legend beside the optimizer
    (empty: the study's only target, the legend names the optimizer alone)."""

    name: str
    cells: list[CellResult]
    fits: list[OptimizerStats]


MARKERS = ("o", "s", "D", "v")  # by target; the open triangle ^ is "not reached"
FITS = ("-", "--", "-.", (0, (5, 1, 1, 1)))  # the fitted curve, by target


def _styles(series: Sequence[Series]):
    """(index, series, marker, fit line style) per target, the targets in the study's order."""
    return [(i, s, MARKERS[i % len(MARKERS)], FITS[i % len(FITS)]) for i, s in enumerate(series)]


def _label(series: Series, optimizer: str, what: str = "") -> str:
    return f"{optimizer}{what}" + (f" to {series.name}" if series.name else "")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(fig, ax, path: pathlib.Path, drawn: bool, batches: list[int] | None = None) -> pathlib.Path:
    """Log axes (base 2 with the batches as ticks when given) when something was drawn (an
    empty log axis cannot be laid out), else a note; then save."""
    if drawn:
        if batches:
            ax.set_xscale("log", base=2)
            ax.set_xticks(batches, [str(b) for b in batches])
        else:
            ax.set_xscale("log")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "nothing to show yet: no re-run has finished", ha="center", va="center", transform=ax.transAxes)
    ax.grid(alpha=0.3, which="both")
    return save(fig, path)


def save(fig, path: pathlib.Path) -> pathlib.Path:
    """Lay out and write the figure to ``path`` whole or not at all (workers may write at once); close it."""
    fig.tight_layout()
    temporary = path.with_name(f".{path.stem}.{os.getpid()}{path.suffix}")
    fig.savefig(temporary, dpi=110)
    _pyplot().close(fig)
    os.replace(temporary, path)
    return path


def steps_vs_batch(series: Sequence[Series], label: str, path: pathlib.Path) -> pathlib.Path:
    fig, ax = _pyplot().subplots(figsize=(7, 5))
    batches = sorted({c.batch for s in series for c in s.cells})
    grid = np.geomspace(min(batches), max(batches), 200)
    drawn = False
    for _, one, marker, line in _styles(series):
        for i, result in enumerate(one.fits):
            color = f"C{i}"
            mine = [c.stats for c in one.cells if c.optimizer == result.optimizer]
            done = [c for c in mine if c.median is not None]
            if done:
                lows = [c.median - (c.low or c.median) for c in done]
                highs = [(c.high - c.median) if c.high is not None else 0.0 for c in done]
                ax.errorbar(
                    [c.batch for c in done],
                    [c.median for c in done],
                    yerr=[lows, highs],
                    fmt=marker,
                    color=color,
                    capsize=3,
                    label=_label(one, result.optimizer),
                )
            bounds = [c for c in mine if c.median is None and c.budget]
            if bounds:
                ax.plot([c.batch for c in bounds], [c.budget for c in bounds], "^", mfc="white", color=color)
            if result.fit is not None:
                ax.plot(grid, [result.fit.steps(b) for b in grid], linestyle=line, color=color, alpha=0.8)
                near = grid[grid <= result.fit.b_crit]  # where perfect scaling is within 2x of the fit: the axis stays on the data
                ax.plot(near, result.fit.e_min / near, ":", color=color, alpha=0.6)
            drawn = drawn or bool(done or bounds)
    ax.set_xlabel("global batch size")
    ax.set_ylabel(f"steps to {label}")
    perfect = "dotted: its perfect scaling E_min / B, up to B_crit"
    if len(series) == 1:
        title = f"steps to target: median and range over seeds\n(solid: censored fit; {perfect}; open triangle: not reached in budget)"
    else:
        lines = ", ".join(f"{s.name} {_line_name(line)}" for _, s, _, line in _styles(series))
        title = f"steps to target: median and range over seeds (marker by target)\ncensored fit by target: {lines}\n{perfect}; open triangle: not reached in budget"
    ax.set_title(title, fontsize=9)
    return _finish(fig, ax, path, drawn, batches)


def _line_name(style) -> str:
    return {"-": "solid", "--": "dashed", "-.": "dash-dot"}.get(style, "dash-dot-dot") if isinstance(style, str) else "dash-dot-dot"


def steps_vs_samples(series: Sequence[Series], label: str, path: pathlib.Path) -> pathlib.Path:
    fig, ax = _pyplot().subplots(figsize=(7, 5))
    drawn = False
    for _, one, marker, line in _styles(series):
        for i, result in enumerate(one.fits):
            color = f"C{i}"
            done = [c.stats for c in one.cells if c.optimizer == result.optimizer and c.stats.median is not None]
            if not done:
                continue
            drawn = True
            ax.plot(
                [c.median * c.batch for c in done],
                [c.median for c in done],
                marker=marker,
                linestyle=line,
                color=color,
                label=_label(one, result.optimizer),
                alpha=0.9,
            )
            for c in done:
                ax.annotate(str(c.batch), (c.median * c.batch, c.median), fontsize=7, xytext=(3, 3), textcoords="offset points")
            if result.fit is not None:
                batches = np.geomspace(min(c.batch for c in one.cells) / 4, max(c.batch for c in one.cells) * 4, 200)
                steps = [result.fit.steps(b) for b in batches]
                ax.plot([s * b for s, b in zip(steps, batches, strict=True)], steps, linestyle=line, color=color, alpha=0.4)
    ax.set_xlabel("samples to target (steps x batch)")
    ax.set_ylabel(f"steps to {label}")
    ax.set_title("the steps-samples trade-off (medians over seeds; lines: the fit)", fontsize=9)
    return _finish(fig, ax, path, drawn)


def noise_scale(series: Sequence[Series], loss: float, path: pathlib.Path) -> pathlib.Path:
    fig, ax = _pyplot().subplots(figsize=(7, 4.5))
    batches = sorted({c.batch for s in series for c in s.cells})
    drawn = False
    for _, one, marker, line in _styles(series):
        for i, result in enumerate(one.fits):
            color = f"C{i}"
            measured: list[CellStats] = [
                c.stats
                for c in one.cells
                if c.optimizer == result.optimizer and c.stats.b_simple is not None and c.stats.b_simple_range is not None
            ]
            if measured:
                drawn = True
                spread = [[c.b_simple - c.b_simple_range[0] for c in measured], [c.b_simple_range[1] - c.b_simple for c in measured]]
                ax.errorbar(
                    [c.batch for c in measured],
                    [c.b_simple for c in measured],
                    yerr=spread,
                    fmt="s" if len(series) == 1 else marker,
                    color=color,
                    capsize=3,
                    label=_label(one, result.optimizer, ": B_simple"),
                )
            if result.fit is not None and not result.fit.bounded:
                drawn = True
                ax.axhline(
                    result.fit.b_crit,
                    color=color,
                    linestyle="--" if len(series) == 1 else line,
                    alpha=0.8,
                    label=_label(one, result.optimizer, ": fitted B_crit"),
                )
                if result.intervals:
                    band = result.intervals["b_crit"]
                    ax.axhspan(band.low, band.high, color=color, alpha=0.1)
    ax.set_xlabel("global batch of the run that measured it")
    ax.set_ylabel("batch size")
    ax.set_title(f"B_simple at held-out loss {loss:g} (median, range over seeds) beside the fitted B_crit (95% band)", fontsize=9)
    return _finish(fig, ax, path, drawn, batches)
