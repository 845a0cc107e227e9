"""The global batch as Colossal-AI computes it, and the micro-batch that keeps it here.

Colossal-AI's legacy engine splits the devices into tensor x pipeline x data-parallel
groups: ``data-parallel size = world size / (tensor size x pipeline size)``
(``parallel=dict(pipeline=P, tensor=dict(size=T, mode=...))``; both 1 when absent).
``BATCH_SIZE`` is the batch of one data-parallel rank, and an optimizer step sees
``BATCH_SIZE x data-parallel size x gradient_accumulation`` samples (what its ViT
example's ``TotalBatchsizeHook`` logs). The data-parallel size needs the world size, so
the import asks for ``--world-size`` unless ``parallel.data`` or ``TOTAL_BATCH_SIZE``
fixes it. Here every device is data-parallel and holds the whole model: the same global
batch on the same devices runs with ``micro_batch_size`` at most ``BATCH_SIZE`` (the
largest that divides each device's share).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from largebatch.errors import ConfigError
from largebatch.importers.colossalai.builder import Builder
from largebatch.importers.colossalai.reader import ColossalConfig


@dataclasses.dataclass(frozen=True)
class Layout:
    """Colossal-AI's parallel sizes: tensor, pipeline, and the data-parallel size if stated."""

    tensor: int
    pipeline: int
    data: int | None

    @property
    def model_parallel(self) -> int:
        return self.tensor * self.pipeline


def _size(value: Any, key: str, cfg: ColossalConfig) -> int | None:
    size = value.get("size") if isinstance(value, dict) else value
    if size is None:
        return None
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ConfigError(f"got {value!r}; Colossal-AI takes an integer >= 1 or dict(size=...)", key=key, path=str(cfg.path))
    return size


def parallel_layout(cfg: ColossalConfig) -> Layout:
    """The sizes of the config's ``parallel`` dict.

    Raises:
        ConfigError: ``parallel`` or one of its sizes has the wrong shape.
    """
    parallel = cfg.values.get("parallel") or {}
    if not isinstance(parallel, dict):
        raise ConfigError(
            f"got {parallel!r}; Colossal-AI takes dict(pipeline=..., tensor=dict(size=..., mode=...))", key="parallel", path=str(cfg.path)
        )
    sizes = {key: _size(parallel.get(key), f"parallel.{key}", cfg) for key in ("tensor", "pipeline", "data")}
    return Layout(sizes["tensor"] or 1, sizes["pipeline"] or 1, sizes["data"])


def _positive_int(cfg: ColossalConfig, name: str, default: int | None = None) -> int | None:
    value = cfg.values.get(name, default)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ConfigError(f"got {value!r}; expected an integer >= 1", key=name, path=str(cfg.path))
    return value


def world_size_of(cfg: ColossalConfig, layout: Layout, world_size: int | None) -> tuple[int | None, str]:
    """The world size and where it comes from (``--world-size`` or ``parallel.data``).

    Raises:
        ConfigError: the world size does not split into tensor x pipeline groups, or
            disagrees with ``parallel.data``.
    """
    if world_size is None:
        if layout.data is None:
            return None, ""
        return layout.data * layout.model_parallel, f"parallel.data {layout.data} x tensor {layout.tensor} x pipeline {layout.pipeline}"
    if world_size % layout.model_parallel:
        raise ConfigError(
            f"{world_size} devices do not split into groups of tensor {layout.tensor} x pipeline {layout.pipeline}; "
            f"give a multiple of {layout.model_parallel}",
            key="--world-size",
        )
    if layout.data is not None and world_size != layout.data * layout.model_parallel:
        raise ConfigError(
            f"{world_size} devices, but parallel.data {layout.data} x tensor {layout.tensor} x pipeline {layout.pipeline} "
            f"in {cfg.path.name} is {layout.data * layout.model_parallel}; give --world-size {layout.data * layout.model_parallel}",
            key="--world-size",
        )
    return world_size, "--world-size"


def largest_divisor_at_most(number: int, limit: int) -> int:
    """The largest divisor of ``number`` that is at most ``limit``."""
    return max(d for d in range(1, min(number, limit) + 1) if number % d == 0)


def map_batch(b: Builder, cfg: ColossalConfig, world_size: int | None) -> int | None:
    """Set ``global_batch_size`` and ``micro_batch_size``; return the world size used.

    Raises:
        ConfigError: the world size is needed and not known, or the numbers do not divide.
    """
    layout = parallel_layout(cfg)
    world, world_origin = world_size_of(cfg, layout, world_size)
    accumulation = _positive_int(cfg, "gradient_accumulation", 1) or 1
    batch, total = _positive_int(cfg, "BATCH_SIZE"), _positive_int(cfg, "TOTAL_BATCH_SIZE")
    b.used.update({"BATCH_SIZE", "TOTAL_BATCH_SIZE", "gradient_accumulation"})
    accumulation_text = (
        cfg.stated("gradient_accumulation") if "gradient_accumulation" in cfg.values else "gradient_accumulation 1 (not set)"
    )
    if batch is None:
        if total is not None:
            b.set("global_batch_size", total, cfg.stated("TOTAL_BATCH_SIZE"))
        return world
    if world is None:
        if total is None:
            raise ConfigError(
                f"the global batch is BATCH_SIZE {batch} x gradient_accumulation {accumulation} x the data-parallel size, which is "
                f"the number of devices / (tensor {layout.tensor} x pipeline {layout.pipeline}); give --world-size N, the number "
                "of devices the config ran on",
                path=str(cfg.path),
            )
        b.set("global_batch_size", total, cfg.stated("TOTAL_BATCH_SIZE"))
        b.set("micro_batch_size", batch, f"{cfg.stated('BATCH_SIZE')}, per device")
        return None
    data_parallel = world // layout.model_parallel
    global_batch = batch * data_parallel * accumulation
    split = f"= {world} devices"
    if layout.model_parallel > 1:
        split += f" / (tensor {layout.tensor} x pipeline {layout.pipeline})"
    split += f", {world_origin}"
    b.set(
        "global_batch_size",
        global_batch,
        f"{cfg.stated('BATCH_SIZE')} x data-parallel size {data_parallel} ({split}) x {accumulation_text}",
    )
    if total is not None and total != global_batch:
        b.skip("TOTAL_BATCH_SIZE", total, f"the file's own constant: Colossal-AI's global batch is {global_batch} (see global_batch_size)")
    if global_batch % world:
        raise ConfigError(
            f"Colossal-AI's global batch {global_batch} does not split evenly over {world} devices, each holding the whole model here; "
            "give --set global_batch_size=N with N a multiple of the world size",
            path=str(cfg.path),
        )
    per_device = global_batch // world
    micro = largest_divisor_at_most(per_device, batch)
    why = f"{cfg.stated('BATCH_SIZE')}, per device"
    if micro != batch:
        why = (
            f"{cfg.stated('BATCH_SIZE')} was split over tensor x pipeline {layout.model_parallel} devices; here each device "
            f"holds the whole model and takes {per_device} samples a step, in micro-batches of {micro} "
            f"(accumulation {per_device // micro}): lower micro_batch_size if it does not fit"
        )
    b.set("micro_batch_size", micro, why)
    return world


def map_parallel(b: Builder, cfg: ColossalConfig) -> None:
    """List tensor and pipeline parallelism, which have no equivalent here."""
    parallel = cfg.values.get("parallel") or {}
    b.used.add("parallel")
    nearest = (
        "here every device runs the whole model (dist.strategy='ddp'); dist.strategy='fsdp' shards it across devices "
        "instead of splitting layers, the nearest (with precision 'bf16' or 'fp32': fsdp does not take fp16)"
    )
    layout = parallel_layout(cfg)
    if "tensor" in parallel:
        mode = parallel["tensor"].get("mode") if isinstance(parallel["tensor"], dict) else None
        what = f"{mode} tensor parallelism" if mode else "tensor parallelism"
        b.skip("parallel.tensor", parallel["tensor"], f"{what} over {layout.tensor} devices is not offered; {nearest}")
    if "pipeline" in parallel:
        b.skip("parallel.pipeline", parallel["pipeline"], f"pipeline parallelism over {layout.pipeline} stages is not offered; {nearest}")
    for key in sorted(set(parallel) - {"tensor", "pipeline", "data"}):
        b.skip(f"parallel.{key}", parallel[key], "not a parallel mode offered here")
