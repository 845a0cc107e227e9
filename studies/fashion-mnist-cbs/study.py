# The critical batch along training (CBS(t)) on a demo-sized run: short branches at
# k x 256 from checkpoints of one LAMB run at batch 256 (Merrill et al. 2025).
#
#   python studies/fashion-mnist-cbs/source.py                       # the source run, runs/fashion-mnist-cbs-source
#   largebatch study run studies/fashion-mnist-cbs/study.py --jobs 1
#   largebatch study report studies/fashion-mnist-cbs/study.py        # from study.db alone
#
# The source run: LAMB at batch 256 with studies/fashion-mnist's choice for that cell (lr
# 0.0157, warmup 0.0296, beta1 0.801, 4 epochs of cosine: 820 steps), a checkpoint every 20
# steps, the noise_scale hook (source.py). The branches: from steps 20, 80, 200, 400 and 600
# (early ones: the critical batch is small early), 16,384 samples each (8% of the run), at
# k = 1, 2, 4, 8 with LAMB's sqrt rule, 3 seeds: 60 branches of about 35 s on one core.
# Cut to fit 40 CPU minutes: a sixth checkpoint (step 800, where the cosine schedule's
# learning rate is 2e-5: a branch lowers the loss by 3e-4, too little to compare; the
# storage holds its 12 branches, queued by a first version of this file, and the report
# leaves them out). docs/studies.md says what the result resolves.

base_config = "../../configs/demo/vit-tiny-fmnist.py"

# studies/fashion-mnist's model and training: a ViT of width 64, 2 blocks of 2 heads.
set = [
    "optimizer.type=lamb",
    "model.embed_dim=64",
    "model.depth=2",
    "model.num_heads=2",
    "data.num_workers=0",
    "data.cache_decoded=true",
    "clip_grad_norm=1.0",
    "lr_schedule.type=cosine",
    "lr_schedule.min_lr=0.0",
    "log.interval=20",
    "log.console=false",
    "optimizer.weight_decay=0.05",
]

data = dict(heldout="heldout", carve=1)  # held out: the last of the 8 training shards
threads = 1
branches = dict(
    run="../../runs/fashion-mnist-cbs-source",
    at_samples=[5120, 20480, 51200, 102400, 153600],
    ks=[1, 2, 4, 8],
    samples=16384,
    seeds=[1, 2, 3],
    tolerance=0.2,
)
