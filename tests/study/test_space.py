"""The search space: values from unit coordinates, positions and edges, wider ranges, and
the config overrides of a point."""

from __future__ import annotations

import math

import pytest

from largebatch.errors import UserError
from largebatch.study.space import Param, dimensions, edges, overrides, parse_space, point_values


def test_a_log_range_maps_the_unit_interval_geometrically_and_scales_with_the_batch():
    lr = Param("lr", 1e-3, 1e-1, log=True, scale="sqrt")
    assert lr.value(0.0, 256, 256) == pytest.approx(1e-3)
    assert lr.value(0.5, 256, 256) == pytest.approx(1e-2)
    assert lr.bounds(1024, 256) == pytest.approx((2e-3, 2e-1))  # sqrt(4) = 2
    assert lr.value(0.5, 1024, 256) == pytest.approx(2e-2)
    linear = Param("lr", 0.1, 0.2, log=False, scale="linear", base_batch=128)
    assert linear.bounds(512, 256) == pytest.approx((0.4, 0.8))
    assert linear.value(0.25, 512, 256) == pytest.approx(0.5)


def test_integer_values_give_every_value_an_equal_share_of_the_unit_interval():
    epochs = Param("epochs", 2, 5, log=False)
    counts = {}
    for i in range(400):
        value = epochs.value((i + 0.5) / 400, 256, 256)
        assert isinstance(value, int)
        counts[value] = counts.get(value, 0) + 1
    assert counts == {2: 100, 3: 100, 4: 100, 5: 100}


def test_positions_and_edges_are_measured_on_the_searched_scale():
    space = (Param("lr", 1e-3, 1e-1, log=True), Param("warmup_fraction", 0.0, 0.2, log=False))
    assert space[0].position(1e-2, 256, 256) == pytest.approx(0.5)
    marks = edges(space, {"lr": 1.5e-3, "warmup_fraction": 0.19}, 256, 256)
    assert [(name, side) for name, side, _ in marks] == [("lr", "low"), ("warmup_fraction", "high")]
    assert edges(space, {"lr": 1e-2, "warmup_fraction": 0.1}, 256, 256) == []
    # the edge follows the range to larger batches (scaled ranges)
    scaled = (Param("lr", 1e-3, 1e-1, log=True, scale="linear"),)
    assert edges(scaled, {"lr": 1e-1}, 256, 256) == [("lr", "high", pytest.approx(1.0))]
    assert edges(scaled, {"lr": 1e-1}, 1024, 256) == []


def test_a_wider_range_moves_the_edge_out_by_half_and_stays_inside_what_is_allowed():
    assert Param("lr", 1e-3, 1e-1, log=True).widened("high") == pytest.approx((1e-3, 1.0))
    assert Param("lr", 1e-3, 1e-1, log=True).widened("low") == pytest.approx((1e-4, 1e-1))
    assert Param("warmup_fraction", 0.1, 0.3, log=False).widened("low") == (0.0, 0.3)
    assert Param("warmup_fraction", 0.05, 0.3, log=False).widened("low") == pytest.approx((0.025, 0.3))  # not below 0
    assert Param("warmup_fraction", 0.0, 0.3, log=False).widened("low") is None  # already from 0: nothing lower
    assert Param("warmup_fraction", 0.0, 0.3, log=False).widened("high") == pytest.approx((0.0, 0.45))
    momentum = Param("one_minus_momentum", 0.02, 0.5, log=True).widened("high")
    assert momentum[1] < 1.0  # momentum stays above 0
    assert Param("epochs", 2, 8, log=True).widened("high") == (2, 16)


def test_a_point_becomes_the_overrides_of_its_keys():
    values = {"lr": 0.01, "weight_decay": 0.05, "one_minus_momentum": 0.1, "warmup_fraction": 0.25, "epochs": 4}
    assert overrides(values, "lamb", base_epochs=5, beta2=0.999) == [
        "optimizer.lr=0.01",
        "optimizer.weight_decay=0.05",
        "optimizer.betas=[0.9, 0.999]",
        "lr_schedule.warmup_steps=null",
        "lr_schedule.warmup_epochs=1.0",
        "epochs=4",
    ]
    assert "optimizer.momentum=0.9" in overrides(values, "sgd", base_epochs=5, beta2=0.999)
    # without a searched budget, the warmup share is of the base config's epochs
    assert "lr_schedule.warmup_epochs=2.5" in overrides({"warmup_fraction": 0.25}, "adamw", base_epochs=10, beta2=0.999)


def test_the_unit_cube_has_one_coordinate_per_parameter_any_optimizer_searches():
    a = (Param("lr", 1e-3, 1e-1, log=True), Param("epochs", 1, 3, log=False))
    b = (Param("lr", 1e-2, 1.0, log=True), Param("one_minus_momentum", 0.01, 0.1, log=True))
    assert dimensions([a, b]) == ["lr", "one_minus_momentum", "epochs"]
    unit = {"lr": 0.5, "one_minus_momentum": 0.5, "epochs": 0.99}
    assert point_values(a, unit, 256, 256) == {"lr": pytest.approx(1e-2), "epochs": 3}
    assert point_values(b, unit, 256, 256)["lr"] == pytest.approx(0.1)  # the same point, its own range


@pytest.mark.parametrize(
    ("search", "expected"),
    [
        ({"lr": {"low": 0.1, "high": 0.1}}, "search.lr: the range [0.1, 0.1] is empty; give low < high"),
        ({"lr": {"low": 0.0, "high": 0.1}}, "search.lr: a log range must stay above 0"),
        ({"lr": {"low": 0.01}}, "search.lr: give the range as low=..., high=..."),
        ({"lr": {"low": 0.01, "high": 0.1, "scale": "square"}}, "search.lr.scale: unknown scale 'square'"),
        ({"lr": {"low": 0.01, "high": 0.1, "steps": 3}}, "search.lr: unknown key 'steps'"),
        ({"momentum": {"low": 0.01, "high": 0.1}}, "search: unknown parameter 'momentum'; searchable: lr,"),
        ({"one_minus_momentum": {"low": 0.1, "high": 1.5}}, "leaves the allowed (0, 1)"),
        ({"epochs": {"low": 1.5, "high": 4}}, "search.epochs: epochs are whole numbers"),
        ({}, "search: search at least the learning rate"),
    ],
)
def test_a_bad_range_is_one_sentence_naming_its_key(search, expected):
    with pytest.raises(UserError) as error:
        parse_space(search, "search", "study.py")
    assert expected in str(error.value)
    assert str(error.value).startswith("study.py: search")


def test_both_warmup_forms_at_once_are_refused():
    with pytest.raises(UserError, match="warmup_fraction or warmup_epochs, not both"):
        parse_space({"warmup_fraction": {"low": 0, "high": 0.2}, "warmup_epochs": {"low": 0, "high": 1}}, "search", "s.py")
    assert math.isfinite(Param("warmup_epochs", 0.0, 1.0, log=False).value(0.3, 64, 64))


def test_a_choice_that_used_its_cells_longest_or_shortest_budget_is_an_edge():
    """Epochs 1 to 4: 4 sits at 0.875 of the range (each whole number a quarter), inside the
    10% margin's reach no more, yet it is the longest run the cell allowed; 1, at 0.125, the
    shortest (a shorter schedule might reach a target sooner)."""
    epochs = (Param("epochs", 1, 4, log=False),)
    assert epochs[0].position(4, 256, 256) == pytest.approx(0.875)
    assert edges(epochs, {"epochs": 4}, 256, 256) == [("epochs", "high", pytest.approx(0.875))]
    assert edges(epochs, {"epochs": 1}, 256, 256) == [("epochs", "low", pytest.approx(0.125))]
    assert edges(epochs, {"epochs": 3}, 256, 256) == edges(epochs, {"epochs": 2}, 256, 256) == []
    piloted = (Param("epochs", 1, 4, log=False, scale="pilot", pilot_b_crit=256),)  # twice the range at 768
    assert piloted[0].bounds(768, 256) == (2.0, 8.0) and edges(piloted, {"epochs": 8}, 768, 256)[0][1] == "high"
