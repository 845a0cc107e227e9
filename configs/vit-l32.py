# ViT-L/32 on ImageNet-1K at a 32,768 global batch: Colossal-AI's ViT data-parallel recipe
# (see vit-b16.py for the table against Colossal-AI and timm/DeiT) on the large model.
# ColossalAI-Examples' README reports this model trained for 300 epochs at 32K on 4 A100s.
#
#   setting          Colossal-AI                        timm train.py / DeiT           here
#   model            ViT-L/32, 224 px, dropout 0.1      --model vit_large_patch32_224  model (dropout as vit-b16.py)
#   batch            32K = per-GPU x accumulation x     -b 128 x devices               global 32768, micro 128:
#                    GPUs                                                               32 on 8 devices, 64 on 4,
#                                                                                       2 on 128
#   optimizer        Lamb lr 1.8e-2, wd 0.1             --opt lamb                     optimizer (from _base_)
#   schedule         150 warmup epochs, linear to 0     --sched cosine                 lr_schedule (from _base_)
#   the rest         fp16, clip 1.0, mixup 0.2, 300 epochs, DALI TFRecords             from _base_
#
# 307 M parameters, 24 layers of width 1024: a micro-batch of 128 keeps the activations
# small; raise it where device memory allows (the global batch, and so the run, stays).

_base_ = ['_base_/vit-imagenet.py']

micro_batch_size = 128
model = dict(name='vit_large_patch32_224', drop_rate=0.0, pos_drop_rate=0.1, proj_drop_rate=0.1)
