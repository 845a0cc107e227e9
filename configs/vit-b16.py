# ViT-B/16 on ImageNet-1K at a 32,768 global batch: the recipe of Colossal-AI's
# vit_b16_imagenet_data_parallel example (vit-b16.py).
#
#   setting            Colossal-AI vit-b16.py            largebatch
#   model              ViT-B/16, 224 px, dropout 0.1     model.name, model.drop_rate
#   batch              256/GPU x 16 accum x 8 GPUs       global 32768, micro 256 (A derived)
#   optimizer          LAMB lr 1.8e-2, wd 0.1            optimizer
#   schedule           linear warmup (150 epochs)        lr_schedule
#   precision          fp16 (torch AMP)                  precision ('fp16' on GPU; auto = bf16)
#   clipping           clip_grad_norm 1.0                clip_grad_norm
#   augmentation       mixup 0.2, DALI TFRecord          mixup, data.loader='dali'
#   epochs             300                               epochs

_base_ = ['_base_/vit-imagenet.py']

model = dict(name='vit_base_patch16_224', drop_rate=0.1)
