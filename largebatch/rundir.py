"""A run directory and the names of its files: every reader and writer goes through ``RunDir``.

::

    runs/<name>/
        config.yaml              the resolved config, and its numbers under derived:
        metrics.jsonl            one JSON object per logged step and per evaluation
        checkpoints/             step-<N>.pt (ddp) or step-<N>/ (fsdp, hsdp); latest
        model.safetensors        the final weights (timm loads them)
        model_<name>.safetensors an extra model's final weights (model_ema.safetensors)
        config.json              timm's config for those weights
        <curve>.png              largebatch plot's curves
        metrics.csv, tensorboard/, hook_times.json, ...   what optional hooks write

A ``RunDir`` is path-like (``run_dir / "notes.txt"``, ``open(run_dir)``), so a hook's own
file is ``state.run.run_dir / name``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import sys

from largebatch.errors import UserError, whole_number

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
LATEST = "latest"
WEIGHTS = "model.safetensors"
HUB_CONFIG = "config.json"


class _File:
    """A file (or folder) of a run directory, by its path inside it; read on a ``RunDir``."""

    def __init__(self, *parts: str, doc: str) -> None:
        self.parts, self.__doc__ = parts, doc

    def __get__(self, run: RunDir | None, owner: type) -> pathlib.Path:
        if run is None:
            raise AttributeError("a RunDir's file: read it on a run directory")
        return run.path.joinpath(*self.parts)


@dataclasses.dataclass(frozen=True, init=False)
class RunDir:
    """The files of one run directory.

    Attributes:
        path: the folder.
    """

    path: pathlib.Path

    def __init__(self, path: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "path", pathlib.Path(path))

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def __truediv__(self, name: str) -> pathlib.Path:
        return self.path / name

    @property
    def name(self) -> str:
        return self.path.name

    config = _File(CONFIG, doc="``config.yaml``: the resolved config, loadable as a config file.")
    metrics = _File(METRICS, doc="``metrics.jsonl``: one record per logged step and per evaluation.")
    checkpoints = _File(CHECKPOINTS, doc="The checkpoints' folder.")
    latest = _File(CHECKPOINTS, LATEST, doc="``checkpoints/latest``: a text file naming the newest checkpoint.")
    hub_config = _File(HUB_CONFIG, doc="``config.json``: timm's config for the final weights.")

    def checkpoint(self, step: int, *, sharded: bool = False) -> pathlib.Path:
        """Step ``step``'s checkpoint: ``step-<N>.pt``, or the folder ``step-<N>`` when sharded."""
        return self.checkpoints / (f"step-{step:08d}" if sharded else f"step-{step:08d}.pt")

    def weights(self, model: str | None = None) -> pathlib.Path:
        """The final weights: ``model.safetensors``, or ``model_<model>.safetensors`` for an
        extra model (``weights("ema")``)."""
        return self.path / (WEIGHTS if model is None else f"model_{model}.safetensors")

    def plot(self, stem: str) -> pathlib.Path:
        """A curve's PNG (``largebatch plot``)."""
        return self.path / f"{stem}.png"

    @property
    def finished(self) -> bool:
        """Whether the run wrote its final weights."""
        return self.weights().is_file()

    def extra_weights(self) -> list[pathlib.Path]:
        """The extra models' final weights, by name."""
        return sorted(self.path.glob("model_*.safetensors"))


def read_metric_lines(path: str | os.PathLike[str]) -> list[tuple[str, dict]]:
    """Each record of a ``metrics.jsonl`` with its line as written, in order; blank lines
    skipped. A final line cut short (a disk that filled, a run killed while writing: not
    JSON) is left out with a warning on stderr, so ``--resume auto``, ``export`` and
    ``plot`` go on with the records before it.

    Raises:
        UserError: any other line is not a JSON object whose ``step`` is a whole number
            (naming the file, the line and what it holds).
    """
    path = pathlib.Path(path)
    lines = path.read_text(errors="replace").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):
                print(f"warning: {path}: line {number}, the last, was cut short ({exc.msg}); it is left out", file=sys.stderr, flush=True)
                break
            raise UserError(
                f"line {number} is not JSON ({exc.msg}); it was edited or damaged: remove the line, or restore the file",
                path=str(path),
            ) from None
        step = record.get("step") if isinstance(record, dict) else None
        if not isinstance(record, dict) or whole_number(step) is None:
            shown = line if len(line) <= 60 else line[:57] + "..."
            raise UserError(
                f"line {number} is not a metrics record (a JSON object with a whole-number step), it holds {shown}; "
                "remove the line, or restore the file",
                path=str(path),
            )
        records.append((line, record))
    return records


def read_metrics(path: str | os.PathLike[str]) -> list[dict]:
    """The records of a ``metrics.jsonl`` (``read_metric_lines``, without the lines)."""
    return [record for _, record in read_metric_lines(path)]
