"""A name the training state held before it was grouped by lifetime fails with one line
naming its new place, and that place holds it on a real state."""

from __future__ import annotations

import pytest
import torch

from largebatch.engine.state import MOVED
from tests.engine.helpers import make_engine

# The names TrainState had before the split (git show 5f6a42d^:largebatch/engine/state.py),
# less those it still has (the counters, eval_metrics, hook_times, request_stop, ...).
BEFORE_THE_SPLIT = (
    "cfg config derived plan dist backend model train_model optimizer schedule scaler mixup task run_dir random batch "
    "outputs loss window_size micro_in_window step_loss lr grad_norm metrics skip_step grad_norms log_record "
    "stop_resumable sync_first_micro hooks sync_every_micro sharded extra_models skip_eval_models rank world_size "
    "is_main accumulation epochs total_steps"
).split()


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
