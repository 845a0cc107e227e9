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
from typing import TYPE_CHECKING, Any

from largebatch import signatures, vit
from largebatch.config.arguments import Signature, read_signature
from largebatch.config.frozen import thaw
from largebatch.config.sections import Config, DataConfig, ModelConfig
from largebatch.errors import ConfigError
from largebatch.rundir import RunDir

if TYPE_CHECKING:
    import torch

_OURS = ("name", "pretrained", "init_from")  # model keys that are not timm.create_model arguments


def model_kwargs(model: ModelConfig, data: DataConfig) -> dict[str, Any]:
    """The keyword arguments for ``timm.create_model`` (the model section's other keys, as
    plain values), data-derived ones filled in."""
    kwargs = thaw(model.extra)
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


def model_arguments(name: str) -> tuple[tuple[str, ...], Signature | None]:
    """The keywords the timm model ``name`` takes (``timm.create_model``'s and its
    module's model classes', sorted) and its model class's signature (None when it has
    none). For the ViT sizes of ``largebatch.vit`` they are the recorded ones
    (``largebatch.signatures``), known without importing timm; for any other name they
    are read from timm.

    Raises:
        ConfigError: timm has no model ``name``.
    """
    if vit.recorded(name):
        return signatures.VISION_TRANSFORMER_KEYWORDS, signatures.VISION_TRANSFORMER
    import timm

    check_model_name(name)
    return read_model_arguments(timm, name)


def read_model_arguments(timm: Any, name: str) -> tuple[tuple[str, ...], Signature | None]:
    """``model_arguments`` read from timm (imported by the caller)."""
    accepted = set(_accepted_kwargs(timm, name)) | set(inspect.signature(timm.create_model).parameters)
    model_class = _main_class(timm, name)
    return tuple(sorted(accepted)), None if model_class is None else read_signature(model_class)


def check_model_config(cfg: Config) -> None:
    """Check the model name and its keyword arguments without building the model (one of
    ``largebatch.config.resolve_config``'s checks).

    Raises:
        ConfigError: an unknown name, or a key that neither ``timm.create_model`` nor the
            model's classes take (with a "did you mean").
    """
    name = cfg.model.name
    accepted, signature = model_arguments(name)
    kwargs = model_kwargs(cfg.model, cfg.data)
    for key in kwargs:
        if key not in accepted:
            close = difflib.get_close_matches(key, accepted, n=1)
            hint = f"did you mean 'model.{close[0]}'?" if close else "remove it"
            raise ConfigError(f"{name} does not take the argument {key!r}; {hint}", key=f"model.{key}")
    if signature is not None:
        signature.check(kwargs, "model")


def build_model(model: ModelConfig, data: DataConfig, *, initial_weights: bool = False, trust_checkpoint: bool = False) -> torch.nn.Module:
    """Create the ``model`` section's timm model on the CPU.

    Args:
        model: the ``model`` section.
        data: the ``data`` section (``num_classes``, ``image_size`` and ``channels`` are
            the model's unless the model section sets them).
        initial_weights: load the weights ``model.init_from`` or ``model.pretrained``
            names (the run's model); random initialisation otherwise (and always on the
            meta device, where only the model's shape is wanted).
        trust_checkpoint: read a checkpoint ``model.init_from`` names without the
            restriction to tensors and plain values (``largebatch.safe_load``).

    Raises:
        ConfigError: unknown model name, a keyword argument the model does not take
            (named as ``model.<key>``, with a "did you mean"), values timm refuses to
            build (its reason and the arguments), or starting weights that cannot be
            found or do not fit the model.
    """
    import timm

    name = model.name
    check_model_name(name)
    kwargs = model_kwargs(model, data)
    with tempfile.TemporaryDirectory(prefix="largebatch-init-") as scratch:
        overlay = _weights_overlay(model, data, name, pathlib.Path(scratch), trust_checkpoint) if initial_weights else None
        try:
            if overlay is None:
                return timm.create_model(name, pretrained=False, **kwargs)
            built = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs)
        except TypeError as exc:
            raise _argument_error(timm, name, kwargs, exc) from exc
        except (RuntimeError, OSError, ValueError) as exc:
            if overlay is None:
                raise _build_error(name, kwargs, exc) from exc
            raise _weights_error(model, name, exc) from exc
        except (AssertionError, ArithmeticError) as exc:  # timm's own checks: arguments that do not fit together
            raise _build_error(name, kwargs, exc) from exc
        if "file" in overlay:
            check_dtypes(built, pathlib.Path(overlay["file"]), model.init_from)
        return built


def check_dtypes(model: torch.nn.Module, weights: pathlib.Path, spec: str) -> None:
    """The starting weights hold each tensor in the model's own dtype: timm's loader would
    cast an int8 or float16 file silently, training from something else than was saved.

    Raises:
        ConfigError: naming the first tensor whose dtype differs, both dtypes and the fix.
    """
    from largebatch.safe_load import SAFETENSORS_DTYPE_NAMES, safetensors_dtypes

    stored = safetensors_dtypes(weights)
    for key, tensor in model.state_dict().items():
        wanted = SAFETENSORS_DTYPE_NAMES.get(tensor.dtype, str(tensor.dtype))
        if key in stored and stored[key] != wanted:
            raise ConfigError(
                f"{spec!r} holds {key} as {stored[key]}, the model's is {wanted} ({tensor.dtype}); loading would cast it "
                f"silently: start from weights saved in {tensor.dtype} (a largebatch run's model.safetensors is), or convert the file",
                key="model.init_from",
            )


def _build_error(name: str, kwargs: dict[str, Any], exc: Exception) -> ConfigError:
    """timm refused the model section's values (``embed_dim`` not a multiple of ``num_heads``,
    a patch of 0, a negative depth): its reason, and the arguments it was given."""
    reason = _first_line(exc, "no reason given")
    given = ", ".join(f"{key}={value!r}" for key, value in kwargs.items())
    return ConfigError(
        f"timm could not build {name!r} with {given} (the rest: {name}'s defaults): {type(exc).__name__}: {reason}; "
        "change the model section's values",
        key="model",
    )


def _argument_error(timm: Any, name: str, kwargs: dict[str, Any], exc: TypeError) -> ConfigError:
    match = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
    if not match:
        return _build_error(name, kwargs, exc)
    bad = match.group(1)
    close = difflib.get_close_matches(bad, _accepted_kwargs(timm, name), n=1)
    hint = f"did you mean 'model.{close[0]}'?" if close else "remove it"
    return ConfigError(f"{name} does not take the argument {bad!r}; {hint}", key=f"model.{bad}")


def _first_line(exc: Exception, otherwise: str) -> str:
    """The first line of ``exc``'s message, or ``otherwise`` when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else otherwise


def _weights_error(model: ModelConfig, name: str, exc: Exception) -> ConfigError:
    first = _first_line(exc, type(exc).__name__)
    if model.init_from:
        return ConfigError(
            f"the weights of {model.init_from!r} do not fit {name} with this config's model arguments "
            f"({first}); use the same model.name and arguments as the run that wrote them",
            key="model.init_from",
        )
    return ConfigError(
        f"timm could not load its published weights for {name} ({first}); fetch them where the network is "
        "reachable (they are cached under ~/.cache/huggingface) or start from a file with model.init_from",
        key="model.pretrained",
    )


def _weights_overlay(
    section: ModelConfig, data: DataConfig, name: str, scratch: pathlib.Path, trust: bool = False
) -> dict[str, Any] | None:
    """timm's ``pretrained_cfg_overlay`` for the starting weights ({} for timm's own), or
    None for random initialisation. Weights of a largebatch run were trained at this
    data's channels: saying so keeps timm from adapting (and warning about) the patch
    embedding as if they were its published 3-channel weights."""
    if section.init_from:
        from largebatch.safe_load import safetensors_dtypes

        weights = weights_file(section.init_from, scratch, trust=trust)
        safetensors_dtypes(weights)  # a malformed or oversized header is one line, before timm reads it
        channels = _channels_in(weights, name) or data.channels
        return {"file": str(weights), "num_classes": _classes_in(weights, name), "input_size": (channels, data.image_size, data.image_size)}
    return {} if section.pretrained else None


def weights_file(spec: str, scratch: pathlib.Path, *, trust: bool = False) -> pathlib.Path:
    """The ``.safetensors`` file ``model.init_from`` names (a checkpoint's model weights are
    written into ``scratch`` first; a checkpoint is read as data unless ``trust``).

    Raises:
        ConfigError: nothing there, or nothing with model weights.
    """
    from largebatch import checkpoint as ckpt

    path = pathlib.Path(spec).expanduser()
    if glob.has_magic(spec):
        finished = [RunDir(p) for p in glob.glob(str(path)) if RunDir(p).finished]
        if not finished:
            raise ConfigError(
                f"no finished run (a folder holding model.safetensors) matches {spec!r}; {_point_at_a_run()}", key="model.init_from"
            )
        path = max(finished, key=lambda run: run.weights().stat().st_mtime).path
    found = ckpt.read_model_weights(path, trust=trust)
    if found is None:
        raise ConfigError(
            f"{spec!r} is neither a run directory or export folder (with model.safetensors), a .safetensors file nor a checkpoint; "
            f"{_point_at_a_run()}",
            key="model.init_from",
        )
    if isinstance(found, pathlib.Path):
        return found
    target = RunDir(scratch).weights()
    ckpt.save_tensors(found, target)
    return target


def _channels_in(weights: pathlib.Path, name: str) -> int | None:
    """Input channels of the first convolution in ``weights`` (None when it has none)."""
    from safetensors import safe_open
    from timm.models import get_pretrained_cfg_value

    first = get_pretrained_cfg_value(name, "first_conv") or "patch_embed.proj"
    with safe_open(str(weights), framework="pt") as f:
        key = f"{first}.weight"
        shape = f.get_slice(key).get_shape() if key in f.keys() else []
    return shape[1] if len(shape) == 4 else None


def _point_at_a_run(runs: str = "runs") -> str:
    """How to name the weights: ``--set model.init_from=RUN``, with the newest finished runs
    under ``runs/`` as examples."""
    found = sorted((r for r in map(RunDir, glob.glob(f"{runs}/*")) if r.finished), key=lambda r: r.weights().stat().st_mtime)
    examples = f" (finished runs here: {', '.join(str(r) for r in found[-3:])})" if found else ""
    return f"point it at a finished run with --set model.init_from=RUN{examples}"


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
    import torch

    module = inspect.getmodule(timm.models.model_entrypoint(name))
    classes = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj) and issubclass(obj, torch.nn.Module) and obj.__module__ == module.__name__
    ]
    return max(classes, key=lambda c: len(inspect.signature(c.__init__).parameters), default=None)


def _accepted_kwargs(timm: Any, name: str) -> list[str]:
    """Constructor arguments of the model classes in ``name``'s timm module (for hints)."""
    import torch

    module = inspect.getmodule(timm.models.model_entrypoint(name))
    names: set[str] = set()
    for obj in vars(module).values():
        if inspect.isclass(obj) and issubclass(obj, torch.nn.Module) and obj.__module__ == module.__name__:
            names.update(inspect.signature(obj.__init__).parameters)
    return sorted(names - {"self", "args", "kwargs"})
