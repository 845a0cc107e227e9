"""The config schema: every key, its type, default, range and meaning; validation.

Validation runs before any work starts. It fills in defaults, coerces ints to floats
where a float is wanted, and reports the first mistake as a ``ConfigError`` that names
the dotted key, the value received, what is allowed, and the fix: an unknown key gets a
"did you mean" from its siblings.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
from typing import Any

from largebatch.batch_schedule import BATCH_LR_RULES
from largebatch.config.batch_rules import check_batch_schedule
from largebatch.errors import ConfigError

REQUIRED = object()


@dataclasses.dataclass(frozen=True)
class Field:
    """One config value.

    Attributes:
        kind: ``int``, ``float``, ``str``, ``bool``, ``list`` or ``dict`` (a free dict).
        default: the value when the key is absent; ``REQUIRED`` makes it mandatory.
        doc: one line for ``largebatch config keys`` and the generated key reference in docs/configs.md.
        choices: allowed values, if a closed set.
        low / high: inclusive bounds for numbers; ``low_open`` / ``high_open`` make them exclusive.
        nullable: ``None`` is allowed.
        items: for lists, the kind of each item.
        length: for lists, the required length.
    """

    kind: type
    default: Any = REQUIRED
    doc: str = ""
    choices: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    nullable: bool = False
    items: type | None = None
    length: int | None = None


@dataclasses.dataclass(frozen=True)
class Section:
    """A dict of known keys. ``open`` sections also accept keys checked elsewhere (the
    optimizer's against its signature by ``resolve_config``, the model's against timm)."""

    fields: dict[str, Field | Section]
    doc: str = ""
    open: bool = False


# ``torch.compile``'s modes (``torch._inductor.list_mode_options``), for ``cuda.compile_mode``.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

# Parameter names that get no weight decay (``largebatch.optim.param_groups``): biases,
# normalisation weights, position embeddings and class tokens.
DEFAULT_NO_WEIGHT_DECAY: tuple[str, ...] = (
    "*.bias",
    "*norm*.weight",
    "pos_embed",
    "*.pos_embed",
    "cls_token",
    "*.cls_token",
)

SCHEMA = Section(
    {
        "seed": Field(int, 0, "base seed: model init uses it on every rank, training randomness seed + rank", low=0),
        "device": Field(str, "auto", "auto picks hpu, then cuda, then cpu", choices=("auto", "cpu", "cuda", "hpu")),
        "precision": Field(
            str, "auto", "auto: the backend's best (fp32 on cpu, bf16 on cuda/hpu)", choices=("auto", "fp32", "bf16", "fp16")
        ),
        "epochs": Field(int, REQUIRED, "passes over the training split", low=1),
        "max_steps": Field(int, None, "stop after this many optimizer steps (schedules still span epochs)", low=1, nullable=True),
        "steps_per_epoch": Field(
            int, None, "cap on optimizer steps per epoch (default: floor(samples / global batch))", low=1, nullable=True
        ),
        "global_batch_size": Field(int, REQUIRED, "samples per optimizer step, all devices together", low=1),
        "micro_batch_size": Field(int, REQUIRED, "samples per device per forward/backward", low=1),
        "partial_window": Field(str, "drop", "trailing partial accumulation window: drop it, or step on it", choices=("drop", "step")),
        "clip_grad_norm": Field(
            float, None, "clip the global gradient norm once per step, after unscaling (0 or None: off)", low=0, nullable=True
        ),
        "batch_schedule": Section(
            {
                "type": Field(
                    str,
                    "fixed",
                    "fixed: global_batch_size throughout; ramp: grow from start_batch_size to global_batch_size in stages "
                    "by samples seen; adaptive: double the batch when the criterion says the larger one is still efficient",
                    choices=("fixed", "ramp", "adaptive"),
                ),
                "start_batch_size": Field(int, None, "ramp, adaptive: the global batch at the start", low=1, nullable=True),
                "ramp_samples": Field(
                    int,
                    None,
                    "ramp: samples seen when the batch reaches global_batch_size (stages evenly spaced before)",
                    low=1,
                    nullable=True,
                ),
                "increment": Field(
                    int, None, "ramp: samples added to the batch at each stage (None: the batch doubles)", low=1, nullable=True
                ),
                "max_batch_size": Field(int, None, "adaptive: the largest global batch (None: global_batch_size)", low=1, nullable=True),
                "criterion": Field(
                    str,
                    "noise_scale",
                    "adaptive: noise_scale: grow to 2B when factor x B_simple (the noise_scale hook's smoothed estimate) >= 2B; "
                    "branch: fork at B and 2B from the exact state and grow when 2B's held-out loss keeps 1 - branch_tolerance of B's progress",
                    choices=("noise_scale", "branch"),
                ),
                "branch_samples": Field(
                    int,
                    None,
                    "criterion branch: the samples each fork (at B and at 2B) trains on, a multiple of the largest batch",
                    low=1,
                    nullable=True,
                ),
                "branch_tolerance": Field(
                    float,
                    0.2,
                    "criterion branch: the fraction of the B fork's progress (held-out loss) the 2B fork may lose",
                    low=0,
                    high=1,
                    low_open=True,
                    high_open=True,
                ),
                "factor": Field(float, 1.0, "adaptive: multiplies the criterion's critical-batch estimate", low=0, low_open=True),
                "check_every_samples": Field(
                    int, None, "adaptive: check the criterion every N samples (None: every 10 x global_batch_size)", low=1, nullable=True
                ),
                "lr_scaling": Field(
                    str,
                    None,
                    "learning-rate multiplier at batch B: (B / global_batch_size)^(1/2) sqrt, ^1 linear, 1 none, "
                    "adascale AdaScale's gain (1 + B_simple / global_batch_size) / (1 + B_simple / B) from the noise_scale "
                    "hook's estimate (None: sqrt for adamw and lamb, linear for sgd and lars)",
                    choices=BATCH_LR_RULES,
                    nullable=True,
                ),
                "keep_wd_timescale": Field(
                    bool,
                    False,
                    "adamw: scale weight_decay with the batch so that lr x weight_decay / B stays constant: the weights' "
                    "averaging timescale in samples is kept (Bergsma et al. 2025)",
                ),
            },
            "the global batch along training (docs/large-batch.md, Ramped and adaptive batches); every batch is "
            "micro_batch_size x world size x an accumulation, and every schedule follows samples seen",
        ),
        "compile": Field(bool, False, "torch.compile the model"),
        "model": Section(
            {
                "name": Field(str, REQUIRED, "a timm model name, e.g. vit_base_patch16_224"),
                "pretrained": Field(bool, False, "start from timm's published weights for model.name (from timm's cache or the Hub)"),
                "init_from": Field(
                    str,
                    None,
                    "start from these weights: a run directory, an export folder, a .safetensors file or a "
                    "checkpoint; a glob picks the newest finished run; the classifier is re-initialised when "
                    "num_classes differs",
                    nullable=True,
                ),
            },
            "timm model; every other key is a keyword argument of timm.create_model",
            open=True,
        ),
        "task": Section(
            {
                "type": Field(
                    str,
                    "classification",
                    "the training objective and its metrics: 'classification', or your Task subclass as "
                    "'path/file.py:Class' or 'package.module:Class'",
                ),
            },
            "what the model is trained for: the loss of a micro-batch, train and eval metrics (docs/tasks.md); "
            "every other key is a keyword argument of the task class",
            open=True,
        ),
        "optimizer": Section(
            {
                "type": Field(str, "adamw", "optimizer", choices=("adamw", "sgd", "lamb", "lars")),
                "lr": Field(float, REQUIRED, "peak learning rate (before lr_schedule.scaling)", low=0, low_open=True),
                "weight_decay": Field(float, 0.0, "weight decay for the decayed group", low=0),
                "no_weight_decay": Field(
                    list, list(DEFAULT_NO_WEIGHT_DECAY), "fnmatch patterns of parameter names without weight decay", items=str
                ),
                "exclude_1d": Field(bool, True, "no weight decay for parameters with ndim <= 1"),
                "layer_decay": Field(float, None, "layer-wise lr decay for ViTs (None: off)", low=0, high=1, low_open=True, nullable=True),
            },
            "every other key is a keyword argument of the optimizer class",
            open=True,
        ),
        "lr_schedule": Section(
            {
                "type": Field(str, "cosine", "decay after warmup", choices=("linear", "cosine", "polynomial", "constant")),
                "warmup_steps": Field(int, None, "linear warmup length in steps", low=0, nullable=True),
                "warmup_epochs": Field(float, None, "linear warmup length in epochs", low=0, nullable=True),
                "warmup_init_lr": Field(float, 0.0, "learning rate at step 0", low=0),
                "min_lr": Field(float, 0.0, "learning rate at the end of the decay", low=0),
                "power": Field(float, 1.0, "exponent of the polynomial decay", low=0, low_open=True),
                "scaling": Field(str, "none", "scale lr by global batch / base_batch_size", choices=("none", "linear", "sqrt")),
                "base_batch_size": Field(int, None, "the batch size optimizer.lr was tuned at (needed by scaling)", low=1, nullable=True),
            }
        ),
        "data": Section(
            {
                "loader": Field(
                    str,
                    "synthetic",
                    "synthetic, native (TFRecord), dali or mediapipe",
                    choices=("synthetic", "native", "dali", "mediapipe"),
                ),
                "root": Field(str, None, "folder of TFRecord shards", nullable=True),
                "train_split": Field(str, "train", "shard name prefix of the training split"),
                "eval_split": Field(str, "validation", "shard name prefix of the evaluation split"),
                "image_size": Field(int, 224, "side of the square input images", low=1),
                "channels": Field(int, 3, "image channels", choices=(1, 3)),
                "num_classes": Field(int, 1000, "number of classes", low=2),
                "label_offset": Field(int, 0, "subtracted from stored labels (ImageNet TFRecords: 1)"),
                "mean": Field(list, [0.485, 0.456, 0.406], "per-channel mean, 0-1 units", items=float),
                "std": Field(list, [0.229, 0.224, 0.225], "per-channel std, 0-1 units", items=float),
                "num_workers": Field(
                    int, 2, "loader worker processes (0: in the main process); threads for DALI and the media pipeline (at least 1)", low=0
                ),
                "prefetch": Field(int, 2, "batches prefetched per worker", low=1),
                "scale": Field(list, [0.08, 1.0], "RandomResizedCrop area range", items=float, length=2),
                "ratio": Field(list, [0.75, 1.3333333333333333], "RandomResizedCrop aspect range", items=float, length=2),
                "hflip": Field(float, 0.5, "horizontal flip probability", low=0, high=1),
                "interpolation": Field(
                    str,
                    "bilinear",
                    "native: the resize filter of the training crop and the evaluation resize (antialiased); DeiT's recipe uses bicubic",
                    choices=("bilinear", "bicubic"),
                ),
                "auto_augment": Field(
                    str,
                    None,
                    "native: timm's augmentation policy after the crop, e.g. 'rand-m9-mstd0.5-inc1' (RandAugment), "
                    "'original' (AutoAugment), 'augmix-m5-w4-d2'; None: none",
                    nullable=True,
                ),
                "color_jitter": Field(
                    float,
                    None,
                    "native: brightness, contrast and saturation jitter (torchvision ColorJitter); not with auto_augment",
                    nullable=True,
                    low=0,
                ),
                "reprob": Field(float, 0.0, "native: random erasing probability per image (timm RandomErasing)", low=0, high=1),
                "remode": Field(
                    str,
                    "pixel",
                    "random erasing fill: 'const' (zeros), 'rand' (a normal colour per patch), 'pixel' (per pixel)",
                    choices=("const", "rand", "pixel"),
                ),
                "recount": Field(int, 1, "random erasing: up to this many patches per image", low=1),
                "repeated_aug": Field(
                    int, 1, "native, synthetic: copies of each sample per epoch, on different ranks (DeiT's RASampler: 3); 1: off", low=1
                ),
                "eval_crop_ratio": Field(float, 0.875, "centre crop / resize ratio in evaluation", low=0, high=1, low_open=True),
                "verify_crc": Field(bool, True, "check every record's CRC-32C while reading"),
                "cache_decoded": Field(
                    bool,
                    False,
                    "native loader: keep every image's decoded full-size pixels in memory after its first decode (per loader "
                    "process; for small data sets such as Fashion-MNIST, 47 MB); batches are the same bytes as without it",
                ),
                "decode": Field(
                    str,
                    "auto",
                    "native: where JPEGs are decoded: 'cpu' (loader workers, at a reduced DCT scale where the crop allows), "
                    "'device' (workers read and draw crops; the run's device decodes whole micro-batches, nvJPEG on CUDA), "
                    "'auto' ('device' on CUDA when torchvision decodes there and no CPU-only policy is on, else 'cpu')",
                    choices=("auto", "cpu", "device"),
                ),
                "max_pixels": Field(
                    int,
                    50_000_000,
                    "largest image (height x width, read from its JPEG header before decoding) a loader decodes; "
                    "a larger one stops the run naming its record",
                    low=1,
                ),
                "train_samples": Field(
                    int, 50000, "synthetic: the training split's size; TFRecord: used by config show when the shards are absent", low=1
                ),
                "eval_samples": Field(int, 10000, "synthetic: samples in the evaluation split", low=0),
                "synthetic_seed": Field(int, 0, "synthetic: which synthetic data set (the run seed only shuffles it)", low=0),
                "signal": Field(float, 1.0, "synthetic: class signal strength against unit noise", low=0),
            }
        ),
        "mixup": Section(
            {
                "mixup_alpha": Field(float, 0.0, "Beta(alpha, alpha) mixup; 0 disables", low=0),
                "cutmix_alpha": Field(float, 0.0, "Beta(alpha, alpha) CutMix; 0 disables", low=0),
                "prob": Field(float, 1.0, "probability a batch is mixed", low=0, high=1),
                "switch_prob": Field(float, 0.5, "probability of CutMix when both are on", low=0, high=1),
                "label_smoothing": Field(float, 0.0, "label smoothing of the soft targets", low=0, high=1),
            }
        ),
        "eval": Section(
            {
                "interval_epochs": Field(int, 1, "evaluate every N epochs (0: only at the end)", low=0),
                "at_end": Field(bool, True, "evaluate after training"),
                "batch_size": Field(int, None, "evaluation batch per device (default: micro_batch_size)", low=1, nullable=True),
                "cache": Field(
                    bool,
                    False,
                    "keep the evaluation batches (float32, on the device) after the first pass and replay them; "
                    "for small evaluation sets evaluated often",
                ),
            }
        ),
        "ema": Section(
            {
                "decay": Field(
                    float,
                    None,
                    "keep an exponential moving average of the weights with this decay per optimizer step, e.g. 0.99996 (DeiT); None: off",
                    low=0,
                    high=1,
                    low_open=True,
                    high_open=True,
                    nullable=True,
                ),
                "warmup": Field(
                    bool,
                    False,
                    "ramp the decay up as 1 - n^(-2/3) after n optimizer steps, capped at ema.decay (timm's use_warmup)",
                ),
                "eval": Field(bool, True, "evaluate the EMA weights beside the model at every evaluation (eval_ema/...)"),
            },
            "model EMA (timm's ModelEmaV3): updated after every optimizer step, saved in checkpoints, written as "
            "model_ema.safetensors at the end",
        ),
        "nan_guard": Section(
            {
                "action": Field(
                    str,
                    "stop",
                    "a step whose loss or gradients hold NaN or inf: stop (an error line naming the step and the first "
                    "parameter), skip (no update that step), or off (no check); one host sync per step, none with LAMB, "
                    "LARS or a fused AdamW (its read waits a step, largebatch.engine.update)",
                    choices=("stop", "skip", "off"),
                ),
                "max_skips": Field(int, 10, "skip: stop after this many skipped steps in a row", low=1),
            },
            "the non-finite check before every optimizer update (largebatch.engine.update)",
        ),
        "log": Section(
            {
                "interval": Field(int, 10, "log every N optimizer steps", low=1),
                "console": Field(bool, True, "print a line per interval on rank 0"),
                "verbose": Field(bool, False, "show the experiment trackers' own output (MLflow's INFO lines, W&B's banner and summary)"),
            }
        ),
        "checkpoint": Section(
            {
                "interval_steps": Field(int, None, "save every N steps", low=1, nullable=True),
                "interval_epochs": Field(int, 1, "save every N epochs (0: off)", low=0),
                "interval_minutes": Field(float, None, "save every T minutes of training", low=0, low_open=True, nullable=True),
                "keep": Field(int, 3, "keep the last K checkpoints", low=1),
                "at_end": Field(bool, True, "save after training"),
                "async_save": Field(
                    bool,
                    False,
                    "write checkpoints on a background thread from a host-memory copy, so training goes on while they "
                    "are written (the copy costs one checkpoint's size of host memory per writing rank)",
                ),
            }
        ),
        "dist": Section(
            {
                "backend": Field(
                    str,
                    "auto",
                    "process-group backend; auto: gloo on cpu, nccl on cuda, hccl on hpu",
                    choices=("auto", "gloo", "nccl", "hccl"),
                ),
                "strategy": Field(
                    str,
                    "ddp",
                    "ddp: every rank holds the whole model; fsdp: FSDP2 shards parameters, gradients and optimizer state "
                    "(each transformer block, then the root); hsdp: shard within groups of dist.shard_size ranks, "
                    "replicate across groups",
                    choices=("ddp", "fsdp", "hsdp"),
                ),
                "shard_size": Field(
                    int, None, "hsdp: ranks per shard group (e.g. the devices of a node); must divide the world size", low=1, nullable=True
                ),
                "reduce_every_micro_batch": Field(
                    bool,
                    False,
                    "fsdp/hsdp with accumulation: reduce-scatter gradients after every micro-batch, so they stay sharded "
                    "(1/N of the memory) at the cost of one reduction per micro-batch instead of one per step",
                ),
                "timeout_minutes": Field(float, 30.0, "collective timeout", low=0, low_open=True),
                "find_unused_parameters": Field(bool, False, "DDP find_unused_parameters"),
                "bucket_cap_mb": Field(float, 25.0, "DDP gradient bucket size", low=0, low_open=True),
                "gradient_as_bucket_view": Field(bool, True, "DDP gradient_as_bucket_view (saves a gradient copy)"),
                "static_graph": Field(bool, False, "DDP static_graph"),
            }
        ),
        "cuda": Section(
            {
                "tf32": Field(bool, True, "TF32 tensor-core matmuls and convolutions for fp32 math"),
                "fused_attention": Field(bool, True, "timm attention through F.scaled_dot_product_attention (overrides TIMM_FUSED_ATTN)"),
                "compile_mode": Field(
                    str,
                    None,
                    "torch.compile's mode when compile is on (null: torch's default); the suite's training section measures "
                    "each (bench/accelerator_sections.py)",
                    choices=COMPILE_MODES,
                    nullable=True,
                ),
            },
            "settings of the cuda backend",
        ),
        "hpu": Section(
            {
                "mode": Field(
                    str,
                    "lazy",
                    "lazy (PT_HPU_LAZY_MODE=1, mark_step after backward and step), eager, or compile (torch.compile hpu_backend)",
                    choices=("lazy", "eager", "compile"),
                ),
                "fused_optimizer": Field(bool, True, "optimizer.type lamb runs as Habana's FusedLamb when the bridge has it"),
                "fused_clip_norm": Field(bool, True, "clip_grad_norm uses Habana's FusedClipNorm when the bridge has it"),
            },
            "settings of the hpu backend",
        ),
        "slurm": Section(
            {
                "requeue": Field(
                    bool,
                    False,
                    "after a preemption checkpoint (SIGUSR1/SIGUSR2/SIGTERM), rank 0 runs `scontrol requeue $SLURM_JOB_ID`",
                ),
            }
        ),
        "hooks": Field(list, [], "hooks: built-in names, or dict(type=name or 'file.py:Class', **kwargs)"),
    }
)

# Keys users bring from other frameworks, with the fix.
FOREIGN_KEYS = {
    "gradient_accumulation": "accumulation is derived from global_batch_size / (micro_batch_size x world_size); set global_batch_size",
    "batch_size": "set micro_batch_size (per device) and global_batch_size (per optimizer step)",
    "num_epochs": "the key is epochs",
    "fp16": "set precision = 'fp16' (or 'bf16', 'fp32', 'auto')",
    "lr_scheduler": "the key is lr_schedule",
    "clip_grad": "the key is clip_grad_norm",
}


def validate(config: dict[str, Any]) -> dict[str, Any]:
    """Check ``config`` against the schema and return a copy with defaults filled in.

    Raises:
        ConfigError: the first unknown key, wrong type, out-of-range value or broken
            cross-field rule, naming the key and the fix.
    """
    out = _check_section(SCHEMA, copy.deepcopy(config), prefix="")
    _check_rules(out)
    return out


def validate_section(name: str, values: dict[str, Any]) -> dict[str, Any]:
    """Check top-level section ``name`` alone and return a copy with defaults filled in
    (the rules across sections are ``validate``'s)."""
    spec = SCHEMA.fields[name]
    if not isinstance(spec, Section):
        raise KeyError(f"{name!r} is not a section")
    return _check_section(spec, copy.deepcopy(values), prefix=f"{name}.")


def describe_keys(section: Section, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """Every key under ``section`` as ``(dotted key, kind, default, meaning)`` rows, in
    schema order, for ``largebatch config keys``. A section gets its own row (kind
    ``section``; ``open`` ones say their other keys are checked by the component that
    takes them), then its keys."""
    rows = []
    for name, spec in section.fields.items():
        key = f"{prefix}{name}"
        if isinstance(spec, Section):
            doc = spec.doc + (" (other keys: checked by the component they go to)" if spec.open else "")
            rows.append((key, "section", "", doc.strip()))
            rows.extend(describe_keys(spec, f"{key}."))
            continue
        kind = spec.kind.__name__ + (f"[{spec.items.__name__}]" if spec.items else "") + ("|None" if spec.nullable else "")
        default = "required" if spec.default is REQUIRED else repr(spec.default)
        doc = spec.doc
        if spec.choices:
            doc += f" (one of: {', '.join(map(str, spec.choices))})"
        rows.append((key, kind, default, doc))
    return rows


def check_argument(rule: str | Field, value: Any, key: str) -> Any:
    """Check a value passed to a class (a hook's argument) as the config key ``rule``
    names (``'checkpoint.keep'``) or as the ``Field`` given; errors name ``key``
    (``hooks[0].keep``). Returns the value as validation leaves it.

    Raises:
        ConfigError: a value of the wrong type or out of range.
    """
    spec: Field | Section | None = SCHEMA
    if isinstance(rule, str):
        for part in rule.split("."):
            spec = spec.fields.get(part) if isinstance(spec, Section) else None
    else:
        spec = rule
    if not isinstance(spec, Field):
        raise KeyError(f"{rule!r} is not a config key")
    return _check_value(spec, value, key)


def default_of(dotted: str) -> Any:
    """The schema's default for a dotted key (``REQUIRED`` for a required key or one the
    schema does not know)."""
    spec: Field | Section | None = SCHEMA
    for part in dotted.split("."):
        spec = spec.fields.get(part) if isinstance(spec, Section) else None
    return spec.default if isinstance(spec, Field) else REQUIRED


def _check_section(section: Section, values: Any, prefix: str) -> dict[str, Any]:
    if not isinstance(values, dict):
        raise ConfigError(f"must be a dict, got {type(values).__name__} {values!r}", key=prefix.rstrip("."))
    out: dict[str, Any] = {}
    for key, value in values.items():
        spec = section.fields.get(key)
        if spec is None:
            if section.open:
                out[key] = value
                continue
            raise ConfigError(_unknown_key_message(key, section, prefix), key=f"{prefix}{key}")
        out[key] = _check_value(spec, value, f"{prefix}{key}")
    for key, spec in section.fields.items():
        if key in out:
            continue
        if isinstance(spec, Section):
            out[key] = _check_section(spec, {}, f"{prefix}{key}.")
        elif spec.default is REQUIRED:
            raise ConfigError(f"is required{': ' + spec.doc if spec.doc else ''}", key=f"{prefix}{key}")
        else:
            out[key] = copy.deepcopy(spec.default)
    # Schema order first, then the open section's extra keys, so dumps read the same way.
    ordered = {key: out[key] for key in section.fields if key in out}
    ordered.update((key, value) for key, value in out.items() if key not in ordered)
    return ordered


def _unknown_key_message(key: str, section: Section, prefix: str) -> str:
    if not prefix and key in FOREIGN_KEYS:
        return f"unknown key; {FOREIGN_KEYS[key]}"
    close = difflib.get_close_matches(key, list(section.fields), n=1, cutoff=0.6)
    if close:
        return f"unknown key; did you mean {prefix}{close[0]!r}?"
    known = ", ".join(sorted(section.fields))
    return f"unknown key; the keys here are: {known}"


def _check_value(spec: Field | Section, value: Any, key: str) -> Any:
    if isinstance(spec, Section):
        return _check_section(spec, value, f"{key}.")
    if value is None:
        if spec.nullable or spec.default is None:
            return None
        raise ConfigError(f"must not be None; expected {_kind_name(spec.kind)}", key=key)
    value = _coerce(spec.kind, value, key)
    if spec.kind is list:
        if spec.length is not None and len(value) != spec.length:
            raise ConfigError(f"must have {spec.length} items, got {len(value)}: {value!r}", key=key)
        if spec.items is not None:
            value = [_coerce(spec.items, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if spec.choices is not None and value not in spec.choices:
        allowed = ", ".join(repr(c) for c in spec.choices)
        close = difflib.get_close_matches(str(value), [str(c) for c in spec.choices], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"got {value!r}; allowed: {allowed}{hint}", key=key)
    if spec.low is not None and (value < spec.low or (spec.low_open and value == spec.low)):
        bound = f"> {spec.low}" if spec.low_open else f">= {spec.low}"
        raise ConfigError(f"got {value!r}; must be {bound}", key=key)
    if spec.high is not None and (value > spec.high or (spec.high_open and value == spec.high)):
        raise ConfigError(f"got {value!r}; must be {'<' if spec.high_open else '<='} {spec.high}", key=key)
    return value


def _coerce(kind: type, value: Any, key: str) -> Any:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, bool):
        raise ConfigError(f"got {value!r}; expected an integer", key=key)
    if kind is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, kind):
        raise ConfigError(f"got {type(value).__name__} {value!r}; expected {_kind_name(kind)}", key=key)
    return value


def _kind_name(kind: type) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "True or False", list: "a list", dict: "a dict"}[kind]


def _check_rules(cfg: dict[str, Any]) -> None:
    """Rules that involve more than one key."""
    if cfg["micro_batch_size"] > cfg["global_batch_size"]:
        raise ConfigError(
            f"micro_batch_size {cfg['micro_batch_size']} is larger than global_batch_size "
            f"{cfg['global_batch_size']}; lower micro_batch_size",
            key="micro_batch_size",
        )
    schedule = cfg["lr_schedule"]
    if schedule["warmup_steps"] is not None and schedule["warmup_epochs"] is not None:
        raise ConfigError("set warmup_steps or warmup_epochs, not both", key="lr_schedule.warmup_epochs")
    if schedule["scaling"] != "none" and schedule["base_batch_size"] is None:
        raise ConfigError(
            f"scaling {schedule['scaling']!r} needs the batch size optimizer.lr was tuned at; set lr_schedule.base_batch_size",
            key="lr_schedule.base_batch_size",
        )
    if schedule["min_lr"] > cfg["optimizer"]["lr"]:
        raise ConfigError(
            f"min_lr {schedule['min_lr']} is above optimizer.lr {cfg['optimizer']['lr']}; lower min_lr",
            key="lr_schedule.min_lr",
        )
    _check_data_rules(cfg)
    check_batch_schedule(cfg)
    if cfg["optimizer"].get("max_grad_norm") is not None and cfg["clip_grad_norm"]:
        raise ConfigError(
            f"clips inside the optimizer while clip_grad_norm {cfg['clip_grad_norm']} clips once per step already; set one of them to null",
            key="optimizer.max_grad_norm",
        )
    hooks = cfg["hooks"]
    for i, spec in enumerate(hooks):
        if isinstance(spec, str):
            continue
        if not isinstance(spec, dict) or not isinstance(spec.get("type"), str):
            raise ConfigError(
                f"got {spec!r}; a hook is a name ('logger') or dict(type='name' or 'path/file.py:Class', **kwargs)",
                key=f"hooks[{i}]",
            )


def _check_data_rules(cfg: dict[str, Any]) -> None:
    """Rules between the data and the model or mixup."""
    data = cfg["data"]
    for name in ("mean", "std"):
        if len(data[name]) != data["channels"]:
            raise ConfigError(
                f"has {len(data[name])} values for {data['channels']} channel(s); give one per channel",
                key=f"data.{name}",
            )
    if data["loader"] != "synthetic" and not data["root"]:
        raise ConfigError(f"loader {data['loader']!r} reads TFRecord shards; set data.root to their folder", key="data.root")
    if data["decode"] != "auto":
        _check_decode(data)
    model = cfg["model"]
    for model_key, data_key in (("num_classes", "num_classes"), ("img_size", "image_size"), ("in_chans", "channels")):
        if model_key in model and model[model_key] != data[data_key]:
            raise ConfigError(
                f"is {model[model_key]} but data.{data_key} is {data[data_key]}; make them equal or drop model.{model_key}",
                key=f"model.{model_key}",
            )
    mix = cfg["mixup"]
    if mix["cutmix_alpha"] > 0 and data["image_size"] < 2:
        raise ConfigError("CutMix needs images of at least 2 pixels", key="mixup.cutmix_alpha")


def _check_decode(data: dict[str, Any]) -> None:
    """An explicit ``data.decode``: the native loader's, and without the policies that need pixels in the workers."""
    if data["loader"] != "native":
        raise ConfigError(
            f"is {data['decode']!r}, but data.decode applies to data.loader='native' only; data.loader={data['loader']!r} "
            "decodes its own way (DALI with nvJPEG on CUDA, the media pipeline on the Gaudi); leave data.decode at 'auto'",
            key="data.decode",
        )
    if data["decode"] == "device":
        for key in ("auto_augment", "color_jitter", "cache_decoded"):
            if data[key]:
                raise ConfigError(
                    f"is 'device', but data.{key} works on pixels in the loader workers, which decode='device' leaves "
                    f"undecoded; set data.decode to 'cpu' (or 'auto') or unset data.{key}",
                    key="data.decode",
                )
