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
    assert spec.trials == spec.quasi_random == 3 and spec.threads is None and spec.pilot == {}
    assert [t.key for t in spec.targets] == ["top1>=0.7"] and spec.target is spec.targets[0]


def test_a_pilot_scales_the_epoch_budget_to_the_same_multiple_of_its_predicted_steps_at_every_batch(tmp_path):
    """S = S_min (1 + B_crit / B) steps of B samples: S_min (B + B_crit) samples, so with
    B_crit 48 the epochs at 32 are (32 + 48) / (16 + 48) = 1.25 times those at 16."""
    search = {"lr": {"low": 0.003, "high": 0.03}, "epochs": {"low": 4, "high": 40, "scale": "pilot"}}
    pilot = {"lamb": {"s_min": 10, "b_crit": 48}, "adamw": {"s_min": 10, "b_crit": 16}}
    spec = load_study(write_study(tmp_path, search=search, pilot=pilot))
    epochs = spec.optimizer("lamb").space[1]
    assert epochs.bounds(32, 16) == pytest.approx((5.0, 50.0)) and epochs.bounds(16, 16) == (4.0, 40.0)
    assert spec.optimizer("adamw").space[1].bounds(32, 16) == pytest.approx((6.0, 60.0))  # its own pilot: (32 + 16) / (16 + 16)
    assert spec.pilot["lamb"].steps(16) == pytest.approx(40.0) and spec.pilot["lamb"].value == 0.7


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
        ({"targets": [{"metric": "top1", "value": 0.8}]}, "targets: give target = dict(metric=..., value=...) or targets"),
        ({"target": None}, "target: give target = dict(metric=..., value=...) or targets"),
        (
            {"target": None, "targets": [{"metric": "top1", "value": 0.8}, {"metric": "loss", "value": 0.5}]},
            "targets: the targets must be distinct values of one metric and mode, got top1>=0.8, loss<=0.5",
        ),
        ({"target": None, "targets": [{"metric": "top1"}]}, "targets[0].value: is required"),
        ({"quasi_random": 4}, "quasi_random: must be between 1 and trials (3), got 4"),
        ({"threads": 0}, "threads: must be a positive number of threads"),
        ({"pilot": {"sgd": {"s_min": 1, "b_crit": 2}}}, "pilot.sgd: names no optimizer of the study (lamb, adamw)"),
        ({"pilot": {"lamb": {"s_min": 1, "b_crit": 2, "value": 0.8}}}, "pilot.lamb.value: value 0.8 is none of the targets' (top1>=0.7)"),
        (
            {"search": {"lr": {"low": 0.003, "high": 0.03}, "epochs": {"low": 2, "high": 3, "scale": "pilot"}}},
            "search.epochs.scale: scale='pilot' scales the epoch budget by a pilot fit",
        ),
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
