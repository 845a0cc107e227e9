"""Steps to target from evaluations: the crossing, its bracket and its interpolation,
against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from largebatch.study.target import Crossing, crossing_of, first_crossing, reached


def test_the_crossing_is_interpolated_in_log_step_inside_its_bracket():
    curve = [(100, 0.5), (200, 0.7), (220, 0.78), (230, 0.82), (240, 0.79)]
    crossing = first_crossing(curve, 0.8, "max")
    # halfway from 0.78 to 0.82 in value: halfway from 220 to 230 in log(step)
    assert (crossing.lo, crossing.hi) == (220, 230)
    assert crossing.steps == pytest.approx(math.sqrt(220 * 230))
    assert crossing.resolution == pytest.approx(10 / 220)


def test_a_value_exactly_at_the_target_is_reached_there():
    crossing = first_crossing([(10, 0.5), (20, 0.8)], 0.8, "max")
    assert crossing.steps == pytest.approx(20) and crossing.lo == 10


def test_a_loss_target_is_reached_from_above():
    crossing = first_crossing([(1, 2.0), (2, 1.0), (4, 0.4)], 0.6, "min")
    share = (0.6 - 1.0) / (0.4 - 1.0)
    assert crossing.steps == pytest.approx(math.exp(math.log(2) + share * math.log(2)))
    assert reached(0.6, 0.6, "min") and not reached(0.61, 0.6, "min")


def test_never_reached_missing_values_and_the_first_evaluation():
    assert first_crossing([(1, 0.1), (2, 0.2)], 0.8, "max") is None
    skipped = first_crossing([(1, 0.5), (2, None), (3, float("nan")), (4, 0.9)], 0.8, "max")
    assert (skipped.lo, skipped.hi) == (1, 4)
    first = first_crossing([(5, 0.9)], 0.8, "max")
    assert first.steps == 5 and first.lo == 0 and math.isinf(first.resolution)


def test_a_crossing_round_trips_through_its_stored_form():
    crossing = Crossing(211.5, 205, 213)
    assert Crossing.from_dict(crossing.record()) == crossing
    assert Crossing.from_dict(None) is None


def test_a_trial_holds_a_crossing_per_target_and_split_and_one_of_an_earlier_single_target_study():
    import types

    from largebatch.study.spec import Target

    early, late = Target("top1", 0.78, "max"), Target("top1", 0.86, "max")
    both = {"crossings": {early.key: {"eval": {"steps": 90.5, "lo": 88, "hi": 92}, "test": None}, late.key: {"eval": None, "test": None}}}
    trial = types.SimpleNamespace(user_attrs={"outcome": both})
    assert crossing_of(trial, early) == Crossing(90.5, 88, 92) and crossing_of(trial, early, "test") is None
    assert crossing_of(trial, late) is None
    older = types.SimpleNamespace(user_attrs={"outcome": {"eval_crossing": {"steps": 12.0, "lo": 11, "hi": 13}, "test_crossing": None}})
    assert crossing_of(older, early) == Crossing(12.0, 11, 13) and crossing_of(older, early, "test") is None
