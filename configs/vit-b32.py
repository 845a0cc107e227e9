# ViT-B/32 on ImageNet-1K at a 32,768 global batch: Colossal-AI's ViT data-parallel recipe
# (see vit-b16.py for the table against Colossal-AI and timm/DeiT) with 32-pixel patches.
# ColossalAI-Examples' README reports this model trained for 300 epochs at 32K on 4 A100s.
#
#   setting          Colossal-AI                        timm train.py / DeiT           here
#   model            ViT-B/32, 224 px, dropout 0.1      --model vit_base_patch32_224   model (dropout as vit-b16.py)
#   batch            32K = per-GPU x accumulation x     -b 512 x devices               global 32768, micro 512:
#                    GPUs                                                               8 on 8 devices, 16 on 4
#   optimizer        Lamb lr 1.8e-2, wd 0.1             --opt lamb                     optimizer (from _base_)
#   schedule         150 warmup epochs, linear to 0     --sched cosine                 lr_schedule (from _base_)
#   the rest         fp16, clip 1.0, mixup 0.2, 300 epochs, DALI TFRecords             from _base_
#
# 49 tokens a image instead of 196: a quarter of ViT-B/16's activations, so the micro-batch
# doubles to 512. At 128 devices 512 x 128 exceeds the global batch: use
# `--set micro_batch_size=256` there (accumulation 1).

_base_ = ['_base_/vit-imagenet.py']

micro_batch_size = 512
model = dict(name='vit_base_patch32_224', drop_rate=0.0, pos_drop_rate=0.1, proj_drop_rate=0.1)
