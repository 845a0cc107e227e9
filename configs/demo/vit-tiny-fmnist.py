# The README's demo: a small ViT on real Fashion-MNIST images (TFRecord shards made by
# `python data/prepare_fmnist.py`), with LAMB at a large effective batch through gradient
# accumulation, on the CPU with 2 processes:
#
#   torchrun --standalone --nproc_per_node=2 train.py --config configs/demo/vit-tiny-fmnist.py
#
# global batch 512 = 128 per process x 2 accumulation x 2 processes: 117 optimizer steps
# per epoch, 585 in all. It reaches 86.6% top-1 on the 10,000 test images in five
# epochs (BENCHMARKS.md has the measured curve and time).

seed = 0
device = 'cpu'
epochs = 5
global_batch_size = 512
micro_batch_size = 128
clip_grad_norm = 1.0

# 28x28 grey images in 7x7 patches: 16 tokens, so a step is cheap on a CPU.
model = dict(name='vit_tiny_patch16_224', patch_size=7, embed_dim=128, depth=4, num_heads=4, mlp_ratio=2.0)
optimizer = dict(type='lamb', lr=1.5e-2, weight_decay=0.05)
lr_schedule = dict(type='cosine', warmup_epochs=0.5, min_lr=1e-5)

data = dict(
    loader='native',
    root='data/fashion-mnist',
    image_size=28,
    channels=1,
    num_classes=10,
    mean=[0.286],
    std=[0.353],
    scale=[1.0, 1.0],           # whole images: at 28 px and five epochs, crops cost more than they teach
    ratio=[1.0, 1.0],
    eval_crop_ratio=1.0,        # evaluate on the whole image too
    num_workers=1,
)
log = dict(interval=10)
eval = dict(interval_epochs=1)
checkpoint = dict(interval_epochs=1)
