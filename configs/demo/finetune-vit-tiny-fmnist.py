# Fine-tuning the README's demo: start from the demo run's weights (runs/demo, which
# `bash scripts/setup.sh` writes) and train two more epochs at a third of the pretraining
# learning rate with layer-wise learning-rate decay (the head learns fastest, the patch
# embedding slowest):
#
#   torchrun --standalone --nproc_per_node=2 train.py --config configs/demo/finetune-vit-tiny-fmnist.py
#
# A demo you started yourself is named runs/vit-tiny-fmnist-<id>: point at it, or at the
# newest of them with a glob (this file's own runs are runs/finetune-vit-tiny-fmnist-*, so
# they never match):
#
#   torchrun --standalone --nproc_per_node=2 train.py --config configs/demo/finetune-vit-tiny-fmnist.py \
#       --set "model.init_from=runs/vit-tiny-fmnist-*"
#
# model.init_from also takes an export folder, a .safetensors file or a checkpoint; a
# different data.num_classes re-initialises the classifier, a different data.image_size
# resamples the position embeddings (timm's loader does both).

_base_ = 'vit-tiny-fmnist.py'

epochs = 2
model = dict(init_from='runs/demo')
optimizer = dict(type='lamb', lr=5e-3, weight_decay=0.0, layer_decay=0.75)
lr_schedule = dict(type='cosine', warmup_epochs=0.1, min_lr=1e-6)
