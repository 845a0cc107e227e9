# A tiny ViT on SYNTHETIC data (seeded noise around per-class patterns), sized to train
# on a CPU in well under a minute. It exercises the whole engine (accumulation, LAMB-free
# AdamW, warmup, mixup, clipping, checkpoints) without any dataset.
#
#   python train.py --config configs/demo/vit-tiny-synthetic.py
#   torchrun --nproc_per_node=2 train.py --config configs/demo/vit-tiny-synthetic.py

seed = 0
device = 'cpu'
epochs = 2
global_batch_size = 256      # 32 per device x 4 accumulation x 2 processes, or x 8 on one
micro_batch_size = 32
clip_grad_norm = 1.0

model = dict(name='vit_tiny_patch16_224', patch_size=4, embed_dim=64, depth=2, num_heads=2, mlp_ratio=2.0)
optimizer = dict(type='adamw', lr=2e-3, weight_decay=0.05)
lr_schedule = dict(type='cosine', warmup_steps=4)

data = dict(loader='synthetic', image_size=16, channels=3, num_classes=10, train_samples=4096, eval_samples=512,
            mean=[0.0, 0.0, 0.0], std=[1.0, 1.0, 1.0])
mixup = dict(mixup_alpha=0.2)
log = dict(interval=4)
