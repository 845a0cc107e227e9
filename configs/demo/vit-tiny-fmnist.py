# The README's demo: a small ViT on real Fashion-MNIST images (TFRecord shards made by
# `python data/prepare_fmnist.py`), at a large effective batch through gradient
# accumulation, on the CPU with 2 processes:
#
#   torchrun --standalone --nproc_per_node=2 train.py --config configs/demo/vit-tiny-fmnist.py
#
# global batch 2048 = 128 per process x 8 accumulation x 2 processes.

seed = 0
device = 'cpu'
epochs = 5
global_batch_size = 2048
micro_batch_size = 128
clip_grad_norm = 1.0

model = dict(name='vit_tiny_patch16_224', patch_size=4, embed_dim=96, depth=4, num_heads=3, mlp_ratio=2.0)
optimizer = dict(type='lamb', lr=1e-2, weight_decay=0.05)
lr_schedule = dict(type='cosine', warmup_epochs=1, min_lr=1e-5)

data = dict(
    loader='native',
    root='data/fashion-mnist',
    image_size=28,
    channels=1,
    num_classes=10,
    mean=[0.286],
    std=[0.353],
    scale=[0.6, 1.0],           # small images, few epochs: a gentler crop than ImageNet's 0.08
    num_workers=1,
)
log = dict(interval=5)
eval = dict(interval_epochs=1)
checkpoint = dict(interval_epochs=1)
