"""A name the training state held before it was grouped by lifetime fails with one line
naming its new place, and that place holds it on a real state."""

from __future__ import annotations

import dataclasses
import pathlib
import re

import pytest
import torch

from largebatch.engine.state import MOVED, Counters
from tests.engine.helpers import make_engine

# The names TrainState had before the split (git show 5f6a42d^:largebatch/engine/state.py),
# less those it still has (the counters, eval_metrics, hook_times, request_stop, hooks,
# extra_models, skip_eval_models, sync_first_micro, ...).
BEFORE_THE_SPLIT = (
    "cfg config derived plan dist backend model train_model optimizer schedule scaler mixup task run_dir random batch "
    "outputs loss window_size micro_in_window step_loss lr grad_norm metrics skip_step grad_norms log_record "
    "stop_resumable sync_every_micro sharded rank world_size is_main accumulation epochs total_steps"
).split()
STILL_THERE = "hooks extra_models skip_eval_models sync_first_micro".split()


@pytest.fixture
def state():
    model = torch.nn.Linear(3 * 16 * 16, 10)
    engine = make_engine(model, [], global_batch_size=8, micro_batch_size=8, num_samples=8)
    model(torch.randn(2, 3 * 16 * 16)).sum().backward()
    engine.state.compute_grad_norms()
    return engine.state


def place(state, path: str):
    value = state
    for name in path.removeprefix("state.").split("."):
        value = getattr(value, name)
    return value


def test_every_name_of_the_old_state_is_listed():
    assert sorted(MOVED) == sorted(BEFORE_THE_SPLIT)


@pytest.mark.parametrize("name", sorted(MOVED))
def test_a_moved_name_read_or_written_names_its_new_place(state, name):
    new_place = MOVED[name][0]
    with pytest.raises(AttributeError) as read:
        getattr(state, name)
    message = str(read.value)
    assert message.startswith(f"state.{name} moved to {new_place}") and "CHANGELOG.md" in message and "\n" not in message
    with pytest.raises(AttributeError, match=f"^state.{name} moved to "):
        setattr(state, name, None)
    place(state, new_place)  # exists there


def test_new_places_hold_what_the_old_names_did(state):
    assert place(state, MOVED["run_dir"][0]) is state.run.run_dir and place(state, MOVED["model"][0]) is state.run.model
    assert place(state, MOVED["accumulation"][0]) == 1 and place(state, MOVED["epochs"][0]) == state.run.config.epochs
    gradient = torch.cat([p.grad.flatten() for p in state.run.model.parameters()])
    assert float(place(state, MOVED["grad_norm"][0])) == pytest.approx(float(torch.linalg.vector_norm(gradient)))


def test_other_missing_names_stay_plain_attribute_errors(state):
    assert not hasattr(state, "run_dir") and getattr(state, "run_dir", "default") == "default"
    with pytest.raises(AttributeError, match="'TrainState' object has no attribute 'no_such_name'"):
        _ = state.no_such_name
    state.eval_metrics = {"eval/top1": 0.5}  # names the state has are written as before
    assert state.eval_metrics == {"eval/top1": 0.5}


def test_names_the_state_holds_again_are_not_listed_as_moved(state):
    for name in STILL_THERE:
        assert name not in MOVED and name in {f.name for f in dataclasses.fields(state)}
        setattr(state, name, getattr(state, name))  # a declared field, written as any other


def test_every_attribute_is_declared(state):
    """No attribute is added after construction: the state's and the run's are their fields."""
    state.request_stop("x", resumable=True)
    state.register_model("copy", state.run.model, evaluate=False)
    state.request_first_micro_sync()
    assert set(vars(state)) == {f.name for f in dataclasses.fields(state)}
    assert set(vars(state.run)) == {f.name for f in dataclasses.fields(state.run)}
    assert (state.interrupted, state.extra_models, state.skip_eval_models, state.sync_first_micro) == (
        True,
        {"copy": state.run.model},
        {"copy"},
        True,
    )


@pytest.mark.parametrize("name", ["config", "model", "guard"])
def test_the_run_is_frozen(state, name):
    with pytest.raises(dataclasses.FrozenInstanceError, match=f"cannot assign to field '{name}'"):
        setattr(state.run, name, None)


def test_the_runs_read_only_views_follow_derived_and_dist(state):
    run = state.run
    assert (run.plan, run.total_steps, run.sharded) == (run.derived.plan, run.derived.run_steps, run.derived.sharded)
    assert (run.rank, run.world_size, run.is_main) == (run.dist.rank, run.dist.world_size, run.dist.rank == 0)


def test_counter_transitions_against_counts_written_out():
    """Two epochs of two steps of three micro-batches of 4 samples on 2 ranks, by the transitions."""
    model = torch.nn.Linear(3 * 16 * 16, 10)
    state = make_engine(model, [], global_batch_size=8, micro_batch_size=4, num_samples=16).state
    for _ in range(2):
        for _ in range(2):
            for _ in range(3):
                state.advance_micro_step(4 * 2)
            state.advance_step()
        assert state.step_in_epoch == 2
        state.finish_epoch()
    assert state.counters == Counters(step=4, micro_step=12, samples_seen=96, epoch=2, step_in_epoch=0)


def test_evaluation_and_resume_transitions_against_values_written_out(state):
    """``record_eval`` sets the results and their step together, ``add_eval_metrics``
    adds a hook's values to them, ``restore`` puts back a checkpoint's counters and step."""
    state.advance_micro_step(8)
    state.advance_step()
    state.record_eval({"eval/loss": 2.0, "eval/top1": 0.5})
    state.add_eval_metrics({"noise_scale/at_loss/step": 1.0, "eval/top1": 0.25})
    assert (state.eval_metrics, state.last_eval_step) == ({"eval/loss": 2.0, "eval/top1": 0.25, "noise_scale/at_loss/step": 1.0}, 1)
    saved = Counters(step=7, micro_step=21, samples_seen=168, epoch=3, step_in_epoch=1).state_dict()
    state.restore(saved, 6)
    assert (state.counters, state.step, state.step_in_epoch, state.last_eval_step) == (Counters(7, 21, 168, 3, 1), 7, 1, 6)


def documented(part: str) -> list[str]:
    """The names docs/hooks.md's state table lists in the row that starts with ``part``."""
    table = (pathlib.Path(__file__).parents[2] / "docs" / "hooks.md").read_text()
    (row,) = [line for line in table.splitlines() if line.startswith(f"| `{part}")]
    what = row.split("|")[2 if part in ("state.run", "state.current") else 1]  # names in the "what" column, or the first
    names = re.findall(r"`([a-z_.]+)(?:\([^`]*\))?`", what)
    return [name.removeprefix("state.") for name in names if "." not in name.removeprefix("state.")]


@pytest.mark.parametrize(("row", "part"), [("state.run", "run"), ("state.current", "current"), ("state.step", ""), ("state.hooks", "")])
def test_every_name_docs_hooks_md_tells_hook_authors_exists(state, row, part):
    names = documented(row)
    assert len(names) >= 6
    holder = getattr(state, part) if part else state
    missing = [name for name in names if not hasattr(holder, name)]
    assert not missing, f"docs/hooks.md lists {missing} under {row}, which {type(holder).__name__} lacks"
