"""Reading a Colossal-AI config with ``colossalai`` stood in for, and only while reading."""

from __future__ import annotations

import sys
import types

import pytest

from largebatch.errors import ConfigError
from largebatch.importers.colossalai.reader import AmpType, StandIn, colossalai_stood_in, read_colossalai_config
from tests.importers.colossalai import shapes


def test_colossalai_is_not_installed_here():
    with pytest.raises(ImportError):
        __import__("colossalai")


def test_a_config_importing_colossalai_reads_as_its_launcher_keeps_it(tmp_path):
    config, _ = shapes.data_parallel(tmp_path)
    read = read_colossalai_config(config)
    assert read.values["BATCH_SIZE"] == 128 and read.values["NUM_EPOCHS"] == 90 and read.values["gradient_accumulation"] == 4
    assert read.values["fp16"] == {"mode": AmpType.TORCH}
    assert read.values["dali"] == {"root": "/datasets/imagenet-tfrecords", "gpu_aug": True, "mixup_alpha": 0.2}
    assert "AMP_TYPE" not in read.values  # a class: Colossal-AI's launcher leaves it out too
    assert read.lines["BATCH_SIZE"] == 4 and read.colossalai_imports == (1,)
    assert read.stated("BATCH_SIZE") == "BATCH_SIZE 128 (config.py:4)"


def test_the_stand_ins_are_gone_afterwards_and_an_earlier_colossalai_comes_back(tmp_path, monkeypatch):
    earlier = types.ModuleType("colossalai")
    monkeypatch.setitem(sys.modules, "colossalai", earlier)
    finders = list(sys.meta_path)
    config, _ = shapes.hybrid_parallel(tmp_path)
    read_colossalai_config(config)
    assert sys.modules["colossalai"] is earlier
    assert not [name for name in sys.modules if name.startswith("colossalai.")]
    assert sys.meta_path == finders


def test_stand_ins_record_what_the_config_reached_and_run_nothing(tmp_path):
    path = tmp_path / "zero.py"
    path.write_text(
        "import colossalai\n"
        "from colossalai.zero.shard_utils import TensorShardStrategy\n"
        "fp16 = dict(mode=colossalai.amp.AMP_TYPE.NAIVE)\n"
        "zero = dict(model_config=dict(shard_strategy=TensorShardStrategy(), placement='cuda'))\n"
        "launched = colossalai.launch(config={}, rank=0)\n"
    )
    read = read_colossalai_config(path)
    assert read.values["fp16"]["mode"] is AmpType.NAIVE
    strategy = read.values["zero"]["model_config"]["shard_strategy"]
    assert isinstance(strategy, StandIn) and repr(strategy) == "colossalai.zero.shard_utils.TensorShardStrategy()"
    assert repr(read.values["launched"]) == "colossalai.launch(config={}, rank=0)"
    assert "TensorShardStrategy" not in read.values and "colossalai" not in read.values


def test_stand_ins_exist_only_inside_the_block():
    with colossalai_stood_in():
        from colossalai.amp import AMP_TYPE

        assert AMP_TYPE.APEX.value == "apex"
    assert "colossalai" not in sys.modules


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("import titans\nBATCH_SIZE = 8\n", ["imports titans", "not installed"]),
        ("BATCH_SIZE = 8 // 0\n", ["ZeroDivisionError"]),
        ("BATCH_SIZE = (\n", ["not valid Python", "line 1"]),
    ],
)
def test_a_config_that_cannot_be_read_is_one_error_naming_the_file(tmp_path, text, fragments):
    path = tmp_path / "bad.py"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        read_colossalai_config(path)
    assert "bad.py" in str(info.value)
    for fragment in fragments:
        assert fragment in str(info.value)
    assert "colossalai" not in sys.modules
