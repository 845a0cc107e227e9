# Fixed, ramped and adaptive global batches compared over seeds on the Fashion-MNIST
# study's model and data (issue: the batch size as a controlled variable): steps, samples
# and training seconds to the study's targets, the final test accuracy, and which
# differences the seeds separate (docs/studies.md, "Comparing recipes").
#
#   largebatch study run studies/fashion-mnist-adaptive/study.py --jobs 2 --threads 1
#   largebatch study report studies/fashion-mnist-adaptive/study.py
#
# Not run yet: the ramp and adaptive arms need the batch_schedule section.

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
    # The ramp (from 256 to 2,048 by samples seen) and the two adaptive criteria
    # (noise_scale, branch) go here, each with its batch_schedule overrides, once that
    # section exists.
)

# The study's target and the next one its 256 cell reaches in its budget; its carved
# held-out shard and the test split; its evaluation schedule.
targets = [dict(metric="top1", value=0.78), dict(metric="top1", value=0.8)]
data = dict(heldout="heldout", test="validation", carve=1)
evaluation = dict(coarse=1.4, fine=1.04, dense_within=0.03, batch_size=1000)
seeds = [1, 2, 3]  # 5 where the differences come close to the seeds' spread
threads = 1
workers = dict(heartbeat_seconds=30, stale_seconds=300)
