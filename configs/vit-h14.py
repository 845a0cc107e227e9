# ViT-H/14 on ImageNet-1K at a 32,768 global batch, sharded with FSDP2: the Colossal-AI
# ViT recipe (see vit-b16.py) on a model whose weights, gradients and LAMB moments no
# longer fit comfortably on every device (632 M parameters, 32 layers of width 1280).
#
#   batch: global 32768 = micro 32 x accumulation x devices
#     8 devices: accumulation 128; 64 devices: accumulation 16; 256 devices: accumulation 4
#
#   per-device memory of the model's state in GiB (`largebatch config show
#   configs/vit-h14.py --world-size N --set precision=bf16`; activations not counted):
#     devices   ddp (all replicated)   fsdp (this recipe)   fsdp + dist.reduce_every_micro_batch
#     8         11.77                  3.39                 1.47
#     64        11.77                  2.62                 0.30
#     256       11.77                  2.53                 0.19
#   Most of the fsdp figure is the full-size fp32 gradient (2.36 GiB) that FSDP2 accumulates
#   between a window's first and last micro-batch; dist.reduce_every_micro_batch=True
#   keeps it sharded at the cost of one reduction per micro-batch instead of per step.
#
# Everything else (LAMB lr 1.8e-2, wd 0.1, 150 warmup epochs of 300, mixup 0.2, clip 1.0,
# DALI TFRecords) comes from _base_/vit-imagenet.py unchanged; no published run of this
# recipe exists here, and its learning rate is the ViT-B value, untuned for this size.

_base_ = ['_base_/vit-imagenet.py']

micro_batch_size = 32
model = dict(name='vit_huge_patch14_224', drop_rate=0.0, pos_drop_rate=0.1, proj_drop_rate=0.1)
dist = dict(strategy='fsdp')
