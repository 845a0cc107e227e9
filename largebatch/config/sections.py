"""The config's sections as frozen dataclasses. Generated from largebatch/config/schema.py by
``python -m largebatch.config.generate``: edit the schema, then regenerate (a test fails when they differ).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from largebatch.config.frozen import ConfigSection, FrozenDict, field_meta, schema_section
from largebatch.config.schema import Section

__all__ = ["Config", "BatchScheduleConfig", "ModelConfig", "TaskConfig", "OptimizerConfig", "LrScheduleConfig", "DataConfig", "MixupConfig", "EvalConfig", "EmaConfig", "NanGuardConfig", "LogConfig", "CheckpointConfig", "DistConfig", "CudaConfig", "HpuConfig", "SlurmConfig"]


@dataclasses.dataclass(frozen=True)
class BatchScheduleConfig(ConfigSection):
    """the global batch along training (docs/large-batch.md, Ramped and adaptive batches); every batch is micro_batch_size x world size x an accumulation, and every schedule follows samples seen"""

    _schema: ClassVar[Section] = schema_section("batch_schedule")
    type: str = dataclasses.field(default="fixed", metadata=field_meta("batch_schedule.type"))
    start_batch_size: int | None = dataclasses.field(default=None, metadata=field_meta("batch_schedule.start_batch_size"))
    ramp_samples: int | None = dataclasses.field(default=None, metadata=field_meta("batch_schedule.ramp_samples"))
    increment: int | None = dataclasses.field(default=None, metadata=field_meta("batch_schedule.increment"))
    max_batch_size: int | None = dataclasses.field(default=None, metadata=field_meta("batch_schedule.max_batch_size"))
    criterion: str = dataclasses.field(default="noise_scale", metadata=field_meta("batch_schedule.criterion"))
    branch_samples: int | None = dataclasses.field(default=None, metadata=field_meta("batch_schedule.branch_samples"))
    branch_tolerance: float = dataclasses.field(default=0.2, metadata=field_meta("batch_schedule.branch_tolerance"))
    factor: float = dataclasses.field(default=1.0, metadata=field_meta("batch_schedule.factor"))
    check_every_samples: int | None = dataclasses.field(default=None, metadata=field_meta("batch_schedule.check_every_samples"))
    lr_scaling: str | None = dataclasses.field(default=None, metadata=field_meta("batch_schedule.lr_scaling"))
    keep_wd_timescale: bool = dataclasses.field(default=False, metadata=field_meta("batch_schedule.keep_wd_timescale"))


@dataclasses.dataclass(frozen=True)
class ModelConfig(ConfigSection):
    """timm model; every other key is a keyword argument of timm.create_model"""

    _schema: ClassVar[Section] = schema_section("model")
    name: str = dataclasses.field(metadata=field_meta("model.name"))
    pretrained: bool = dataclasses.field(default=False, metadata=field_meta("model.pretrained"))
    init_from: str | None = dataclasses.field(default=None, metadata=field_meta("model.init_from"))
    extra: Mapping[str, Any] = dataclasses.field(default_factory=FrozenDict)


@dataclasses.dataclass(frozen=True)
class TaskConfig(ConfigSection):
    """what the model is trained for: the loss of a micro-batch, train and eval metrics (docs/tasks.md); every other key is a keyword argument of the task class"""

    _schema: ClassVar[Section] = schema_section("task")
    type: str = dataclasses.field(default="classification", metadata=field_meta("task.type"))
    extra: Mapping[str, Any] = dataclasses.field(default_factory=FrozenDict)


@dataclasses.dataclass(frozen=True)
class OptimizerConfig(ConfigSection):
    """every other key is a keyword argument of the optimizer class"""

    _schema: ClassVar[Section] = schema_section("optimizer")
    lr: float = dataclasses.field(metadata=field_meta("optimizer.lr"))
    type: str = dataclasses.field(default="adamw", metadata=field_meta("optimizer.type"))
    weight_decay: float = dataclasses.field(default=0.0, metadata=field_meta("optimizer.weight_decay"))
    no_weight_decay: tuple[str, ...] = dataclasses.field(default=("*.bias", "*norm*.weight", "pos_embed", "*.pos_embed", "cls_token", "*.cls_token"), metadata=field_meta("optimizer.no_weight_decay"))
    exclude_1d: bool = dataclasses.field(default=True, metadata=field_meta("optimizer.exclude_1d"))
    layer_decay: float | None = dataclasses.field(default=None, metadata=field_meta("optimizer.layer_decay"))
    extra: Mapping[str, Any] = dataclasses.field(default_factory=FrozenDict)


@dataclasses.dataclass(frozen=True)
class LrScheduleConfig(ConfigSection):
    """The ``lr_schedule`` section."""

    _schema: ClassVar[Section] = schema_section("lr_schedule")
    type: str = dataclasses.field(default="cosine", metadata=field_meta("lr_schedule.type"))
    warmup_steps: int | None = dataclasses.field(default=None, metadata=field_meta("lr_schedule.warmup_steps"))
    warmup_epochs: float | None = dataclasses.field(default=None, metadata=field_meta("lr_schedule.warmup_epochs"))
    warmup_init_lr: float = dataclasses.field(default=0.0, metadata=field_meta("lr_schedule.warmup_init_lr"))
    min_lr: float = dataclasses.field(default=0.0, metadata=field_meta("lr_schedule.min_lr"))
    power: float = dataclasses.field(default=1.0, metadata=field_meta("lr_schedule.power"))
    scaling: str = dataclasses.field(default="none", metadata=field_meta("lr_schedule.scaling"))
    base_batch_size: int | None = dataclasses.field(default=None, metadata=field_meta("lr_schedule.base_batch_size"))


@dataclasses.dataclass(frozen=True)
class DataConfig(ConfigSection):
    """The ``data`` section."""

    _schema: ClassVar[Section] = schema_section("data")
    loader: str = dataclasses.field(default="synthetic", metadata=field_meta("data.loader"))
    root: str | None = dataclasses.field(default=None, metadata=field_meta("data.root"))
    train_split: str = dataclasses.field(default="train", metadata=field_meta("data.train_split"))
    eval_split: str = dataclasses.field(default="validation", metadata=field_meta("data.eval_split"))
    image_size: int = dataclasses.field(default=224, metadata=field_meta("data.image_size"))
    channels: int = dataclasses.field(default=3, metadata=field_meta("data.channels"))
    num_classes: int = dataclasses.field(default=1000, metadata=field_meta("data.num_classes"))
    label_offset: int = dataclasses.field(default=0, metadata=field_meta("data.label_offset"))
    mean: tuple[float, ...] = dataclasses.field(default=(0.485, 0.456, 0.406), metadata=field_meta("data.mean"))
    std: tuple[float, ...] = dataclasses.field(default=(0.229, 0.224, 0.225), metadata=field_meta("data.std"))
    num_workers: int = dataclasses.field(default=2, metadata=field_meta("data.num_workers"))
    prefetch: int = dataclasses.field(default=2, metadata=field_meta("data.prefetch"))
    scale: tuple[float, ...] = dataclasses.field(default=(0.08, 1.0), metadata=field_meta("data.scale"))
    ratio: tuple[float, ...] = dataclasses.field(default=(0.75, 1.3333333333333333), metadata=field_meta("data.ratio"))
    hflip: float = dataclasses.field(default=0.5, metadata=field_meta("data.hflip"))
    interpolation: str = dataclasses.field(default="bilinear", metadata=field_meta("data.interpolation"))
    auto_augment: str | None = dataclasses.field(default=None, metadata=field_meta("data.auto_augment"))
    color_jitter: float | None = dataclasses.field(default=None, metadata=field_meta("data.color_jitter"))
    reprob: float = dataclasses.field(default=0.0, metadata=field_meta("data.reprob"))
    remode: str = dataclasses.field(default="pixel", metadata=field_meta("data.remode"))
    recount: int = dataclasses.field(default=1, metadata=field_meta("data.recount"))
    repeated_aug: int = dataclasses.field(default=1, metadata=field_meta("data.repeated_aug"))
    eval_crop_ratio: float = dataclasses.field(default=0.875, metadata=field_meta("data.eval_crop_ratio"))
    verify_crc: bool = dataclasses.field(default=True, metadata=field_meta("data.verify_crc"))
    cache_decoded: bool = dataclasses.field(default=False, metadata=field_meta("data.cache_decoded"))
    decode: str = dataclasses.field(default="auto", metadata=field_meta("data.decode"))
    max_pixels: int = dataclasses.field(default=50000000, metadata=field_meta("data.max_pixels"))
    train_samples: int = dataclasses.field(default=50000, metadata=field_meta("data.train_samples"))
    eval_samples: int = dataclasses.field(default=10000, metadata=field_meta("data.eval_samples"))
    synthetic_seed: int = dataclasses.field(default=0, metadata=field_meta("data.synthetic_seed"))
    signal: float = dataclasses.field(default=1.0, metadata=field_meta("data.signal"))


@dataclasses.dataclass(frozen=True)
class MixupConfig(ConfigSection):
    """The ``mixup`` section."""

    _schema: ClassVar[Section] = schema_section("mixup")
    mixup_alpha: float = dataclasses.field(default=0.0, metadata=field_meta("mixup.mixup_alpha"))
    cutmix_alpha: float = dataclasses.field(default=0.0, metadata=field_meta("mixup.cutmix_alpha"))
    prob: float = dataclasses.field(default=1.0, metadata=field_meta("mixup.prob"))
    switch_prob: float = dataclasses.field(default=0.5, metadata=field_meta("mixup.switch_prob"))
    label_smoothing: float = dataclasses.field(default=0.0, metadata=field_meta("mixup.label_smoothing"))


@dataclasses.dataclass(frozen=True)
class EvalConfig(ConfigSection):
    """The ``eval`` section."""

    _schema: ClassVar[Section] = schema_section("eval")
    interval_epochs: int = dataclasses.field(default=1, metadata=field_meta("eval.interval_epochs"))
    at_end: bool = dataclasses.field(default=True, metadata=field_meta("eval.at_end"))
    batch_size: int | None = dataclasses.field(default=None, metadata=field_meta("eval.batch_size"))
    cache: bool = dataclasses.field(default=False, metadata=field_meta("eval.cache"))


@dataclasses.dataclass(frozen=True)
class EmaConfig(ConfigSection):
    """model EMA (timm's ModelEmaV3): updated after every optimizer step, saved in checkpoints, written as model_ema.safetensors at the end"""

    _schema: ClassVar[Section] = schema_section("ema")
    decay: float | None = dataclasses.field(default=None, metadata=field_meta("ema.decay"))
    warmup: bool = dataclasses.field(default=False, metadata=field_meta("ema.warmup"))
    eval: bool = dataclasses.field(default=True, metadata=field_meta("ema.eval"))


@dataclasses.dataclass(frozen=True)
class NanGuardConfig(ConfigSection):
    """the non-finite check before every optimizer update (largebatch.engine.update)"""

    _schema: ClassVar[Section] = schema_section("nan_guard")
    action: str = dataclasses.field(default="stop", metadata=field_meta("nan_guard.action"))
    max_skips: int = dataclasses.field(default=10, metadata=field_meta("nan_guard.max_skips"))


@dataclasses.dataclass(frozen=True)
class LogConfig(ConfigSection):
    """The ``log`` section."""

    _schema: ClassVar[Section] = schema_section("log")
    interval: int = dataclasses.field(default=10, metadata=field_meta("log.interval"))
    console: bool = dataclasses.field(default=True, metadata=field_meta("log.console"))
    verbose: bool = dataclasses.field(default=False, metadata=field_meta("log.verbose"))


@dataclasses.dataclass(frozen=True)
class CheckpointConfig(ConfigSection):
    """The ``checkpoint`` section."""

    _schema: ClassVar[Section] = schema_section("checkpoint")
    interval_steps: int | None = dataclasses.field(default=None, metadata=field_meta("checkpoint.interval_steps"))
    interval_epochs: int = dataclasses.field(default=1, metadata=field_meta("checkpoint.interval_epochs"))
    interval_minutes: float | None = dataclasses.field(default=None, metadata=field_meta("checkpoint.interval_minutes"))
    keep: int = dataclasses.field(default=3, metadata=field_meta("checkpoint.keep"))
    at_end: bool = dataclasses.field(default=True, metadata=field_meta("checkpoint.at_end"))
    async_save: bool = dataclasses.field(default=False, metadata=field_meta("checkpoint.async_save"))


@dataclasses.dataclass(frozen=True)
class DistConfig(ConfigSection):
    """The ``dist`` section."""

    _schema: ClassVar[Section] = schema_section("dist")
    backend: str = dataclasses.field(default="auto", metadata=field_meta("dist.backend"))
    strategy: str = dataclasses.field(default="ddp", metadata=field_meta("dist.strategy"))
    shard_size: int | None = dataclasses.field(default=None, metadata=field_meta("dist.shard_size"))
    reduce_every_micro_batch: bool = dataclasses.field(default=False, metadata=field_meta("dist.reduce_every_micro_batch"))
    timeout_minutes: float = dataclasses.field(default=30.0, metadata=field_meta("dist.timeout_minutes"))
    find_unused_parameters: bool = dataclasses.field(default=False, metadata=field_meta("dist.find_unused_parameters"))
    bucket_cap_mb: float = dataclasses.field(default=25.0, metadata=field_meta("dist.bucket_cap_mb"))
    gradient_as_bucket_view: bool = dataclasses.field(default=True, metadata=field_meta("dist.gradient_as_bucket_view"))
    static_graph: bool = dataclasses.field(default=False, metadata=field_meta("dist.static_graph"))


@dataclasses.dataclass(frozen=True)
class CudaConfig(ConfigSection):
    """settings of the cuda backend"""

    _schema: ClassVar[Section] = schema_section("cuda")
    tf32: bool = dataclasses.field(default=True, metadata=field_meta("cuda.tf32"))
    fused_attention: bool = dataclasses.field(default=True, metadata=field_meta("cuda.fused_attention"))
    compile_mode: str | None = dataclasses.field(default=None, metadata=field_meta("cuda.compile_mode"))


@dataclasses.dataclass(frozen=True)
class HpuConfig(ConfigSection):
    """settings of the hpu backend"""

    _schema: ClassVar[Section] = schema_section("hpu")
    mode: str = dataclasses.field(default="lazy", metadata=field_meta("hpu.mode"))
    fused_optimizer: bool = dataclasses.field(default=True, metadata=field_meta("hpu.fused_optimizer"))
    fused_clip_norm: bool = dataclasses.field(default=True, metadata=field_meta("hpu.fused_clip_norm"))


@dataclasses.dataclass(frozen=True)
class SlurmConfig(ConfigSection):
    """The ``slurm`` section."""

    _schema: ClassVar[Section] = schema_section("slurm")
    requeue: bool = dataclasses.field(default=False, metadata=field_meta("slurm.requeue"))


@dataclasses.dataclass(frozen=True)
class Config(ConfigSection):
    """The whole config."""

    _schema: ClassVar[Section] = schema_section("")
    epochs: int = dataclasses.field(metadata=field_meta("epochs"))
    global_batch_size: int = dataclasses.field(metadata=field_meta("global_batch_size"))
    micro_batch_size: int = dataclasses.field(metadata=field_meta("micro_batch_size"))
    model: ModelConfig
    optimizer: OptimizerConfig
    seed: int = dataclasses.field(default=0, metadata=field_meta("seed"))
    device: str = dataclasses.field(default="auto", metadata=field_meta("device"))
    precision: str = dataclasses.field(default="auto", metadata=field_meta("precision"))
    max_steps: int | None = dataclasses.field(default=None, metadata=field_meta("max_steps"))
    steps_per_epoch: int | None = dataclasses.field(default=None, metadata=field_meta("steps_per_epoch"))
    partial_window: str = dataclasses.field(default="drop", metadata=field_meta("partial_window"))
    clip_grad_norm: float | None = dataclasses.field(default=None, metadata=field_meta("clip_grad_norm"))
    batch_schedule: BatchScheduleConfig = dataclasses.field(default_factory=BatchScheduleConfig)
    compile: bool = dataclasses.field(default=False, metadata=field_meta("compile"))
    task: TaskConfig = dataclasses.field(default_factory=TaskConfig)
    lr_schedule: LrScheduleConfig = dataclasses.field(default_factory=LrScheduleConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    mixup: MixupConfig = dataclasses.field(default_factory=MixupConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    ema: EmaConfig = dataclasses.field(default_factory=EmaConfig)
    nan_guard: NanGuardConfig = dataclasses.field(default_factory=NanGuardConfig)
    log: LogConfig = dataclasses.field(default_factory=LogConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    dist: DistConfig = dataclasses.field(default_factory=DistConfig)
    cuda: CudaConfig = dataclasses.field(default_factory=CudaConfig)
    hpu: HpuConfig = dataclasses.field(default_factory=HpuConfig)
    slurm: SlurmConfig = dataclasses.field(default_factory=SlurmConfig)
    hooks: tuple[Any, ...] = dataclasses.field(default=(), metadata=field_meta("hooks"))
