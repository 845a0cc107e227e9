# ViT-g/14 on ImageNet-1K at a 32,768 global batch, sharded with FSDP2: the Colossal-AI
# ViT recipe (see vit-b16.py) on the 1 B-parameter model of Zhai et al. 2022 ("Scaling
# Vision Transformers": 40 layers of width 1408, MLP 6144).
#
#   batch: global 32768 = micro 16 x accumulation x devices
#     8 devices: accumulation 256; 64 devices: accumulation 32; 256 devices: accumulation 8
#
#   per-device memory of the model's state in GiB (`largebatch config show
#   configs/vit-g14.py --world-size N --set precision=bf16`; activations not counted):
#     devices   ddp (all replicated)   fsdp (this recipe)   fsdp + dist.reduce_every_micro_batch
#     8         18.86                  5.38                 2.36
#     64        18.86                  4.14                 0.43
#     256       18.86                  4.01                 0.25
#   Most of the fsdp figure is the full-size fp32 gradient (3.77 GiB) that FSDP2 accumulates
#   between a window's first and last micro-batch; dist.reduce_every_micro_batch=True
#   keeps it sharded at the cost of one reduction per micro-batch instead of per step.
#
# Everything else comes from _base_/vit-imagenet.py unchanged; no published run of this
# recipe exists here, and its learning rate is the ViT-B value, untuned for this size.

_base_ = ['_base_/vit-imagenet.py']

micro_batch_size = 16
model = dict(name='vit_giant_patch14_224', drop_rate=0.0, pos_drop_rate=0.1, proj_drop_rate=0.1)
dist = dict(strategy='fsdp')
