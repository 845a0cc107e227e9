"""A Colossal-AI config (and its train script) to a largebatch config, setting by setting.

The order matters only where one value reads another: the batch first (it needs the
world size), the epochs before the schedule (whose length is compared with them), the
model before ``IMG_SIZE`` / ``NUM_CLASSES`` by name (the model's arguments win), and
last every name of the config nothing read, listed with why.
"""

from __future__ import annotations

from typing import Any

from largebatch.importers.colossalai.batch import map_batch, map_parallel
from largebatch.importers.colossalai.builder import Builder
from largebatch.importers.colossalai.data import fill_data, map_dali, map_loader_call, map_loss
from largebatch.importers.colossalai.model import map_model
from largebatch.importers.colossalai.optimizer import map_optimizer, map_schedule
from largebatch.importers.colossalai.reader import AmpType, ColossalConfig, StandIn
from largebatch.importers.colossalai.script import TrainScript
from largebatch.importers.colossalai.vocabulary import HOOKS, UNMAPPED

AMP_MODES = {
    "torch": "torch autocast with a GradScaler, which is precision 'fp16' here",
    "naive": "Colossal-AI's naive AMP runs fp16 weights with fp32 master weights in the optimizer; 'fp16' here autocasts "
    "around fp32 weights, with the same fp16 matmuls and dynamic loss scaling",
    "apex": "apex amp (opt_level O1 by default) casts per operation as autocast does, with dynamic loss scaling: 'fp16' here",
}


def amp_mode(value: Any) -> str:
    """``'torch'`` for ``AMP_TYPE.TORCH``, ``'torch'``, or a stand-in ending in ``.TORCH``."""
    if isinstance(value, AmpType):
        return value.value
    text = repr(value) if isinstance(value, StandIn) else str(value)
    return text.rsplit(".", 1)[-1].lower()


def _map_precision(b: Builder, cfg: ColossalConfig) -> None:
    fp16 = cfg.values.get("fp16")
    b.used.add("fp16")
    if fp16 is None:
        b.set("precision", "fp32", f"no fp16 in {cfg.path.name}: Colossal-AI trains in fp32 (precision 'auto' would pick bf16 on a GPU)")
        return
    settings = fp16 if isinstance(fp16, dict) else {"mode": fp16}
    for key, value in settings.items():
        if key != "mode":
            b.skip(f"fp16.{key}", value, "fp16 loss scaling here is torch's GradScaler with its defaults")
            continue
        mode = amp_mode(value)
        if mode in AMP_MODES:
            b.set("precision", "fp16", f"{cfg.where(f'fp16.mode {value!r}')}: {AMP_MODES[mode]}")
        else:
            b.skip("fp16.mode", value, f"not one of Colossal-AI's AMP_TYPE modes ({', '.join(m.name for m in AmpType)})")


def _map_by_name(b: Builder, cfg: ColossalConfig, names: dict[str, str]) -> None:
    for name, key in names.items():
        if name in cfg.values and not b.has(key):
            b.set(key, cfg.values[name], cfg.stated(name))
            b.used.add(name)


def _map_script_run(b: Builder, script: TrainScript) -> None:
    """Epochs, evaluation interval and seed as the script's calls give them, and its hooks."""
    fit = script.first("fit")
    if fit is not None:
        b.take("epochs", fit.kwargs.get("epochs"), script.origin(fit, "epochs"))
        b.take("eval.interval_epochs", fit.kwargs.get("test_interval"), script.origin(fit, "test_interval"))
    launch = next((c for c in script.calls if c.name.startswith("launch")), None)
    if launch is not None:
        b.take("seed", launch.kwargs.get("seed"), script.origin(launch, "seed"))
    for call in script.calls:
        if call.name.endswith("Hook") and call.name not in ("BaseHook", "LRSchedulerHook"):
            why = HOOKS.get(call.name, "the train script's own hook: write a largebatch hook (docs/hooks.md)")
            b.skip(f"{call.text} at {script.where(call)}", "", why)


def _list_the_rest(b: Builder, cfg: ColossalConfig, script: TrainScript | None) -> None:
    mapped = " ".join(entry.why for entry in b.mapped) + " ".join(entry.name for entry in b.unmapped)
    for name, value in cfg.values.items():
        if name in b.used or cfg.where(name) in mapped:
            continue
        if name in UNMAPPED:
            why = UNMAPPED[name]
        elif script is not None and name in script.config_reads:
            why = f"the train script reads it (gpc.config.{name}) where the import maps nothing"
        elif script is not None and name.isupper():
            why = "the train script does not read it"
        elif name.isupper():
            why = "a constant of the file, which only a train script reads (give --train-script)"
        else:
            why = "not a setting Colossal-AI's engine or this import knows"
        b.skip(cfg.where(name), value, why)


def map_colossalai(cfg: ColossalConfig, script: TrainScript | None, world_size: int | None) -> tuple[Builder, int | None]:
    """Every setting of ``cfg`` (and ``script``) mapped, filled in or listed as unmapped;
    and the world size the batch was computed for.

    Raises:
        ConfigError: the world size is needed and unknown, or a setting has a shape
            Colossal-AI does not take.
    """
    b = Builder()
    world = map_batch(b, cfg, world_size)
    map_parallel(b, cfg)
    _map_by_name(b, cfg, {"NUM_EPOCHS": "epochs", "num_epochs": "epochs", "clip_grad_norm": "clip_grad_norm", "seed": "seed"})
    _map_precision(b, cfg)
    map_dali(b, cfg)
    if script is not None:
        _map_script_run(b, script)
        map_loader_call(b, script)
        map_loss(b, script)
    map_model(b, cfg, script)
    _map_by_name(b, cfg, {"IMG_SIZE": "data.image_size", "NUM_CLASSES": "data.num_classes"})
    map_optimizer(b, cfg, script)
    map_schedule(b, cfg, script)
    fill_data(b, script)
    _list_the_rest(b, cfg, script)
    return b, world
