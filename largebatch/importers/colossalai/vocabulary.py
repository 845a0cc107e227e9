"""The names of Colossal-AI's legacy configs and ViT examples, and what each is here.

Colossal-AI's legacy engine reads a few lower-case names of the config itself
(``fp16``, ``gradient_accumulation``, ``clip_grad_norm``, ``parallel``, ``zero``,
``cudnn_benchmark``, ...); the upper-case ones (``BATCH_SIZE``, ``NUM_EPOCHS``, ...) are
the example's constants, which its train script reads through ``gpc.config``. Both lists, with
the largebatch key each constant stands for, are in ``largebatch.config.loader``, which
recognises a Colossal-AI config given where a largebatch config is expected.
"""

from __future__ import annotations

_NO_PIPELINE = "pipeline parallelism is not offered here (every device runs the whole model), so there are no pipeline micro-batches"

# Names that have no equivalent here, with why.
UNMAPPED = {
    "zero": "ZeRO is not offered as such; dist.strategy='fsdp' (FSDP2) shards parameters, gradients and optimizer state, "
    "the nearest (with precision 'bf16' or 'fp32': fsdp does not take fp16)",
    "cudnn_benchmark": "not a setting here (cuDNN's defaults; ViTs run few convolutions)",
    "cudnn_deterministic": "not a setting here (cuDNN's defaults; ViTs run few convolutions)",
    "gradient_handler": "gradients are reduced by DDP or FSDP (dist.strategy), not by handlers",
    "NUM_MICRO_BATCHES": _NO_PIPELINE,
    "TENSOR_SHAPE": _NO_PIPELINE,
    "SEQ_LENGTH": "follows from the image and patch size; only pipeline schedules need it",
    "CHECKPOINT": "activation checkpointing is not offered",
    "LOG_PATH": "the run directory holds the logs: train.py --run-dir",
    "TENSOR_PARALLEL_SIZE": "read through parallel.tensor (see there)",
    "TENSOR_PARALLEL_MODE": "read through parallel.tensor (see there)",
}

# Colossal-AI trainer hooks -> what does their work here.
HOOKS = {
    "LossHook": "built in: the loss is logged every log.interval steps",
    "AccuracyHook": "built in: accuracy is logged at every evaluation",
    "LogMetricByEpochHook": "built in: metrics are logged to the console and metrics.jsonl",
    "LogMetricByStepHook": "built in: metrics are logged to the console and metrics.jsonl",
    "ThroughputHook": "built in: throughput is logged every log.interval steps",
    "TensorboardHook": "add hooks=['tensorboard']",
    "SaveCheckpointHook": "checkpoint.interval_epochs (every epoch by default) and train.py --run-dir",
    "LoadCheckpointHook": "train.py --resume auto or --resume PATH",
    "MemTraceHook": "add hooks=['memory']",
}
