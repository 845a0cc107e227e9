"""The names of Colossal-AI's legacy configs and ViT examples, and what each is here.

Colossal-AI's legacy engine reads a few lower-case names of the config itself
(``fp16``, ``gradient_accumulation``, ``clip_grad_norm``, ``parallel``, ``zero``,
``cudnn_benchmark``, ...); the upper-case ones (``BATCH_SIZE``, ``NUM_EPOCHS``, ...) are
the example's constants, which its train script reads through ``gpc.config``.
"""

from __future__ import annotations

# Upper-case constants of Colossal-AI's ViT examples -> the largebatch key each sets.
CONSTANT_KEYS = {
    "BATCH_SIZE": "micro_batch_size",
    "TOTAL_BATCH_SIZE": "global_batch_size",
    "NUM_EPOCHS": "epochs",
    "LEARNING_RATE": "optimizer.lr",
    "WEIGHT_DECAY": "optimizer.weight_decay",
    "WARMUP_EPOCHS": "lr_schedule.warmup_epochs",
    "IMG_SIZE": "data.image_size",
    "NUM_CLASSES": "data.num_classes",
    "DROP_RATE": "model.drop_rate",
    "PATCH_SIZE": "model.patch_size",
    "HIDDEN_SIZE": "model.embed_dim",
    "DEPTH": "model.depth",
    "NUM_HEADS": "model.num_heads",
    "MLP_RATIO": "model.mlp_ratio",
}

# Lower-case names only a Colossal-AI config sets (its engine reads them; largebatch has no such key).
COLOSSALAI_KEYS = (
    "fp16",
    "gradient_accumulation",
    "dali",
    "parallel",
    "zero",
    "cudnn_benchmark",
    "cudnn_deterministic",
    "gradient_handler",
)

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
