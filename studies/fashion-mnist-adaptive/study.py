# Fixed, ramped and adaptive global batches compared over seeds on the Fashion-MNIST
# study's model and data (issue: the batch size as a controlled variable): steps, samples
# and training seconds to the study's targets, the final test accuracy, and which
# differences the seeds separate (docs/studies.md, "Comparing recipes").
#
#   largebatch study run studies/fashion-mnist-adaptive/study.py --jobs 2 --threads 1
#   largebatch study report studies/fashion-mnist-adaptive/study.py
#
# Run once (25 trials, 2 at a time, 1 thread each, on a two-core machine: 31 minutes); its
# storage, report.md, report.json and arms.png are in this folder, and
# batch_noise_scale_seed1.png is `largebatch plot` of the noise_scale arm's seed 1
# (docs/studies.md, "The adaptive batch on Fashion-MNIST").

base_config = "../../configs/demo/vit-tiny-fmnist.py"

# studies/fashion-mnist's model, data handling and shared settings, as its study file sets them.
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

# The arms whose batch follows the training: the same 4 epochs of samples as lamb_256, from
# 256 to at most 2,048. The learning rate is given at 2,048 (global_batch_size) and LAMB's
# sqrt rule lowers it at smaller batches: 0.0443 = 0.0157 x sqrt(8) gives 256 its own tuned
# rate. Micro-batch 32: the noise_scale hook needs 8 micro-batches at 256. (Upper-case
# names are not study keys.)
GROWING = [
    "global_batch_size=2048",
    "micro_batch_size=32",
    "optimizer.lr=0.0442981",
    "lr_schedule.warmup_steps=null",
    "lr_schedule.warmup_epochs=0.118502",
    "optimizer.betas=[0.800604, 0.999]",
    "epochs=4",
    "batch_schedule.start_batch_size=256",
]

# The best fixed batches of studies/fashion-mnist for LAMB: the smallest (256) and the
# largest (2,048) that reach 78% held-out top-1, each with that study's choice for its
# cell (its study.db: trial #3, lamb/b256/q3, and trial #30, lamb/b2048/q6; the
# overrides its re-runs ran with, warmup as epochs of the cell's budget).
arms = dict(
    lamb_256=dict(
        set=[
            "global_batch_size=256",
            "micro_batch_size=32",
            "optimizer.lr=0.0156617",
            "lr_schedule.warmup_steps=null",
            "lr_schedule.warmup_epochs=0.118502",  # 0.0296255 of 4 epochs
            "optimizer.betas=[0.800604, 0.999]",
            "epochs=4",
        ]
    ),
    lamb_2048=dict(
        set=[
            "global_batch_size=2048",
            "micro_batch_size=128",
            "optimizer.lr=0.0142325",
            "lr_schedule.warmup_steps=null",
            "lr_schedule.warmup_epochs=1.43262",  # 0.23877 of 6 epochs
            "optimizer.betas=[0.759461, 0.999]",
            "epochs=6",
        ]
    ),
    ramp=dict(
        # Megatron-style hand-written ramp: 256, 512, 1,024, 2,048 at 0, 35,000, 70,000 and
        # 105,000 samples (2 of the 4 epochs).
        set=[*GROWING, "batch_schedule.type=ramp", "batch_schedule.ramp_samples=105000"]
    ),
    adaptive_noise_scale=dict(
        # Doubles when 4 x B_simple >= 2B, checked every 10,240 samples (40 steps at 256).
        # factor 4: studies/fashion-mnist-cbs measured the critical batch along a LAMB run
        # at 3.4x to 7.5x the hook's B_simple at four of its five checkpoints (1.7x at the
        # last); at factor 1 the batch would not leave 256 on this model.
        set=[
            *GROWING,
            "batch_schedule.type=adaptive",
            "batch_schedule.criterion=noise_scale",
            "batch_schedule.factor=4",
            "batch_schedule.check_every_samples=10240",
            'hooks=["noise_scale"]',
        ]
    ),
    adaptive_branch=dict(
        # Forks of 16,384 samples at B and 2B (the CBS study's branch length) every 40,960
        # samples, doubling when 2B keeps 80% of B's progress on the held-out loss: the forks
        # train 0.8x the samples the run trains, counted in its wall time, not its steps.
        set=[
            *GROWING,
            "batch_schedule.type=adaptive",
            "batch_schedule.criterion=branch",
            "batch_schedule.check_every_samples=40960",
            "batch_schedule.branch_samples=16384",
            "batch_schedule.branch_tolerance=0.2",
        ]
    ),
)

# The study's target and the next one its 256 cell reaches in its budget; its carved
# held-out shard and the test split; its evaluation schedule.
targets = [dict(metric="top1", value=0.78), dict(metric="top1", value=0.8)]
data = dict(heldout="heldout", test="validation", carve=1)
evaluation = dict(coarse=1.4, fine=1.04, dense_within=0.03, batch_size=1000)
seeds = [1, 2, 3, 4, 5]  # 5: with 3 per arm the exact rank test cannot go below p = 0.1
threads = 1
workers = dict(heartbeat_seconds=30, stale_seconds=300)
