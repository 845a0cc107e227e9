# ViT-B/16 on ImageNet-1K at a 32,768 global batch: the recipe of Colossal-AI's ViT
# data-parallel example (ColossalAI examples/vit-b16/vit-b16.py, ColossalAI-Examples
# image/vision_transformer/data_parallel/config.py), with timm/DeiT's names beside it.
#
#   setting          Colossal-AI                        timm train.py / DeiT           here
#   model            vit_base_patch16_224 (timm)        --model vit_base_patch16_224   model.name
#   image size       224 px                             --input-size 3 224 224         data.image_size
#   dropout          drop_rate=0.1 (timm 0.4: position  --drop 0.1 (timm 1.x: head     model.pos_drop_rate,
#                    embedding, attention projection    dropout only); DeiT: 0.0       model.proj_drop_rate 0.1;
#                    and MLP; no head dropout)                                          model.drop_rate 0.0
#   batch            BATCH_SIZE=256 per GPU x           -b 256 x 8 GPUs = 2048, no     global_batch_size 32768,
#                    gradient_accumulation 16 x 8 GPUs  accumulation; DeiT 1024         micro_batch_size 256
#   optimizer        Lamb lr 1.8e-2, weight_decay 0.1   --opt lamb --lr 1.8e-2         optimizer
#                                                       --weight-decay 0.1; DeiT AdamW
#                                                       5e-4 x batch/512, wd 0.05
#   lr scaling       none (lr given for 32K)            DeiT: linear in batch/512      lr_schedule.scaling 'none'
#   schedule         LinearWarmupLR by epoch: 150       --sched cosine --warmup-epochs lr_schedule linear,
#                    warmup epochs, then linear to 0    5 (timm/DeiT: cosine, 5)       warmup_epochs 150
#   epochs           NUM_EPOCHS=300                     --epochs 300 (DeiT 300)        epochs
#   precision        fp16, torch AMP                    --amp                          precision ('fp16' on GPU)
#   clipping         clip_grad_norm 1.0                 --clip-grad 1.0 (DeiT: none)   clip_grad_norm
#   augmentation     mixup 0.2 only (no RandAugment)    --mixup 0.2; DeiT: mixup 0.8,  mixup.mixup_alpha
#                                                       cutmix 1.0, RandAugment
#   label smoothing  none (MixupLoss: cross-entropy)    --smoothing 0.1 (DeiT 0.1)     mixup.label_smoothing 0
#   data             DALI over ImageNet TFRecords       image folder, torch loader     data.loader 'dali'
#
# Accumulation is derived at launch: 32768 / (256 x world size): 16 on 8 devices, 32 on 4,
# 1 on 128 (`largebatch config show configs/vit-b16.py --world-size 8`).

_base_ = ['_base_/vit-imagenet.py']

model = dict(name='vit_base_patch16_224', drop_rate=0.0, pos_drop_rate=0.1, proj_drop_rate=0.1)
