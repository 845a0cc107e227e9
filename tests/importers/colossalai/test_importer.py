"""``largebatch config import colossalai``: configs in the shape of Colossal-AI's
data-parallel and hybrid-parallel ViT examples become largebatch configs that load, with
Colossal-AI's batch arithmetic, and every setting mapped, filled in or listed with why."""

from __future__ import annotations

import pathlib
import re

import pytest
import yaml

from largebatch import cli
from largebatch.config import derive, resolve_config
from largebatch.errors import ConfigError
from largebatch.importers.colossalai.importer import import_colossalai
from tests.importers.colossalai import shapes


def imported(tmp_path: pathlib.Path, text: str):
    path = tmp_path / "imported.py"
    path.write_text(text)
    return resolve_config(path)


def colossalai_global_batch(batch_size: int, world_size: int, tensor: int, pipeline: int, accumulation: int) -> int:
    """What Colossal-AI's ViT example logs as the total batch size (its TotalBatchsizeHook):
    BATCH_SIZE x gradient_accumulation x the size of the data-parallel group."""
    data_parallel = world_size // (tensor * pipeline)
    return batch_size * accumulation * data_parallel


def test_the_data_parallel_example_with_its_train_script(tmp_path):
    config, train = shapes.data_parallel(tmp_path)
    text = import_colossalai(config, train, world_size=8)
    cfg = imported(tmp_path, text)
    assert (cfg.epochs, cfg.micro_batch_size, cfg.global_batch_size) == (90, 128, colossalai_global_batch(128, 8, 1, 1, 4))
    assert (cfg.precision, cfg.clip_grad_norm) == ("fp16", 1.0)
    assert cfg.model.name == "vit_base_patch16_224"
    assert cfg.model.extra == {"drop_rate": 0.0, "pos_drop_rate": 0.1, "proj_drop_rate": 0.1}
    assert (cfg.optimizer.type, cfg.optimizer.lr, cfg.optimizer.weight_decay) == ("lamb", 8e-3, 0.05)
    assert cfg.optimizer.extra == {"bias_correction": False}  # Colossal-AI's Lamb
    assert cfg.optimizer.exclude_1d is False and cfg.optimizer.no_weight_decay == ()  # Lamb(model.parameters())
    assert (cfg.lr_schedule.type, cfg.lr_schedule.warmup_epochs, cfg.lr_schedule.min_lr) == ("linear", 5, 0.0)
    assert (cfg.data.loader, cfg.data.root, cfg.data.label_offset) == ("dali", "/datasets/imagenet-tfrecords", 1)
    assert cfg.data.mean == (0.5, 0.5, 0.5) and cfg.data.std == (0.5, 0.5, 0.5)
    assert cfg.mixup.mixup_alpha == 0.2 and cfg.eval.interval_epochs == 1
    assert derive(cfg, 8, cfg.data.train_samples).accumulation == 4  # gradient_accumulation, derived here
    header = text.split("\n\n")[0]
    for listed in ("dali.gpu_aug = True", "rand_augment=True", "DROP_RATE (config.py:5) = 0.1", "hooks.LossHook at train.py:34"):
        assert listed in header
    assert "the train script does not read it" in header  # DROP_RATE: the script passes drop_rate itself


def test_the_hybrid_parallel_example_with_its_engine_script(tmp_path):
    config, train = shapes.hybrid_parallel(tmp_path)
    text = import_colossalai(config, train, world_size=16)
    cfg = imported(tmp_path, text)
    assert cfg.global_batch_size == colossalai_global_batch(128, 16, tensor=2, pipeline=2, accumulation=1) == 512
    assert cfg.micro_batch_size == 32  # each of the 16 devices holds the whole model: 512 / 16
    assert derive(cfg, 16, cfg.data.train_samples).accumulation == 1
    assert cfg.model.name == "vit_small_patch16_224"  # HIDDEN_SIZE 384, DEPTH 12, NUM_HEADS 6, PATCH_SIZE 16
    assert cfg.model.extra["weight_init"] == "jax"
    assert (cfg.optimizer.type, cfg.optimizer.lr, cfg.optimizer.weight_decay) == ("adamw", 2e-3, 0.05)
    assert (cfg.lr_schedule.type, cfg.lr_schedule.warmup_epochs) == ("cosine", 5)
    assert cfg.mixup.label_smoothing == 0.1 and cfg.precision == "fp16"
    assert (cfg.data.image_size, cfg.data.num_classes, cfg.data.loader) == (224, 1000, "dali")
    header = " ".join(line.lstrip("# ").strip() for line in text.split("\n\n")[0].splitlines())
    assert "AMP_TYPE.NAIVE" in header and "fp32 master weights" in header
    assert "1d tensor parallelism over 2 devices is not offered" in header and "pipeline parallelism over 2 stages" in header
    assert "dist.strategy='fsdp'" in header
    assert "steps it every iteration" in header  # the loop steps the scheduler; the names say epochs
    assert "data.root = 'data/imagenet' the train script reads $DATA" in header
    for name in ("NUM_MICRO_BATCHES", "TENSOR_SHAPE", "SEQ_LENGTH", "TENSOR_PARALLEL_SIZE", "TENSOR_PARALLEL_MODE", "CHECKPOINT"):
        assert f"{name} (vit_1d_tp2_pp2.py:" in header


@pytest.mark.parametrize("world_size", [1, 2, 4, 8, 32, 128])
def test_the_global_batch_is_colossalai_s_at_every_world_size(tmp_path, world_size):
    config, train = shapes.data_parallel(tmp_path)
    cfg = imported(tmp_path, import_colossalai(config, train, world_size=world_size))
    assert cfg.global_batch_size == colossalai_global_batch(128, world_size, 1, 1, 4)
    assert derive(cfg, world_size, cfg.data.train_samples).accumulation == 4


@pytest.mark.parametrize("world_size", [4, 8, 64])
def test_the_hybrid_global_batch_is_colossalai_s_with_every_device_data_parallel_here(tmp_path, world_size):
    config, train = shapes.hybrid_parallel(tmp_path)
    cfg = imported(tmp_path, import_colossalai(config, train, world_size=world_size))
    plan = derive(cfg, world_size, cfg.data.train_samples).plan
    assert cfg.global_batch_size == colossalai_global_batch(128, world_size, 2, 2, 1)
    assert plan.micro_batch_size * plan.accumulation * world_size == cfg.global_batch_size
    assert cfg.micro_batch_size <= 128


def test_every_name_of_the_config_is_mapped_or_listed(tmp_path):
    config, train = shapes.hybrid_parallel(tmp_path)
    text = import_colossalai(config, train, world_size=16)
    header = " ".join(line.lstrip("# ").strip() for line in text.split("\n\n")[0].splitlines())
    names = [line.split(" = ")[0] for line in shapes.HYBRID_CONFIG.splitlines() if " = " in line and not line.startswith(" ")]
    assert len(names) > 15
    for name in names:
        assert re.search(rf"\b{name}[.\w]*( [^ (]+)? \(vit_1d_tp2_pp2\.py:\d+\)", header) or f"{name}.tensor" in header, name


@pytest.mark.parametrize(
    ("mode", "words"),
    [("AMP_TYPE.TORCH", "torch autocast with a GradScaler"), ("AMP_TYPE.NAIVE", "fp32 master weights"), ("AMP_TYPE.APEX", "apex amp")],
)
def test_each_amp_mode_becomes_fp16_and_says_how(tmp_path, mode, words):
    config, train = shapes.data_parallel(tmp_path)
    config.write_text(shapes.DATA_PARALLEL_CONFIG.replace("mode=AMP_TYPE.TORCH,", f"mode={mode}, init_scale=2**10,"))
    text = import_colossalai(config, train, world_size=8)
    assert imported(tmp_path, text).precision == "fp16"
    header = " ".join(line.lstrip("# ").strip() for line in text.split("\n\n")[0].splitlines())
    assert mode in header and words in header
    assert "fp16.init_scale = 1024 fp16 loss scaling here is torch's GradScaler" in header


def test_without_fp16_colossalai_trains_in_fp32(tmp_path):
    config, train = shapes.data_parallel(tmp_path)
    config.write_text(shapes.DATA_PARALLEL_CONFIG.replace("fp16 = dict(\n    mode=AMP_TYPE.TORCH,\n)\n", ""))
    assert imported(tmp_path, import_colossalai(config, train, world_size=8)).precision == "fp32"


def test_without_the_train_script_the_config_s_names_are_read_by_name(tmp_path):
    config, _ = shapes.hybrid_parallel(tmp_path)
    text = import_colossalai(config, world_size=8)
    cfg = imported(tmp_path, text)
    assert (cfg.optimizer.lr, cfg.optimizer.weight_decay, cfg.lr_schedule.warmup_epochs) == (2e-3, 0.05, 5)
    assert cfg.model.name == "vit_small_patch16_224" and cfg.data.num_classes == 1000
    assert "optimizer.type = 'adamw'" in text and "give --train-script" in text  # filled in, and said so
    assert "LEARNING_RATE 0.002 (vit_1d_tp2_pp2.py:5), by its name" in text


def test_world_size_from_parallel_data_or_total_batch_size(tmp_path):
    path = tmp_path / "config.py"
    path.write_text("BATCH_SIZE = 32\nNUM_EPOCHS = 3\nparallel = dict(data=4, tensor=dict(size=2, mode='1d'))\n")
    sets = ["model.name=vit_tiny_patch16_224", "optimizer.lr=0.001"]
    assert imported(tmp_path, import_colossalai(path, overrides=sets)).global_batch_size == 32 * 4
    path.write_text("BATCH_SIZE = 32\nTOTAL_BATCH_SIZE = 1024\nNUM_EPOCHS = 3\n")
    cfg = imported(tmp_path, import_colossalai(path, overrides=sets))
    assert (cfg.global_batch_size, cfg.micro_batch_size) == (1024, 32)


def test_set_overrides_the_result_and_says_so(tmp_path):
    config, train = shapes.data_parallel(tmp_path)
    text = import_colossalai(config, train, world_size=8, overrides=["data.root=/data/in", "optimizer.lr=0.01"])
    cfg = imported(tmp_path, text)
    assert (cfg.data.root, cfg.optimizer.lr) == ("/data/in", 0.01)
    assert "<- --set optimizer.lr=0.01" in text


@pytest.mark.parametrize(
    ("change", "kwargs", "fragments"),
    [
        (None, {}, ["--world-size N", "BATCH_SIZE 128 x gradient_accumulation 4"]),
        (None, {"world_size": 6, "hybrid": True}, ["--world-size", "groups of tensor 2 x pipeline 2"]),
        ("BATCH_SIZE = 'big'", {"world_size": 8}, ["BATCH_SIZE", "expected an integer"]),
        ("parallel = 'lots'", {"world_size": 8}, ["parallel", "dict(pipeline="]),
        (None, {"world_size": 8, "no_script": True}, ["model.name", "--train-script", "optimizer.lr"]),
        (None, {"world_size": 8, "overrides": ["optimizer.lr=-1"]}, ["does not load", "optimizer.lr", "must be > 0"]),
    ],
)
def test_what_it_cannot_do_is_one_error_with_the_fix(tmp_path, change, kwargs, fragments):
    config, train = (shapes.hybrid_parallel if kwargs.pop("hybrid", False) else shapes.data_parallel)(tmp_path)
    if change:
        config.write_text(config.read_text() + change + "\n")
    if kwargs.pop("no_script", False):
        train = None
    with pytest.raises(ConfigError) as info:
        import_colossalai(config, train, **kwargs)
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("shape", "world_size", "global_batch", "accumulation"),
    [(shapes.data_parallel, 8, 4096, 4), (shapes.hybrid_parallel, 64, 2048, 1)],
    ids=["data-parallel", "hybrid-parallel"],
)
def test_the_command_writes_a_file_config_show_loads_and_refuses_to_overwrite_it(
    tmp_path, capsys, shape, world_size, global_batch, accumulation
):
    """The commands of docs/coming-from.md, on configs of the examples' two shapes."""
    config, train = shape(tmp_path)
    out = tmp_path / "imported.py"
    argv = ["config", "import", "colossalai", str(config), "--train-script", str(train), "--world-size", str(world_size), "--out", str(out)]
    assert cli.main(argv) == 0
    assert f"largebatch config show {out} --world-size {world_size}" in capsys.readouterr().out
    assert cli.main(["config", "show", str(out), "--world-size", str(world_size)]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["global_batch_size"] == global_batch and shown["derived"]["accumulation"] == accumulation
    written = out.read_text()
    assert cli.main(argv) == 2
    assert "--force" in capsys.readouterr().err and out.read_text() == written
    assert cli.main([*argv, "--force", "--set", "epochs=30"]) == 0
    assert "epochs = 30" in out.read_text()


def test_without_out_it_prints_the_config(tmp_path, capsys):
    config, train = shapes.data_parallel(tmp_path)
    assert cli.main(["config", "import", "colossalai", str(config), "--train-script", str(train), "--world-size", "8"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("# Imported from a Colossal-AI config") and "global_batch_size = 4096" in printed


SMALL_CONFIG = "BATCH_SIZE = 32\nNUM_EPOCHS = 10\nclip_grad_norm = 1.0\n"


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (
            "opt = colossalai.nn.optimizer.Lars(model.parameters(), lr=0.1, eeta=0.02)\n",
            {"optimizer.type": "lars", "optimizer.eta": 0.02, "optimizer.momentum": 0.0, "optimizer.eps": 0.0},
        ),
        ("opt = torch.optim.AdamW(model.parameters(), lr=1e-3)\n", {"optimizer.type": "adamw", "optimizer.weight_decay": 0.01}),
        ("opt = torch.optim.SGD(model.parameters(), 0.5, 0.9, nesterov=True)\n", {"optimizer.lr": 0.5, "optimizer.momentum": 0.9}),
        (
            "opt = Lamb(params, lr=1e-2)\nsched = PolynomialWarmupLR(opt, 1000, warmup_steps=100, power=2.0)\n",
            {"lr_schedule.type": "polynomial", "lr_schedule.warmup_steps": 100, "lr_schedule.power": 2.0, "lr_schedule.min_lr": 0.0001},
        ),
        (
            "opt = Lamb(params, lr=1e-2)\nsched = CosineAnnealingLR(opt, total_steps=gpc.config.NUM_EPOCHS, eta_min=1e-5)\n",
            {"lr_schedule.type": "cosine", "lr_schedule.min_lr": 1e-5},
        ),
        ("opt = Lamb(params, lr=1e-2)\n", {"lr_schedule.type": "constant"}),
    ],
)
def test_the_train_script_s_optimizer_and_schedule(tmp_path, lines, expected):
    config = shapes.write(tmp_path, "config.py", SMALL_CONFIG)
    train = shapes.write(
        tmp_path, "train.py", "import timm\nmodel = timm.create_model('vit_tiny_patch16_224', drop_path_rate=0.1)\n" + lines
    )
    cfg = imported(tmp_path, import_colossalai(config, train, world_size=2)).to_dict()
    assert cfg["model"]["name"] == "vit_tiny_patch16_224" and cfg["model"]["drop_path_rate"] == 0.1
    for key, value in expected.items():
        section, name = key.split(".")
        assert cfg[section][name] == value, key


def test_what_the_script_knows_only_when_it_runs_is_listed_and_asked_for(tmp_path):
    config = shapes.write(tmp_path, "config.py", SMALL_CONFIG)
    train = shapes.write(
        tmp_path,
        "train.py",
        "from timm.models import vit_tiny_patch16_224\nmodel = vit_tiny_patch16_224()\nopt = Lamb(model.parameters(), lr=args.lr)\n"
        "sched = MultiStepLR(opt, milestones=[30, 60])\n",
    )
    with pytest.raises(ConfigError, match="optimizer.lr .not found in the config or the train script, or known only when the script runs"):
        import_colossalai(config, train, world_size=2)
    text = import_colossalai(config, train, world_size=2, overrides=["optimizer.lr=0.01"])
    header = " ".join(line.lstrip("# ").strip() for line in text.split("\n\n")[0].splitlines())
    assert "Lamb(lr=args.lr) at train.py:3 known only when the script runs; give it with --set optimizer.lr=VALUE" in header
    assert "MultiStepLR at train.py:4 no equivalent" in header


def test_an_early_style_optimizer_dict_in_the_config(tmp_path):
    config = shapes.write(
        tmp_path,
        "config.py",
        SMALL_CONFIG + "from colossalai.nn.optimizer import Lamb\noptimizer = dict(type=Lamb, lr=0.02, weight_decay=0.1, foo=1)\n",
    )
    text = import_colossalai(config, world_size=2, overrides=["model.name=vit_tiny_patch16_224"])
    cfg = imported(tmp_path, text)
    assert (cfg.optimizer.type, cfg.optimizer.lr, cfg.optimizer.weight_decay) == ("lamb", 0.02, 0.1)
    assert "optimizer (config.py:5) foo=1" in text and "no equivalent in optimizer type 'lamb'" in text
