"""The study file: read from Python or YAML, defaults filled in, every mistake one sentence
naming the file, the key and the fix."""

from __future__ import annotations

import pytest

from largebatch.errors import UserError
from largebatch.study.spec import load_study, optimizer_types
from tests.study.helpers import TINY_STUDY, write_study


def test_a_yaml_study_file_is_read_with_its_defaults(tmp_path):
    spec = load_study(write_study(tmp_path))
    assert spec.name == tmp_path.name and spec.folder == tmp_path.resolve()
    assert spec.base_config == (tmp_path / "base.yaml").resolve()
    assert [o.label for o in spec.optimizers] == ["lamb", "adamw"] and spec.optimizers[0].type == "lamb"
    assert spec.cells() == [("lamb", 16), ("lamb", 32), ("adamw", 16), ("adamw", 32)]
    assert spec.target.metric == "top1" and spec.target.mode == "max"
    assert spec.tune_seed == 0 and spec.seeds == (1, 2) and spec.sampler_seed == 6
    assert spec.data == {"heldout": "heldout", "test": None, "carve": None}
    assert spec.evaluation["fine"] == 1.1 and spec.evaluation["batch_size"] is None
    assert spec.workers["max_retries"] == 2 and spec.storage is None


def test_a_python_study_file_reads_like_a_config_and_merges_an_optimizers_search(tmp_path):
    write_study(tmp_path)
    (tmp_path / "study.py").write_text(
        "base_config = 'base.yaml'\n"
        "LR = dict(low=1e-3, high=1e-1)\n"
        "optimizers = dict(lamb=dict(), nesterov=dict(type='sgd', set=['optimizer.nesterov=true'], search=dict(lr=dict(low=0.01, high=1.0))))\n"
        "batches = [64, 16, 32]\n"
        "search = dict(lr=dict(LR, scale='sqrt'))\n"
        "target = dict(metric='eval/loss', value=0.5)\n"
    )
    spec = load_study(tmp_path / "study.py")
    assert spec.batches == (16, 32, 64)
    sgd = spec.optimizer("nesterov")
    assert sgd.type == "sgd" and sgd.overrides == ("optimizer.nesterov=true",)
    assert (sgd.space[0].low, sgd.space[0].high, sgd.space[0].scale) == (0.01, 1.0, "sqrt")  # merged key by key
    assert spec.optimizer("lamb").space[0].low == 1e-3
    assert spec.target.metric == "loss" and spec.target.mode == "min"  # a loss is reached from above


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"optimizers": {"lamb": {}, "adafactor": {}}}, "optimizers.adafactor: unknown optimizer 'adafactor'; optimizer.type takes one of"),
        ({"optimizers": {"lamb": {"type": "lambb"}}}, "did you mean 'lamb'?"),
        ({"search": {"lr": {"low": 0.03, "high": 0.01}}}, "search.lr: the range [0.03, 0.01] is empty; give low < high"),
        ({"optimizers": {"lamb": {"search": {"lr": {"high": 0.0001}}}}}, "optimizers.lamb.search.lr: the range [0.003, 0.0001] is empty"),
        ({"batchs": [16]}, "batchs: unknown key; did you mean 'batches'?"),
        ({"batches": [16, 16]}, "batches: must be a list of distinct positive integers"),
        ({"batches": None}, "batches: is required"),
        ({"seeds": [0, 1, 2]}, "seeds: the tuning seed 0 is among the re-run seeds"),
        ({"target": {"metric": "top1"}}, "target.value: is required"),
        ({"target": {"metric": "top1", "value": 0.7, "mode": "up"}}, "target.mode: must be 'max'"),
        ({"evaluation": {"fine": 1.5, "coarse": 1.2}}, "evaluation.fine: 1.5 is coarser than evaluation.coarse 1.2"),
        ({"evaluation": {"fine": 1.0}}, "evaluation.fine: is the ratio between evaluation steps and must be above 1"),
        ({"data": {"held_out": "x"}}, "data.held_out: unknown key; did you mean 'data.heldout'?"),
        ({"base_config": "missing.yaml"}, "base_config: base config"),
        ({"set": ["lr 0.1"]}, "set: each override is 'key.path=value' as for --set"),
        ({"noise_scale": {"at_eval_loss": 1.0, "min_ratio": 1}}, "noise_scale.min_ratio: B_big / B_small must be at least 2"),
    ],
)
def test_a_mistake_is_one_sentence_naming_the_file_and_key(tmp_path, changes, expected):
    path = write_study(tmp_path, **changes)
    with pytest.raises(UserError) as error:
        load_study(path)
    message = str(error.value)
    assert expected in message, message
    assert message.startswith(str(path)) and "\n" not in message


def test_a_missing_study_file_says_so(tmp_path):
    with pytest.raises(UserError, match="study file not found"):
        load_study(tmp_path / "nope.yaml")


def test_the_optimizers_a_study_can_compare_are_the_configs():
    assert set(optimizer_types()) == {"adamw", "sgd", "lamb", "lars"}
    assert set(TINY_STUDY["optimizers"]) <= set(optimizer_types())
