"""``arms.png``: steps to each target per arm of a study's ``arms`` section, every seed a
point beside its arm's median (``largebatch.study.arm_report``)."""

from __future__ import annotations

import pathlib
from typing import Any

from largebatch.study.plots import _pyplot, save


def steps_to_target(arms: list[dict[str, Any]], targets: list[str], split: str, path: pathlib.Path) -> pathlib.Path:
    """One column per arm, the targets side by side in it (colour); the seeds' steps as
    points, the median as a bar; a seed that did not reach a target is left out (the
    report's table counts them)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(arms) + 2), 4.5))
    width = 0.7 / max(len(targets), 1)
    drawn = False
    for t, target in enumerate(targets):
        for a, arm in enumerate(arms):
            x = a - 0.35 + width * (t + 0.5)
            steps = [v for v in arm["seeds_steps"][target] if v is not None]
            ax.plot([x] * len(steps), steps, "o", color=f"C{t}", alpha=0.7, label=target if a == 0 and steps else None)
            middle = arm["targets"][target]["steps"]["median"]
            if middle is not None:
                ax.plot([x - width / 2.5, x + width / 2.5], [middle, middle], "-", color=f"C{t}", linewidth=2)
            drawn = drawn or bool(steps)
    ax.set_xticks(range(len(arms)), [arm["label"] for arm in arms], rotation=20)
    if drawn:
        ax.set_yscale("log")
        ax.legend(fontsize=7, title=f"target ({split} split)", title_fontsize=7)
    else:
        ax.text(0.5, 0.5, "nothing to show yet: no arm reached a target", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel("optimizer steps to target (points: seeds; bar: median)")
    ax.set_title("Steps to target per recipe")
    ax.grid(alpha=0.3, which="both", axis="y")
    return save(fig, path)
