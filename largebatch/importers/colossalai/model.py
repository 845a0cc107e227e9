"""The model of a Colossal-AI run as a timm model.

Colossal-AI's data-parallel ViT example builds a timm model in its train script
(``vit_base_patch16_224(drop_rate=0.1)``, or ``timm.create_model('...')``); its
hybrid-parallel examples build Colossal-AI's own ViT (``titans`` ``_create_vit_model``)
from the config's ``IMG_SIZE``, ``PATCH_SIZE``, ``HIDDEN_SIZE``, ``DEPTH``,
``NUM_HEADS``, ``MLP_RATIO`` and ``NUM_CLASSES``. That architecture becomes timm's
``VisionTransformer`` arguments, under the timm name that has it when there is one.

Dropout: in the timm of the examples (0.4-0.6) ``drop_rate`` was the dropout after the
position embedding, the attention projection and in the MLP, with none before the head;
timm 1.x calls those ``pos_drop_rate`` and ``proj_drop_rate`` and keeps ``drop_rate``
for the head, so ``drop_rate=p`` becomes ``pos_drop_rate=p, proj_drop_rate=p,
drop_rate=0.0`` (as configs/vit-b16.py does).
"""

from __future__ import annotations

from typing import Any

from largebatch.importers.colossalai.builder import Builder
from largebatch.importers.colossalai.reader import ColossalConfig
from largebatch.importers.colossalai.script import Argument, Call, Found, TrainScript

# timm's ViT names at 224 px -> (patch size, width, depth, heads); all have an MLP ratio of 4.
TIMM_VITS = {
    "vit_tiny_patch16_224": (16, 192, 12, 3),
    "vit_small_patch16_224": (16, 384, 12, 6),
    "vit_small_patch32_224": (32, 384, 12, 6),
    "vit_base_patch16_224": (16, 768, 12, 12),
    "vit_base_patch32_224": (32, 768, 12, 12),
    "vit_large_patch16_224": (16, 1024, 24, 16),
    "vit_large_patch32_224": (32, 1024, 24, 16),
    "vit_huge_patch14_224": (14, 1280, 32, 16),
}
ARCHITECTURE = ("patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio")
# Colossal-AI's ViT (titans) arguments -> the key here.
COLOSSALAI_VIT = {
    "img_size": "data.image_size",
    "in_chans": "data.channels",
    "num_classes": "data.num_classes",
    "patch_size": "model.patch_size",
    "dim": "model.embed_dim",
    "hidden_size": "model.embed_dim",
    "depth": "model.depth",
    "num_heads": "model.num_heads",
    "mlp_ratio": "model.mlp_ratio",
    "attention_dropout": "model.attn_drop_rate",
    "drop_path": "model.drop_path_rate",
}
# timm arguments that belong to the data section here.
TIMM_DATA = {"num_classes": "data.num_classes", "img_size": "data.image_size", "in_chans": "data.channels"}
DROPOUT_NOTE = "timm<0.9's drop_rate: dropout after the position embedding, the attention projection and in the MLP"


def _dropout(b: Builder, argument: Argument | None, origin: str) -> None:
    if not isinstance(argument, Found):
        b.take("model.proj_drop_rate", argument, origin)
        return
    why = f"{origin}{'; ' + argument.origin if argument.origin else ''} ({DROPOUT_NOTE})"
    b.set("model.drop_rate", 0.0, f"{origin}: no dropout before the head in that timm")
    b.set("model.pos_drop_rate", argument.value, why)
    b.set("model.proj_drop_rate", argument.value, why)


def _timm_call(script: TrainScript) -> Call | None:
    for call in script.calls:
        from_timm = (call.module or "").split(".")[0] == "timm"
        if call.name == "create_model" and (from_timm or call.text.startswith("timm.")):
            return call
        if from_timm and call.name.startswith(("vit_", "deit_")):
            return call
    return None


def _map_timm(b: Builder, script: TrainScript, call: Call) -> None:
    if call.name == "create_model":
        b.take("model.name", call.argument("model_name", 0), script.origin(call, "model_name", 0))
    else:
        b.set("model.name", call.name, f"{call.text}(...) at {script.where(call)}")
    for name, argument in call.kwargs.items():
        origin = script.origin(call, name)
        if name == "drop_rate":
            _dropout(b, argument, origin)
        elif name in TIMM_DATA:
            b.take(TIMM_DATA[name], argument, origin)
        elif name != "model_name":
            b.take(f"model.{name}", argument, origin)


def _colossalai_vit_call(script: TrainScript) -> Call | None:
    return next((c for c in script.calls if "vit" in c.name.lower() and {"depth", "num_heads"} <= set(c.kwargs)), None)


def _map_colossalai_vit(b: Builder, script: TrainScript, call: Call) -> None:
    for name, argument in call.kwargs.items():
        origin = script.origin(call, name)
        if isinstance(argument, Found) and argument.origin and name not in COLOSSALAI_VIT:
            origin += f"; {argument.origin}"
        if name in COLOSSALAI_VIT:
            b.take(COLOSSALAI_VIT[name], argument, origin)
        elif name == "dropout":
            _dropout(b, argument, origin)
        elif name == "init_method" and isinstance(argument, Found) and argument.value == "jax":
            b.set("model.weight_init", "jax", origin)
        elif name == "init_method" and isinstance(argument, Found) and argument.value == "torch":
            continue  # timm's default initialisation
        elif name == "checkpoint":
            b.skip(origin, "", "activation checkpointing is not offered")
        else:
            b.skip(origin, "", f"an argument of {call.name} with no timm equivalent")


def _constants(b: Builder, cfg: ColossalConfig) -> None:
    """The architecture and dropout by the config's names (no train script says otherwise)."""
    for name, key in (
        ("PATCH_SIZE", "model.patch_size"),
        ("HIDDEN_SIZE", "model.embed_dim"),
        ("DEPTH", "model.depth"),
        ("NUM_HEADS", "model.num_heads"),
        ("MLP_RATIO", "model.mlp_ratio"),
    ):
        if name in cfg.values and not b.has(key):
            b.set(key, cfg.values[name], f"{cfg.stated(name)}, by its name")
            b.used.add(name)
    if "DROP_RATE" in cfg.values and not b.has("model.proj_drop_rate"):
        _dropout(b, Found(cfg.values["DROP_RATE"]), f"{cfg.stated('DROP_RATE')}, by its name")
        b.used.add("DROP_RATE")


def _name_from_architecture(b: Builder) -> None:
    given: dict[str, Any] = {key: b.get(f"model.{key}") for key in ARCHITECTURE if b.has(f"model.{key}")}
    if not given:
        return
    for name, (patch, width, depth, heads) in TIMM_VITS.items():
        if dict(patch_size=patch, embed_dim=width, depth=depth, num_heads=heads, mlp_ratio=4) == {
            "patch_size": given.get("patch_size"),
            "embed_dim": given.get("embed_dim"),
            "depth": given.get("depth"),
            "num_heads": given.get("num_heads"),
            "mlp_ratio": given.get("mlp_ratio", 4),
        }:
            b.set("model.name", name, f"timm's name for this architecture ({', '.join(f'{k} {v}' for k, v in given.items())})")
            return
    b.fill(
        "model.name", "vit_base_patch16_224", "timm's VisionTransformer, its architecture given by the keys beside (no timm name has it)"
    )


def map_model(b: Builder, cfg: ColossalConfig, script: TrainScript | None) -> None:
    """Set the ``model`` section (and ``data.num_classes`` / ``data.image_size`` when the
    model is where they are given)."""
    if script is not None:
        timm_call = _timm_call(script)
        vit_call = _colossalai_vit_call(script) if timm_call is None else None
        if timm_call is not None:
            _map_timm(b, script, timm_call)
        elif vit_call is not None:
            _map_colossalai_vit(b, script, vit_call)
    if script is None or not b.has("model.name"):
        _constants(b, cfg)
    if not b.has("model.name"):
        _name_from_architecture(b)
