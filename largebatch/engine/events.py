"""The events of a run, in the order they fire.

::

    before_run
    before_train
    for epoch in epochs:
        before_epoch
        for step in the epoch's windows:        # one optimizer step each
            before_step                         # grads are zero
            for micro in range(A):              # A micro-batches; DDP no_sync on all but the last
                before_micro_step               # batch on the device, mixup applied
                after_forward                   # outputs and this micro-batch's loss
                after_backward                  # gradients of this micro-batch accumulated
            before_optimizer_step               # grads complete: all-reduced, unscaled; clipping here
            after_optimizer_step                # parameters updated; lr for the next step set
            after_step                          # counters advanced: log, measure, checkpoint, stop
            (evaluation events here too when a hook called state.request_eval())
        after_epoch
        before_eval                             # when evaluation is due
        after_eval_batch                        # per evaluation batch
        after_eval
    after_train                                 # then the final weights (largebatch.launch), unless interrupted
    after_run
    on_exception                                # on any error, then the error is re-raised

Only ``before_micro_step``, ``after_forward`` and ``after_backward`` fire once per
micro-batch (``A`` times per step; fewer in a trailing partial window, see
``largebatch.batching``). Every other step event fires once per optimizer step.
"""

from __future__ import annotations

import enum


class Event(str, enum.Enum):  # noqa: UP042 - str(Event.X) stays "Event.X", as messages expect
    """A point in the loop where hooks run; the value is the hook method's name."""

    BEFORE_RUN = "before_run"
    BEFORE_TRAIN = "before_train"
    BEFORE_EPOCH = "before_epoch"
    BEFORE_STEP = "before_step"
    BEFORE_MICRO_STEP = "before_micro_step"
    AFTER_FORWARD = "after_forward"
    AFTER_BACKWARD = "after_backward"
    BEFORE_OPTIMIZER_STEP = "before_optimizer_step"
    AFTER_OPTIMIZER_STEP = "after_optimizer_step"
    AFTER_STEP = "after_step"
    AFTER_EPOCH = "after_epoch"
    BEFORE_EVAL = "before_eval"
    AFTER_EVAL_BATCH = "after_eval_batch"
    AFTER_EVAL = "after_eval"
    AFTER_TRAIN = "after_train"
    AFTER_RUN = "after_run"
    ON_EXCEPTION = "on_exception"
