"""Event counts (Composer's habit): for A in {1, 2, 3} and a trailing partial window,
exactly how often each event, ``optimizer.step`` and ``zero_grad`` fire."""

import collections

import pytest
import torch

from largebatch.engine.events import Event
from largebatch.engine.hook import Hook
from tests.engine.helpers import make_engine

MICRO = 4
CLASSES = 4


class EventCounter(Hook):
    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()
        self.order = []

    def before_run(self, state):
        self._record("before_run")
        for name in ("step", "zero_grad"):
            original = getattr(state.run.optimizer, name)

            def counted(*args, _original=original, _name=name, **kwargs):
                self.counts[f"optimizer.{_name}"] += 1
                return _original(*args, **kwargs)

            setattr(state.run.optimizer, name, counted)

    def _record(self, name):
        self.counts[name] += 1
        self.order.append(name)


for _event in Event:
    if _event not in (Event.BEFORE_RUN, Event.ON_EXCEPTION):
        setattr(EventCounter, _event.value, lambda self, state, _n=_event.value: self._record(_n))


def run_counted(accumulation, full_steps, trailing, policy, epochs=1):
    global_batch = MICRO * accumulation
    num_samples = global_batch * full_steps + MICRO * trailing + 2  # +2: not even a micro-batch
    steps_per_epoch = full_steps + (1 if policy == "step" and trailing else 0)
    micro_batches = full_steps * accumulation + (trailing if policy == "step" else 0)
    torch.manual_seed(0)
    batches = [(torch.randn(MICRO, 6), torch.randint(CLASSES, (MICRO,))) for _ in range(micro_batches)]
    model = torch.nn.Linear(6, CLASSES)
    counter = EventCounter()
    engine = make_engine(
        model,
        batches,
        global_batch_size=global_batch,
        micro_batch_size=MICRO,
        num_samples=num_samples,
        hooks=[counter],
        partial_window=policy,
        epochs=epochs,
        **{"data.num_classes": CLASSES},
    )
    engine.run()
    return counter, steps_per_epoch, micro_batches


@pytest.mark.parametrize("accumulation", [1, 2, 3])
@pytest.mark.parametrize("policy", ["drop", "step"])
def test_event_counts_with_a_trailing_partial_window(accumulation, policy):
    trailing = accumulation - 1  # a partial window of A - 1 micro-batches (none for A = 1)
    epochs = 2
    counter, steps_per_epoch, micro_per_epoch = run_counted(accumulation, 3, trailing, policy, epochs)
    steps = steps_per_epoch * epochs
    micro = micro_per_epoch * epochs
    expected = {
        "before_run": 1,
        "before_train": 1,
        "after_train": 1,
        "after_run": 1,
        "before_epoch": epochs,
        "after_epoch": epochs,
        "before_step": steps,
        "before_optimizer_step": steps,
        "after_optimizer_step": steps,
        "after_step": steps,
        "optimizer.step": steps,
        "optimizer.zero_grad": steps,
        "before_micro_step": micro,
        "after_forward": micro,
        "after_backward": micro,
    }
    assert dict(counter.counts) == expected
    if policy == "step" and trailing:
        assert steps_per_epoch == 4
        assert micro == (3 * accumulation + trailing) * epochs
    else:
        assert steps_per_epoch == 3


def test_event_order_within_a_step():
    counter, _, _ = run_counted(2, 1, 0, "drop")
    assert counter.order == [
        "before_run",
        "before_train",
        "before_epoch",
        "before_step",
        "before_micro_step",
        "after_forward",
        "after_backward",
        "before_micro_step",
        "after_forward",
        "after_backward",
        "before_optimizer_step",
        "after_optimizer_step",
        "after_step",
        "after_epoch",
        "after_train",
        "after_run",
    ]


def test_counters_as_hooks_see_them():
    seen = []

    class Watch(Hook):
        def before_step(self, state):
            seen.append(("before_step", state.step, state.micro_step, state.step_in_epoch))

        def after_backward(self, state):
            seen.append(("after_backward", state.step, state.micro_step, state.current.micro_in_window))

        def after_step(self, state):
            seen.append(("after_step", state.step, state.micro_step, state.samples_seen))

    torch.manual_seed(0)
    batches = [(torch.randn(MICRO, 6), torch.randint(CLASSES, (MICRO,))) for _ in range(4)]
    engine = make_engine(
        torch.nn.Linear(6, CLASSES),
        batches,
        global_batch_size=8,
        micro_batch_size=MICRO,
        num_samples=16,
        hooks=[Watch()],
        **{"data.num_classes": CLASSES},
    )
    engine.run()
    assert seen == [
        ("before_step", 0, 0, 0),
        ("after_backward", 0, 1, 0),
        ("after_backward", 0, 2, 1),
        ("after_step", 1, 2, 8),
        ("before_step", 1, 2, 1),
        ("after_backward", 1, 3, 0),
        ("after_backward", 1, 4, 1),
        ("after_step", 2, 4, 16),
    ]


def test_counters_are_read_only_for_hooks():
    class Writer(Hook):
        def after_step(self, state):
            state.step = 99

    batches = [(torch.randn(MICRO, 6), torch.randint(CLASSES, (MICRO,)))]
    engine = make_engine(
        torch.nn.Linear(6, CLASSES),
        batches,
        global_batch_size=4,
        micro_batch_size=MICRO,
        num_samples=4,
        hooks=[Writer()],
        **{"data.num_classes": CLASSES},
    )
    with pytest.raises(Exception, match="hook Writer failed in after_step"):
        engine.run()
