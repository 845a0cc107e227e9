"""Colossal-AI configs and train scripts in the shape of its legacy ViT examples.

Written for these tests to the shape of ColossalAI-Examples'
``image/vision_transformer/data_parallel/`` (``config.py``: upper-case constants, ``fp16``
with ``AMP_TYPE``, ``gradient_accumulation``, ``clip_grad_norm``, a ``dali`` dict;
``train.py``: a timm ViT, ``colossalai.nn.Lamb``, ``LinearWarmupLR`` stepped by epoch,
``MixupLoss``, the trainer's hooks) and ``hybrid_parallel/`` (``configs/vit_*_tp*_pp*.py``:
the model as constants, ``parallel`` with tensor and pipeline sizes, ``AMP_TYPE.NAIVE``;
``train_with_engine.py``: Colossal-AI's own ViT from ``model_kwargs``, AdamW and
``CosineAnnealingWarmupLR`` read from ``gpc.config``, the scheduler stepped in the loop).
The values are these tests' own.
"""

from __future__ import annotations

import pathlib
import textwrap

DATA_PARALLEL_CONFIG = """\
from colossalai.amp import AMP_TYPE

# ViT-B/16, data parallel
BATCH_SIZE = 128
DROP_RATE = 0.1
NUM_EPOCHS = 90

fp16 = dict(
    mode=AMP_TYPE.TORCH,
)

gradient_accumulation = 4
clip_grad_norm = 1.0

dali = dict(
    root='/datasets/imagenet-tfrecords',
    gpu_aug=True,
    mixup_alpha=0.2,
)
"""

DATA_PARALLEL_TRAIN = """\
import os

import colossalai
import torch
from colossalai.core import global_context as gpc
from colossalai.logging import get_dist_logger
from colossalai.nn.lr_scheduler import LinearWarmupLR
from colossalai.trainer import Trainer, hooks
from timm.models import vit_base_patch16_224

from titans.dataloader.imagenet import build_dali_imagenet
from mixup import MixupAccuracy, MixupLoss


def main():
    args = colossalai.get_default_parser().parse_args()
    colossalai.launch_from_torch(config=args.config)
    logger = get_dist_logger()

    model = vit_base_patch16_224(drop_rate=0.1)

    root = os.environ['DATA']
    train_dataloader, test_dataloader = build_dali_imagenet(root, rand_augment=True)

    optimizer = colossalai.nn.Lamb(model.parameters(), lr=8e-3, weight_decay=0.05)
    criterion = MixupLoss(loss_fn_cls=torch.nn.CrossEntropyLoss)
    lr_scheduler = LinearWarmupLR(optimizer, warmup_steps=5, total_steps=gpc.config.NUM_EPOCHS)

    engine, train_dataloader, test_dataloader, _ = colossalai.initialize(
        model, optimizer, criterion, train_dataloader, test_dataloader
    )
    trainer = Trainer(engine=engine, logger=logger)
    hook_list = [
        hooks.LossHook(),
        hooks.AccuracyHook(accuracy_func=MixupAccuracy()),
        hooks.LogMetricByEpochHook(logger),
        hooks.LRSchedulerHook(lr_scheduler, by_epoch=True),
    ]
    trainer.fit(
        train_dataloader=train_dataloader,
        test_dataloader=test_dataloader,
        epochs=gpc.config.NUM_EPOCHS,
        hooks=hook_list,
        display_progress=True,
        test_interval=1,
    )


if __name__ == '__main__':
    main()
"""

HYBRID_CONFIG = """\
from colossalai.amp import AMP_TYPE

# hyperparameters; BATCH_SIZE is per data-parallel rank
BATCH_SIZE = 128
LEARNING_RATE = 2e-3
WEIGHT_DECAY = 0.05
NUM_EPOCHS = 90
WARMUP_EPOCHS = 5

# model
IMG_SIZE = 224
PATCH_SIZE = 16
HIDDEN_SIZE = 384
DEPTH = 12
NUM_HEADS = 6
MLP_RATIO = 4
NUM_CLASSES = 1000
CHECKPOINT = False
SEQ_LENGTH = (IMG_SIZE // PATCH_SIZE) ** 2 + 1

# parallel
TENSOR_PARALLEL_SIZE = 2
TENSOR_PARALLEL_MODE = '1d'

parallel = dict(
    pipeline=2,
    tensor=dict(mode=TENSOR_PARALLEL_MODE, size=TENSOR_PARALLEL_SIZE),
)

fp16 = dict(mode=AMP_TYPE.NAIVE)
clip_grad_norm = 1.0

# pipeline schedule
NUM_MICRO_BATCHES = parallel['pipeline']
TENSOR_SHAPE = (BATCH_SIZE // NUM_MICRO_BATCHES, SEQ_LENGTH, HIDDEN_SIZE)
"""

HYBRID_TRAIN = """\
import glob
import os

import colossalai
import torch
from colossalai.context import ParallelMode
from colossalai.core import global_context as gpc
from colossalai.nn import CrossEntropyLoss
from colossalai.nn.lr_scheduler import CosineAnnealingWarmupLR
from dataloader import DaliDataloader
from titans.model.vit.vit import _create_vit_model

DATASET_PATH = os.environ['DATA']


def build_dali_train(batch_size):
    return DaliDataloader(
        sorted(glob.glob(DATASET_PATH + '/train/*')),
        sorted(glob.glob(DATASET_PATH + '/idx_files/train/*')),
        batch_size=batch_size,
        shard_id=gpc.get_local_rank(ParallelMode.DATA),
        num_shards=gpc.get_world_size(ParallelMode.DATA),
        training=True,
        gpu_aug=False,
        cuda=False,
    )


def train_imagenet():
    args = colossalai.get_default_parser().parse_args()
    colossalai.launch_from_torch(config=args.config)

    model_kwargs = dict(img_size=gpc.config.IMG_SIZE,
                        patch_size=gpc.config.PATCH_SIZE,
                        dim=gpc.config.HIDDEN_SIZE,
                        depth=gpc.config.DEPTH,
                        num_heads=gpc.config.NUM_HEADS,
                        mlp_ratio=gpc.config.MLP_RATIO,
                        num_classes=gpc.config.NUM_CLASSES,
                        init_method='jax',
                        checkpoint=gpc.config.CHECKPOINT)
    model = _create_vit_model(**model_kwargs)

    train_dataloader = build_dali_train(gpc.config.BATCH_SIZE)
    criterion = CrossEntropyLoss(label_smoothing=0.1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=gpc.config.LEARNING_RATE, weight_decay=gpc.config.WEIGHT_DECAY)
    lr_scheduler = CosineAnnealingWarmupLR(optimizer=optimizer,
                                           total_steps=gpc.config.NUM_EPOCHS,
                                           warmup_steps=gpc.config.WARMUP_EPOCHS)

    engine, train_dataloader, _, _ = colossalai.initialize(model=model, optimizer=optimizer, criterion=criterion,
                                                         train_dataloader=train_dataloader)
    data_iter = iter(train_dataloader)
    for epoch in range(gpc.config.NUM_EPOCHS):
        engine.train()
        for _ in range(len(train_dataloader)):
            engine.zero_grad()
            engine.execute_schedule(data_iter, return_output_label=False)
            engine.step()
            lr_scheduler.step()


if __name__ == '__main__':
    train_imagenet()
"""


def write(folder: pathlib.Path, name: str, text: str) -> pathlib.Path:
    """``text`` (dedented) as ``folder/name``."""
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def data_parallel(folder: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """The data-parallel config and its train script, written into ``folder``."""
    return write(folder, "config.py", DATA_PARALLEL_CONFIG), write(folder, "train.py", DATA_PARALLEL_TRAIN)


def hybrid_parallel(folder: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """The hybrid-parallel (tensor 1d x 2, pipeline 2) config and its engine script."""
    return write(folder, "vit_1d_tp2_pp2.py", HYBRID_CONFIG), write(folder, "train_with_engine.py", HYBRID_TRAIN)
