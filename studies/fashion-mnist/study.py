# The Fashion-MNIST critical-batch study: where a small ViT stops scaling with the batch,
# for LAMB, AdamW and SGD with Nesterov momentum, with the same tuning budget everywhere.
#
#   OMP_NUM_THREADS=1 largebatch study run studies/fashion-mnist/study.py --jobs 2
#   largebatch study status studies/fashion-mnist/study.py
#   largebatch study report studies/fashion-mnist/study.py
#
# The results (report.md, report.json, the plots) and the storage (study.db) are in this
# folder; docs/large-batch.md#choosing-a-batch-size reads them.

base_config = "../../configs/demo/vit-tiny-fmnist.py"

# The demo's ViT made smaller (7-pixel patches, width 64, 2 blocks of 2 heads) so that the
# whole study fits a few hours on two CPU cores; whole 28x28 images, data decoded in the
# trial's own process (two trials side by side use both cores).
set = [
    "model.embed_dim=64",
    "model.depth=2",
    "model.num_heads=2",
    "data.num_workers=0",
    "data.cache_decoded=true",  # each image decoded once per trial, then cropped from memory: the same batches
    "clip_grad_norm=1.0",
    "lr_schedule.type=cosine",
    "lr_schedule.min_lr=0.0",
    "log.interval=20",
    "log.console=false",
]

optimizers = dict(
    lamb=dict(set=["optimizer.weight_decay=0.05"], search=dict(lr=dict(low=2.5e-3, high=4e-2))),
    adamw=dict(set=["optimizer.weight_decay=0.05"], search=dict(lr=dict(low=1e-3, high=1.6e-2))),
    sgd=dict(set=["optimizer.weight_decay=5e-4", "optimizer.nesterov=true"], search=dict(lr=dict(low=5e-2, high=0.8))),
)
batches = [256, 512, 1024, 2048, 4096, 8192]  # 2x apart
micro_batch_size = 128  # 32 at 256 and 64 at 512: an eighth of the batch (noise_scale)

# Ranges at batch 256; the learning rate's both ends grow with sqrt(batch / 256). The
# epoch budget is searched too: the cosine schedule's horizon is a hyperparameter, not a
# constant that would favour one batch size.
search = dict(
    lr=dict(log=True, scale="sqrt"),
    one_minus_momentum=dict(low=0.02, high=0.3),  # beta1 (lamb, adamw) or momentum (sgd) from 0.7 to 0.98
    warmup_fraction=dict(low=0.0, high=0.3),
    epochs=dict(low=2, high=8, log=True),
)

# 78% top-1 on the 7,500 held-out images: reached in under two epochs at batch 256, so
# the 8-epoch ceiling can show an efficiency well below 0.5 at the large batches.
target = dict(metric="top1", value=0.78)
data = dict(heldout="heldout", test="validation", carve=1)  # held out: the last of the 8 training shards
trials = 8
seeds = [1, 2, 3]
evaluation = dict(coarse=1.4, fine=1.04, dense_within=0.03, batch_size=1000)
noise_scale = dict(at_eval_loss=0.65, min_ratio=8)  # the held-out loss near 75% top-1, reached before the target
workers = dict(heartbeat_seconds=30, stale_seconds=300)
