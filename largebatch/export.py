"""Outputs the ecosystem loads: a folder timm (and the Hugging Face Hub) can read.

A finished run's directory holds ``model.safetensors`` (the final weights, gathered when
they were sharded) and, written beside it, timm's ``config.json``: the architecture, the
model's constructor arguments, ``num_classes``, the class names when the dataset's
``dataset.json`` lists them, and the ``pretrained_cfg`` preprocessing (input size, mean
and std, interpolation, crop fraction and mode) that evaluation used. So both

    timm.create_model('local-dir:RUN_DIR', pretrained=True)
    timm.create_model('local-dir:EXPORT_DIR', pretrained=True)

return the trained model, and ``timm.data.resolve_data_config({}, model=model)`` gives
its evaluation transform. ``config.json`` is written by timm's own
``save_config_for_hf``, so the layout is the one timm's Hub loader reads; fields that
describe timm's published weights rather than these (their tag, licence, Hub id, URL) are
left out. ``largebatch export RUN_DIR --out DIR`` writes the two files into a folder of
their own, ready for ``huggingface_hub.upload_folder(repo_id=..., folder_path=DIR)``.
A run that kept a model EMA (``ema.decay``) also holds ``model_ema.safetensors``;
``largebatch export RUN_DIR --out DIR --ema`` writes those weights, as
``model.safetensors``, into a folder of their own.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
from typing import Any

import torch

from largebatch.config import Config, resolve_saved_config
from largebatch.errors import UserError
from largebatch.rundir import HUB_CONFIG, WEIGHTS, RunDir, read_metrics
from largebatch.safe_load import read_safetensors

# The oldest timm whose ``save_config_for_hf`` takes ``data_config`` and records the
# model's constructor arguments: ``config.json`` needs both (setup.cfg requires it too).
TIMM_MINIMUM = "1.0.31"
_NOT_OURS = ("tag", "license", "hf_hub_id", "hf_hub_filename", "url", "file", "source", "paper_ids", "notes", "origin_url")


def version_tuple(version: str) -> tuple[int, ...]:
    """``"1.0.31"`` -> ``(1, 0, 31)``; a suffix (``.dev0``, ``+local``, ``rc1``) is ignored."""
    out = []
    for part in version.split("+")[0].split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        out.append(int(digits.group()))
        if digits.group() != part:
            break
    return tuple(out)


def check_timm() -> None:
    """Refuse, before anything trains, a timm too old to write the run's ``config.json``.

    Raises:
        UserError: the installed timm is older than ``TIMM_MINIMUM``.
    """
    import timm

    if version_tuple(timm.__version__) < version_tuple(TIMM_MINIMUM):
        raise UserError(
            f"timm {timm.__version__} is installed; largebatch needs timm>={TIMM_MINIMUM} to write a run's config.json "
            f"(save_config_for_hf with data_config and the model's arguments): pip install 'timm>={TIMM_MINIMUM}'"
        )


def data_config(cfg: Config) -> dict[str, Any]:
    """timm's preprocessing fields for the run's evaluation transform."""
    data = cfg.data
    size = data.image_size
    return {
        "input_size": (data.channels, size, size),
        "mean": tuple(float(m) for m in data.mean),
        "std": tuple(float(s) for s in data.std),
        "interpolation": data.interpolation,  # the loaders' resize filter
        "crop_pct": data.eval_crop_ratio,
        "crop_mode": "center",
    }


def class_names(cfg: Config) -> list[str] | None:
    """The class names from ``data.root``'s ``dataset.json``, when it lists one per class."""
    root = cfg.data.root
    meta_path = pathlib.Path(root) / "dataset.json" if root else None
    if meta_path is None or not meta_path.is_file():
        return None
    names = json.loads(meta_path.read_text()).get("classes")
    return list(names) if isinstance(names, list) and len(names) == cfg.data.num_classes else None


def write_hub_config(model: torch.nn.Module, cfg: Config, path: pathlib.Path) -> None:
    """Write timm's ``config.json`` for ``model`` trained under ``cfg`` (atomically)."""
    from timm.models._hub import save_config_for_hf

    names = class_names(cfg)
    tmp = path.with_name(path.name + ".tmp")
    save_config_for_hf(model, str(tmp), model_config={"label_names": names} if names else None, data_config=data_config(cfg))
    hub = json.loads(tmp.read_text())
    for key in _NOT_OURS:
        hub["pretrained_cfg"].pop(key, None)
    tmp.write_text(json.dumps(hub, indent=2) + "\n")
    tmp.replace(path)


def write_run_hub_config(cfg: Config, run_dir: RunDir) -> None:
    """``config.json`` beside a finished run's ``model.safetensors``, from a model built on
    the meta device (the config needs the model's attributes, not its weights)."""
    from largebatch.models import build_model

    with torch.device("meta"):
        model = build_model(cfg.model, cfg.data)
    write_hub_config(model, cfg, run_dir.hub_config)


def load_run(run_dir: RunDir, model_name: str | None = None) -> tuple[Config, torch.nn.Module]:
    """The run's resolved config (its ``config.yaml``, read as data: a ``_base_`` in it is
    refused, not followed) and its model with the final weights (``model_name``: an extra
    model's, ``"ema"`` for ``model_ema.safetensors``).

    Raises:
        UserError: not a finished run directory (no ``config.yaml`` or no final weights),
            a finished run without that extra model, or a ``config.yaml`` naming ``_base_``.
    """
    from largebatch.models import build_model

    weights = run_dir.weights(model_name)
    if not run_dir.config.is_file():
        raise UserError(f"{run_dir} is not a run directory (no config.yaml)")
    if not run_dir.finished:
        raise UserError(
            f"{run_dir} has no {WEIGHTS}: the run has not finished; resume it to the end "
            f"(`largebatch train --run-dir {run_dir} --resume auto`)"
        )
    if not weights.is_file():
        raise UserError(f"{run_dir} has no {weights.name}: the run kept no model EMA (set ema.decay to keep one)")
    _, cfg = resolve_saved_config(run_dir.config)  # as data: a run directory may come from anyone
    model = build_model(cfg.model, cfg.data)
    model.load_state_dict(read_safetensors(weights))
    return cfg, model


def last_eval(run: RunDir, prefix: str = "eval") -> dict[str, float]:
    """The run's last evaluation record in ``metrics.jsonl`` (``prefix``: ``eval`` for the
    model, ``eval_ema`` for its EMA), with ``step``; empty when it never evaluated."""
    found: dict[str, float] = {}
    if run.metrics.is_file():
        for record in read_metrics(run.metrics):
            if f"{prefix}/top1" in record:
                found = {"step": record["step"], **{k.split("/", 1)[1]: v for k, v in record.items() if k.startswith(prefix + "/")}}
    return found


def dataset_name(cfg: Config) -> str | None:
    """The dataset's name: ``source`` from ``data.root``'s ``dataset.json`` (written by
    ``largebatch data convert``), else the folder's name; None for synthetic data."""
    if cfg.data.loader == "synthetic" or not cfg.data.root:
        return None
    meta_path = pathlib.Path(cfg.data.root) / "dataset.json"
    if meta_path.is_file():
        source = json.loads(meta_path.read_text()).get("source")
        if isinstance(source, str) and source:
            return source
    return pathlib.Path(cfg.data.root).resolve().name


def model_card(cfg: Config, run: RunDir, model: torch.nn.Module, name: str, *, ema: bool) -> str:
    """A Hugging Face Hub model card (``README.md``): front matter the Hub reads (library
    ``timm``, tags, dataset, metrics with the last evaluation's accuracy), the training
    summary from the run's ``config.yaml``, and how to load the folder."""
    import yaml

    saved = yaml.safe_load(run.config.read_text())
    derived = saved.get("derived", {})
    m, data, opt, sched = cfg.model, cfg.data, cfg.optimizer, cfg.lr_schedule
    result = last_eval(run, "eval_ema" if ema else "eval")
    dataset = dataset_name(cfg)
    front: dict[str, Any] = {
        "library_name": "timm",
        "pipeline_tag": "image-classification",
        "tags": ["image-classification", "timm", "largebatch", "vision-transformer"],
    }
    if dataset:
        front["datasets"] = [dataset]
    front["metrics"] = ["accuracy"]
    if result and dataset:
        metrics = [{"type": "accuracy", "name": "top-1 accuracy", "value": round(100 * result["top1"], 2)}]
        if "top5" in result:
            metrics.append({"type": "accuracy", "name": "top-5 accuracy", "value": round(100 * result["top5"], 2)})
        front["model-index"] = [
            {
                "name": name,
                "results": [
                    {
                        "task": {"type": "image-classification"},
                        "dataset": {"name": dataset, "type": dataset, "split": data.eval_split},
                        "metrics": metrics,
                    }
                ],
            }
        ]
    params = sum(p.numel() for p in model.parameters())
    arch = ", ".join(f"{k}={v!r}" for k, v in m.extra.items())
    rows = [
        ("model", f"`{m.name}`" + (f" with `{arch}`" if arch else "") + f"; {params / 1e6:.2f} M parameters"),
        ("input", f"{data.channels} x {data.image_size} x {data.image_size}, {data.num_classes} classes"),
        (
            "data",
            f"{dataset or 'synthetic images'}, split `{data.train_split}`"
            + (f" ({derived['train_samples']} images)" if derived.get("train_samples") else ""),
        ),
        (
            "steps",
            f"{derived.get('total_steps', '?')} ({cfg.epochs} epochs)"
            + (f", stopped at max_steps {cfg.max_steps}" if cfg.max_steps else ""),
        ),
        (
            "global batch",
            f"{derived.get('global_batch_size', cfg.global_batch_size)} = {derived.get('micro_batch_size', '?')} x "
            f"{derived.get('accumulation', '?')} accumulation x {derived.get('world_size', '?')} processes",
        ),
        ("optimizer", f"{opt.type}, peak lr {derived.get('peak_lr', opt.lr):g}, weight decay {opt.weight_decay:g}"),
        ("schedule", f"{sched.type}" + (f", warmup {derived['warmup_steps']} steps" if derived.get("warmup_steps") else "")),
        ("precision", f"{cfg.precision}"),
        ("weights", "the EMA of the weights" if ema else "the final weights"),
    ]
    if result:
        evaluated = f"top-1 {100 * result['top1']:.2f}%"
        if "top5" in result:
            evaluated += f", top-5 {100 * result['top5']:.2f}%"
        evaluated += f" on {int(result.get('samples', 0))} images of split `{data.eval_split}` at step {result['step']}"
        rows.append(("evaluation", evaluated))
    table = "\n".join(["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])
    front_matter = yaml.safe_dump(front, sort_keys=False)
    return f"""---
{front_matter}---

# {name}

A vision transformer trained with largebatch.
`config.json` holds the architecture with the arguments that rebuild this model and the
preprocessing its evaluation used; `model.safetensors` holds {"the EMA of its weights" if ema else "its weights"}.

## Training

{table}

## How to load

```python
import timm
import torch

model = timm.create_model("local-dir:PATH/TO/THIS/FOLDER", pretrained=True).eval()
# after huggingface_hub.upload_folder(repo_id="USER/REPO", folder_path=...):
# model = timm.create_model("hf-hub:USER/REPO", pretrained=True).eval()
transform = timm.data.create_transform(**timm.data.resolve_data_config({{}}, model=model))
with torch.no_grad():
    probabilities = model(transform(image).unsqueeze(0)).softmax(-1)  # image: a PIL image
```
"""


EXPORTED = (WEIGHTS, HUB_CONFIG, "README.md")  # the files an export writes


def export_run(run_dir: str | pathlib.Path, out: str | pathlib.Path, *, ema: bool = False, force: bool = False) -> pathlib.Path:
    """Copy a finished run's weights (``ema``: its EMA weights, ``model_ema.safetensors``)
    into ``out`` as ``model.safetensors`` with timm's ``config.json`` and a model card,
    ``README.md``; returns ``out``. Each file is written beside its place and renamed
    into it, so a link planted there is replaced, not followed.

    Raises:
        UserError: not a finished run, unreadable weights, or ``out`` already holds one
            of these files and ``force`` is not set (checked before anything is written).
    """
    check_timm()
    run, folder = RunDir(run_dir), RunDir(out)
    if folder.path.exists() and not folder.path.is_dir():
        raise UserError(f"{folder} is a file; give a folder for the export", key="--out")
    taken = [name for name in EXPORTED if os.path.lexists(folder / name)]
    if taken and not force:
        raise UserError(f"{folder} already holds {', '.join(taken)}; give another --out, or --force to replace them", key="--out")
    cfg, model = load_run(run, "ema" if ema else None)
    folder.path.mkdir(parents=True, exist_ok=True)
    tmp = folder / (WEIGHTS + ".tmp")
    shutil.copyfile(run.weights("ema" if ema else None), tmp)
    tmp.replace(folder.weights())
    write_hub_config(model, cfg, folder.hub_config)
    card = folder / "README.md"
    card_tmp = folder / "README.md.tmp"
    card_tmp.write_text(model_card(cfg, run, model, folder.path.resolve().name, ema=ema))
    card_tmp.replace(card)
    return folder.path
