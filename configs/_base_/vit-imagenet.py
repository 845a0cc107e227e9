# ImageNet-1K ViT pretraining at a 32K global batch, after Colossal-AI's ViT data-parallel
# example (ColossalAI examples/vit-b16 and ColossalAI-Examples image/vision_transformer/
# data_parallel): LAMB, linear warmup then linear decay, mixup 0.2, clip 1.0, 300 epochs.
# Recipes (vit-b16.py, vit-b32.py, vit-l32.py) set the model and may change any value here.
#
# Warmup: 150 of the 300 epochs, by epoch, as the example's README states and its
# vit-b16.py sets (LinearWarmupLR(warmup_steps=150) stepped per epoch: linear up to the
# peak, then linear down to 0). The later train.py of ColossalAI-Examples warms up for
# a single epoch instead; `--set lr_schedule.warmup_epochs=1` reproduces that one.

seed = 42
device = 'auto'
precision = 'auto'          # bf16 on GPU/HPU, fp32 on CPU; 'fp16' matches Colossal-AI's AMP

epochs = 300
global_batch_size = 32768   # 256 per device x 16 accumulation x 8 devices (derived at launch)
micro_batch_size = 256
clip_grad_norm = 1.0

optimizer = dict(type='lamb', lr=1.8e-2, weight_decay=0.1)
lr_schedule = dict(type='linear', warmup_epochs=150, min_lr=0.0)

data = dict(
    loader='dali',
    root='data/imagenet',       # TFRecord shards: train-*-of-*, validation-*-of-*
    image_size=224,
    channels=3,
    num_classes=1000,
    label_offset=1,             # ImageNet TFRecords count labels from 1
    train_samples=1281167,      # shown by `config show` when the shards are absent
    eval_samples=50000,
    num_workers=8,
)
mixup = dict(mixup_alpha=0.2)
eval = dict(interval_epochs=10)
log = dict(interval=10)
checkpoint = dict(interval_epochs=1, keep=3)
