"""Reading a train script without running it: its calls and the values they get."""

from __future__ import annotations

import pytest

from largebatch.errors import ConfigError
from largebatch.importers.colossalai.reader import read_colossalai_config
from largebatch.importers.colossalai.script import Found, Unknown, read_train_script
from tests.importers.colossalai import shapes


def test_the_data_parallel_script_s_optimizer_schedule_and_model(tmp_path):
    config, train = shapes.data_parallel(tmp_path)
    script = read_train_script(train, read_colossalai_config(config))
    lamb = script.first("Lamb")
    assert lamb is not None and lamb.text == "colossalai.nn.Lamb" and lamb.line == 25
    assert lamb.kwargs["lr"] == Found(8e-3) and lamb.kwargs["weight_decay"] == Found(0.05)
    assert lamb.args[0] == Unknown("model.parameters()")
    schedule = script.first("LinearWarmupLR")
    assert schedule is not None and schedule.assigned_to == "lr_scheduler"
    assert schedule.argument("total_steps", 1) == Found(90, "NUM_EPOCHS (config.py:6)")
    assert script.origin(schedule, "warmup_steps", 2) == "LinearWarmupLR(warmup_steps=5) at train.py:27"
    model = script.first("vit_base_patch16_224")
    assert model is not None and model.module == "timm.models"
    assert script.first("build_dali_imagenet").args[0] == Unknown("os.environ['DATA']")  # known at run time only
    assert {"NUM_EPOCHS"} <= script.config_reads


def test_the_hybrid_script_s_model_kwargs_and_its_scheduler_stepped_in_the_loop(tmp_path):
    config, train = shapes.hybrid_parallel(tmp_path)
    script = read_train_script(train, read_colossalai_config(config))
    model = script.first("_create_vit_model")
    assert model is not None
    assert model.kwargs["dim"] == Found(384, "HIDDEN_SIZE (vit_1d_tp2_pp2.py:13)")
    assert model.kwargs["init_method"] == Found("jax")
    assert model.sources["depth"] == "gpc.config.DEPTH"
    step = next(call for call in script.calls if call.text == "lr_scheduler.step")
    assert step.loop_depth == 2
    assert {"LEARNING_RATE", "WEIGHT_DECAY", "WARMUP_EPOCHS", "BATCH_SIZE", "CHECKPOINT"} <= script.config_reads


def test_values_are_worked_out_where_they_can_be_and_named_where_not(tmp_path):
    config = tmp_path / "config.py"
    config.write_text("BATCH_SIZE = 64\ndali = dict(mixup_alpha=0.4)\n")
    train = tmp_path / "train.py"
    train.write_text(
        "import sys\nBASE_LR = 1e-3\nSCALE = 4\n"
        "raise SystemExit('a script that is run would stop here')\n"
        "opt = SGD(params, lr=BASE_LR * SCALE, momentum=-(-0.9), nesterov=args.nesterov)\n"
        "loader = Loader(mixup_alpha=gpc.config.dali.mixup_alpha, size=gpc.config.get('IMG_SIZE', 224), "
        "workers=getattr(gpc.config, 'WORKERS', 8), batch=gpc.config['BATCH_SIZE'], half=gpc.config.BATCH_SIZE // 2)\n"
    )
    script = read_train_script(train, read_colossalai_config(config))
    sgd, loader = script.first("SGD"), script.first("Loader")
    assert sgd.kwargs["lr"] == Found(4e-3) and sgd.kwargs["momentum"] == Found(0.9)
    assert sgd.kwargs["nesterov"] == Unknown("args.nesterov")
    assert loader.kwargs["mixup_alpha"] == Found(0.4, "dali.mixup_alpha (config.py:2)")
    assert loader.kwargs["size"] == Found(224) and loader.kwargs["workers"] == Found(8)
    assert loader.kwargs["batch"].value == 64 and loader.kwargs["half"].value == 32
    assert {"IMG_SIZE", "WORKERS", "BATCH_SIZE", "dali"} <= script.config_reads


@pytest.mark.parametrize(
    ("name", "text", "fragment"), [("missing.py", None, "does not exist"), ("broken.py", "def f(:\n", "not valid Python")]
)
def test_a_script_that_cannot_be_read_is_one_error(tmp_path, name, text, fragment):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError, match=fragment) as info:
        read_train_script(path)
    assert name in str(info.value)
