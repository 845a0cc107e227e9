"""Models from timm by name, with the config's keyword arguments.

``model = dict(name='vit_base_patch16_224', drop_rate=0.1)``: every key but ``name`` is a
keyword argument of ``timm.create_model``. ``num_classes``, ``img_size`` and
``in_chans`` default to the data section's ``num_classes``, ``image_size`` and
``channels``, so they are stated once.

Starting weights (fine-tuning): a model starts from random initialisation unless
``model.init_from`` names weights (a run directory or an export folder holding
``model.safetensors``, a ``.safetensors`` file, a checkpoint file or a sharded checkpoint
folder; a glob such as ``'runs/vit-tiny-fmnist-*'`` picks the newest finished run) or
``model.pretrained=True`` asks for timm's published weights of ``model.name`` (from timm's
cache, or downloaded from the Hub where the network allows). Both go through timm's own
pretrained loader, so what timm adapts when loading its weights is adapted here too:
the classifier is re-initialised when ``num_classes`` differs, position embeddings are
resampled to another image size, and the patch embedding follows ``in_chans``.
"""

from __future__ import annotations

import difflib
import glob
import inspect
import pathlib
import re
import tempfile
from typing import Any

import torch

from largebatch.config.signature import check_call
from largebatch.config.typed import Config, thaw, typed
from largebatch.errors import ConfigError

_OURS = ("name", "pretrained", "init_from")  # model keys that are not timm.create_model arguments


def model_kwargs(cfg: Config | dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments for ``timm.create_model`` (the model section's other keys, as
    plain values), data-derived ones filled in."""
    cfg = typed(cfg)
    kwargs = thaw(cfg.model.extra)
    data = cfg.data
    kwargs.setdefault("num_classes", data.num_classes)
    kwargs.setdefault("img_size", data.image_size)
    kwargs.setdefault("in_chans", data.channels)
    return kwargs


def check_model_name(name: str) -> None:
    """Raise a ``ConfigError`` with close matches when timm has no model ``name``."""
    import timm

    if timm.is_model(name):
        return
    close = difflib.get_close_matches(name, timm.list_models(), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else "see timm.list_models('vit_*')"
    raise ConfigError(f"timm has no model {name!r}; {hint}", key="model.name")


def check_model_config(cfg: Config | dict[str, Any]) -> None:
    """Check the model name and its keyword arguments without building the model.

    Raises:
        ConfigError: an unknown name, or a key that neither ``timm.create_model`` nor the
            model's classes take (with a "did you mean").
    """
    import timm

    cfg = typed(cfg)
    name = cfg.model.name
    check_model_name(name)
    accepted = set(_accepted_kwargs(timm, name)) | set(inspect.signature(timm.create_model).parameters)
    for key in model_kwargs(cfg):
        if key not in accepted:
            close = difflib.get_close_matches(key, sorted(accepted), n=1)
            hint = f"did you mean 'model.{close[0]}'?" if close else "remove it"
            raise ConfigError(f"{name} does not take the argument {key!r}; {hint}", key=f"model.{key}")
    model_class = _main_class(timm, name)
    if model_class is not None:
        check_call(model_class, model_kwargs(cfg), "model")


def build_model(cfg: Config | dict[str, Any], *, initial_weights: bool = False) -> torch.nn.Module:
    """Create the config's timm model on the CPU.

    Args:
        cfg: the resolved config (typed, or the dict ``validate`` returns).
        initial_weights: load the weights ``model.init_from`` or ``model.pretrained``
            names (the run's model); random initialisation otherwise (and always on the
            meta device, where only the model's shape is wanted).

    Raises:
        ConfigError: unknown model name, a keyword argument the model does not take
            (named as ``model.<key>``, with a "did you mean"), or starting weights that
            cannot be found or do not fit the model.
    """
    import timm

    cfg = typed(cfg)
    name = cfg.model.name
    check_model_name(name)
    kwargs = model_kwargs(cfg)
    with tempfile.TemporaryDirectory(prefix="largebatch-init-") as scratch:
        overlay = _weights_overlay(cfg, name, pathlib.Path(scratch)) if initial_weights else None
        try:
            if overlay is None:
                return timm.create_model(name, pretrained=False, **kwargs)
            return timm.create_model(name, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs)
        except TypeError as exc:
            raise _argument_error(timm, name, kwargs, exc) from exc
        except (RuntimeError, OSError, ValueError) as exc:
            if overlay is None:
                raise
            raise _weights_error(cfg, name, exc) from exc


def _argument_error(timm: Any, name: str, kwargs: dict[str, Any], exc: TypeError) -> ConfigError:
    match = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
    if not match:
        return ConfigError(f"timm could not build {name!r} with {kwargs}: {exc}", key="model")
    bad = match.group(1)
    close = difflib.get_close_matches(bad, _accepted_kwargs(timm, name), n=1)
    hint = f"did you mean 'model.{close[0]}'?" if close else "remove it"
    return ConfigError(f"{name} does not take the argument {bad!r}; {hint}", key=f"model.{bad}")


def _weights_error(cfg: Config, name: str, exc: Exception) -> ConfigError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if cfg.model.init_from:
        return ConfigError(
            f"the weights of {cfg.model.init_from!r} do not fit {name} with this config's model arguments "
            f"({first}); use the same model.name and arguments as the run that wrote them",
            key="model.init_from",
        )
    return ConfigError(
        f"timm could not load its published weights for {name} ({first}); fetch them where the network is "
        "reachable (they are cached under ~/.cache/huggingface) or start from a file with model.init_from",
        key="model.pretrained",
    )


def _weights_overlay(cfg: Config, name: str, scratch: pathlib.Path) -> dict[str, Any] | None:
    """timm's ``pretrained_cfg_overlay`` for the starting weights ({} for timm's own), or
    None for random initialisation."""
    section = cfg.model
    if section.init_from:
        weights = weights_file(section.init_from, scratch)
        return {"file": str(weights), "num_classes": _classes_in(weights, name)}
    return {} if section.pretrained else None


def weights_file(spec: str, scratch: pathlib.Path) -> pathlib.Path:
    """The ``.safetensors`` file ``model.init_from`` names (a checkpoint's model weights are
    written into ``scratch`` first).

    Raises:
        ConfigError: nothing there, or nothing with model weights.
    """
    from largebatch import checkpoint as ckpt

    path = pathlib.Path(spec).expanduser()
    if glob.has_magic(spec):
        finished = [pathlib.Path(p) for p in glob.glob(str(path)) if (pathlib.Path(p) / "model.safetensors").is_file()]
        if not finished:
            raise ConfigError(f"no finished run (a folder holding model.safetensors) matches {spec!r}", key="model.init_from")
        path = max(finished, key=lambda p: (p / "model.safetensors").stat().st_mtime)
    if path.is_dir() and (path / "model.safetensors").is_file():
        return path / "model.safetensors"
    if path.is_file() and path.suffix == ".safetensors":
        return path
    if path.is_dir() and (path / ".metadata").is_file():
        state = _sharded_model_state(path)
    elif path.is_file():
        state = ckpt.read_checkpoint(path)["model"]
    else:
        raise ConfigError(
            f"{spec!r} is neither a run directory or export folder (with model.safetensors), a .safetensors file nor a checkpoint",
            key="model.init_from",
        )
    target = scratch / "model.safetensors"
    ckpt.save_tensors(state, target)
    return target


def _sharded_model_state(folder: pathlib.Path) -> dict[str, torch.Tensor]:
    """The full model weights of a sharded (DCP) checkpoint, read without a process group."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory(prefix="largebatch-dcp-") as scratch:
        whole = pathlib.Path(scratch) / "checkpoint.pt"
        dcp_to_torch_save(str(folder), str(whole))
        return torch.load(whole, map_location="cpu", weights_only=True)["model"]


def _classes_in(weights: pathlib.Path, name: str) -> int | None:
    """Output classes of the classifier in ``weights`` (None when it has none)."""
    from safetensors import safe_open
    from timm.models import get_pretrained_cfg_value

    classifier = get_pretrained_cfg_value(name, "classifier") or "head"
    classifier = classifier[0] if isinstance(classifier, (list, tuple)) else classifier
    with safe_open(str(weights), framework="pt") as f:
        key = f"{classifier}.weight"
        return f.get_slice(key).get_shape()[0] if key in f.keys() else None


def _main_class(timm: Any, name: str) -> type | None:
    """The model class of ``name``'s timm module: the one whose constructor takes the most arguments."""
    module = inspect.getmodule(timm.models.model_entrypoint(name))
    classes = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj) and issubclass(obj, torch.nn.Module) and obj.__module__ == module.__name__
    ]
    return max(classes, key=lambda c: len(inspect.signature(c.__init__).parameters), default=None)


def _accepted_kwargs(timm: Any, name: str) -> list[str]:
    """Constructor arguments of the model classes in ``name``'s timm module (for hints)."""
    module = inspect.getmodule(timm.models.model_entrypoint(name))
    names: set[str] = set()
    for obj in vars(module).values():
        if inspect.isclass(obj) and issubclass(obj, torch.nn.Module) and obj.__module__ == module.__name__:
            names.update(inspect.signature(obj.__init__).parameters)
    return sorted(names - {"self", "args", "kwargs"})
