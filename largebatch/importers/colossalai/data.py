"""The data of a Colossal-AI run: its ``dali`` dict, the loader and loss of its train
script, and ``IMG_SIZE`` / ``NUM_CLASSES``.

The ViT examples read ImageNet TFRecords with their own DALI loader
(``dataloader/imagenet_dali_dataloader.py``, titans' ``build_dali_imagenet``): it
subtracts 1 from the records' labels, normalises as ``(x - 127.5) / 127.5`` (mean and std
0.5), and mixes each training batch with one Beta(``mixup_alpha``) weight; ``MixupLoss``
mixes the targets to match. Here ``data.loader='dali'`` reads the same shards, and
mixup is ``mixup.mixup_alpha``.
"""

from __future__ import annotations

import re

from largebatch.errors import ConfigError
from largebatch.importers.colossalai.builder import Builder
from largebatch.importers.colossalai.reader import ColossalConfig
from largebatch.importers.colossalai.script import Found, TrainScript

IMAGENET_SPLITS = {"data.train_samples": 1281167, "data.eval_samples": 50000}
_BY_NAME = "the shards are found in data.root by their names (train-*, validation-*) beside their .idx files (largebatch data index)"


def _example_loader(b: Builder, origin: str) -> None:
    """What Colossal-AI's DALI loader does that is a setting here."""
    b.set("data.label_offset", 1, f"{origin}: Colossal-AI's DALI loader subtracts 1 from ImageNet's TFRecord labels")
    b.set("data.mean", [0.5, 0.5, 0.5], f"{origin}: Colossal-AI's DALI loader normalises (x - 127.5) / 127.5")
    b.set("data.std", [0.5, 0.5, 0.5], f"{origin}: Colossal-AI's DALI loader normalises (x - 127.5) / 127.5")


def map_dali(b: Builder, cfg: ColossalConfig) -> None:
    """The config's ``dali`` dict."""
    dali = cfg.values.get("dali")
    if dali is None:
        return
    b.used.add("dali")
    if not isinstance(dali, dict):
        raise ConfigError(
            f"got {dali!r}; Colossal-AI's examples give dict(root=..., gpu_aug=..., mixup_alpha=...)", key="dali", path=str(cfg.path)
        )
    b.set("data.loader", "dali", f"{cfg.where('dali')}: DALI over TFRecord shards")
    _example_loader(b, cfg.where("dali"))
    for key, value in dali.items():
        setting = cfg.where(f"dali.{key}")
        if key == "root":
            b.set("data.root", value, setting)
        elif key == "mixup_alpha":
            b.set("mixup.mixup_alpha", value, f"{setting} (one Beta(alpha, alpha) weight per batch, as timm's batch mixup)")
        elif key == "gpu_aug":
            b.skip(f"dali.{key}", value, "the dali loader decodes and resizes on the GPU whenever there is one; there is no switch")
        elif key.endswith("path"):
            b.skip(f"dali.{key}", value, _BY_NAME)
        else:
            b.skip(f"dali.{key}", value, "no equivalent in the dali loader")


def map_loader_call(b: Builder, script: TrainScript) -> None:
    """The loader the train script builds."""
    dali = next((c for c in script.calls if "dali" in c.name.lower()), None)
    if dali is not None:
        origin = f"{dali.text} at {script.where(dali)}"
        if not b.has("data.loader"):
            b.set("data.loader", "dali", origin)
            _example_loader(b, origin)
        b.take("mixup.mixup_alpha", dali.kwargs.get("mixup_alpha"), script.origin(dali, "mixup_alpha"))
        b.take("data.num_workers", dali.kwargs.get("num_threads"), script.origin(dali, "num_threads"))
        for name in ("rand_augment", "randaug_num_layers"):
            argument = dali.kwargs.get(name)
            if isinstance(argument, Found) and argument.value:
                b.skip(
                    script.origin(dali, name),
                    "",
                    "RandAugment inside DALI is not offered; data.loader='native' with data.auto_augment='rand-m9-mstd0.5-inc1' is the nearest",
                )
    cifar = next((c for c in script.calls if "cifar" in c.name.lower()), None)
    if cifar is not None:
        b.skip(
            f"{cifar.text} at {script.where(cifar)}",
            "",
            "CIFAR-10 through torchvision: training reads TFRecord shards here; convert an image folder with "
            "`largebatch data convert folder` and set data.root",
        )


def map_loss(b: Builder, script: TrainScript) -> None:
    """Label smoothing of the train script's loss, and whether it mixes targets."""
    for call in script.calls:
        if call.name.endswith("CrossEntropyLoss"):
            b.take("mixup.label_smoothing", call.kwargs.get("label_smoothing"), script.origin(call, "label_smoothing"))
        elif call.name == "LabelSmoothingCrossEntropy":
            argument = call.argument("smoothing", 0) or Found(0.1)
            b.take("mixup.label_smoothing", argument, script.origin(call, "smoothing", 0))
    mixup_loss = script.first("MixupLoss")
    if mixup_loss is not None and not b.has("mixup.mixup_alpha"):
        b.skip(
            f"{mixup_loss.text} at {script.where(mixup_loss)}",
            "",
            "mixes the targets of batches its loader mixed, with an alpha not found here: set mixup.mixup_alpha",
        )


def fill_data(b: Builder, script: TrainScript | None) -> None:
    """What a config needs that the source does not say."""
    b.fill("data.loader", "native", "no DALI settings in the source: the PyTorch TFRecord reader")
    reads = re.findall(r"environ\[['\"](\w+)['\"]\]|environ\.get\(['\"](\w+)['\"]", script.path.read_text()) if script else []
    variables = sorted({subscript or call for subscript, call in reads})
    where = f"the train script reads ${', $'.join(variables)}" if variables else "not in the source"
    b.fill("data.root", "data/imagenet", f"{where}: set the folder of your TFRecord shards (docs/data.md)")
    if b.get("data.num_classes", 1000) == 1000:
        for key, value in IMAGENET_SPLITS.items():
            b.fill(key, value, "ImageNet-1K's split size: config show uses it while the shards are absent")
