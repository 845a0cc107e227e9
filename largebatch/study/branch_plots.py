"""``critical_batch.png``: the critical batch against samples seen, CBS(t), from a study's
branches (``largebatch.study.branches``), with the seeds' range of critical k x B, the
run's batch, and B_simple from its ``noise_scale`` hook beside it."""

from __future__ import annotations

import pathlib

from largebatch.study.branches import Row
from largebatch.study.plots import _pyplot, save


def critical_batch(rows: list[Row], path: pathlib.Path) -> pathlib.Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    measured = [r for r in rows if r.critical is not None and r.critical.batch is not None]
    for bound in (False, True):
        chosen = [r for r in measured if r.critical.bound == bound]  # type: ignore[union-attr]
        if not chosen:
            continue
        x = [r.samples for r in chosen]
        y = [r.critical.batch for r in chosen]  # type: ignore[union-attr]
        seeds = [[b for b in r.critical.batch_by_seed.values() if b is not None] or [r.critical.batch] for r in chosen]  # type: ignore[union-attr]
        low = [max(0.0, b - min(s)) for b, s in zip(y, seeds, strict=True)]
        high = [max(0.0, max(s) - b) for b, s in zip(y, seeds, strict=True)]
        ax.errorbar(
            x,
            y,
            yerr=[low, high],
            fmt="^" if bound else "o-",
            color="C0",
            capsize=3,
            label="critical batch, at least (every k efficient)" if bound else "critical batch (mean over seeds; bars: each seed's)",
        )
    simple = [(r.samples, r.b_simple) for r in rows if r.b_simple is not None and r.b_simple > 0]
    if simple:
        ax.plot(*zip(*simple, strict=True), "s--", color="C1", label="B_simple (noise_scale hook)")
    if rows:
        ax.axhline(rows[0].base_batch, color="gray", linestyle=":", label=f"the run's batch {rows[0].base_batch}")
    if measured or simple:
        ax.set_yscale("log", base=2)
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "nothing to show yet: no checkpoint has all its branches", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("samples seen by the run at the checkpoint")
    ax.set_ylabel("global batch")
    ax.set_title("The critical batch along training")
    ax.grid(alpha=0.3, which="both")
    return save(fig, path)
