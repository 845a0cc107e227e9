"""The global batch as a controlled variable: fixed, ramped by samples seen, or adaptive.

The critical batch is small early in training and grows as the loss falls (McCandlish et
al. 2018, "An Empirical Model of Large-Batch Training", arXiv:1812.06162; Merrill et al.
2025 measured it along OLMo pretraining and grew the batch when it allowed; Smith et al.
2018 grow the batch instead of decaying the learning rate). The config's
``batch_schedule`` section sets the batch along training:

* ``fixed``: ``global_batch_size`` throughout (the default; runs are the same bytes as
  before the section existed).
* ``ramp``: stages by samples seen, from ``start_batch_size`` to ``global_batch_size``,
  doubling (or adding ``increment``) at evenly spaced sample counts, the last stage
  starting at ``ramp_samples`` (Megatron-LM's ``--rampup-batch-size`` in samples).
* ``adaptive``: starts at ``start_batch_size`` and doubles, never above
  ``max_batch_size``, when the criterion says the doubled batch is still efficient. The
  criterion ``noise_scale`` reads the ``noise_scale`` hook's smoothed B_simple: in
  McCandlish et al.'s model a step at batch B costs ``1 + B_noise / B`` times the steps of
  an infinite batch and ``1 + B / B_noise`` times the samples of batch 1; at
  ``B = B_noise`` both are twice their floor, the balance the paper calls critical. The
  batch grows to 2B when ``factor x B_simple >= 2B``: 2B is still at or below the
  (scaled) critical batch. It is checked each time the samples seen cross a multiple of
  ``check_every_samples``, at a step boundary, and the decision is agreed over ranks.
  The criterion ``branch`` forks at B and 2B from the exact state at each check and grows
  when 2B keeps ``1 - branch_tolerance`` of B's progress in held-out loss
  (``largebatch.engine.branch_fork``; the rule, ``critical_k``, is the critical-batch
  study's, and lives here so that both read one copy).

**How the batch changes.** Devices and the micro-batch stay as they are: every batch is
``micro_batch_size x world_size x A`` and only the accumulation ``A`` changes. The
loader's stream of micro-batches does not depend on the schedule (it is a function of the
seed, the epoch and the position); only how many micro-batches form one optimizer step
does. A window never crosses an epoch's end: the last window of an epoch takes what is
left when that is fewer than ``A`` micro-batches (a smaller step, its loss weighted as
``partial_window: step`` weights it). The position in the epoch is kept in samples
(``samples_in_epoch``), the batch in force and the adaptive decisions in the checkpoint,
so a resumed or requeued run goes on with the same stage and never restarts a ramp.

**What follows the batch.** Every schedule is indexed by samples seen, in units of the
config's global batch: position ``p = samples_seen / global_batch_size`` ("steps at
``global_batch_size``"). The learning-rate schedule's warmup and decay, the EMA warmup,
and intervals given in steps (``checkpoint.interval_steps``, the ``eval`` hook's) read
``p``; with ``fixed``, ``p`` is the step count itself, so nothing changes. The learning
rate is the schedule's times ``lr_multiplier(rule, B / global_batch_size)`` (sqrt for
AdamW and LAMB, linear for SGD and LARS, or ``none``; the critical-batch study's branches
use the same rules), or AdaScale's gain (below): ``optimizer.lr`` is the rate at ``global_batch_size``. The EMA's decay per
step is ``decay^(B / global_batch_size)``, the same decay per sample. With
``keep_wd_timescale`` (AdamW), weight decay is multiplied by ``(B / G) / lr_multiplier``
so that ``lr x weight_decay / B`` stays constant: AdamW's weights are an exponential
average over ``B / (lr x weight_decay)`` samples (Bergsma et al. 2025, "Power Lines"),
which the batch change then leaves as it was.

**AdaScale** (``lr_scaling = 'adascale'``; Johnson et al. 2020, "AdaScale SGD: A User-Friendly
Algorithm for Distributed Training", arXiv:2007.05105). AdaScale multiplies the rate tuned at
batch ``B0`` by the gain ``r = E|g_B|^2 / E|g_B0|^2 = (tr(Sigma) / B0 + |G|^2) / (tr(Sigma) / B +
|G|^2)`` at batch ``B`` (their ``B = S B0``: ``r = (sigma^2 + mu^2) / (sigma^2 / S + mu^2)`` with
``sigma^2`` the variance at ``B0``). Here the rate is tuned at ``G = global_batch_size``, so the
factor at ``B`` is that gain with ``B0 = G``; dividing through by ``|G|^2``, with ``B_simple =
tr(Sigma) / |G|^2`` the ``noise_scale`` hook's smoothed estimate,
``adascale_multiplier = (1 + B_simple / G) / (1 + B_simple / B)``: 1 at ``B = G``, between
``B / G`` and 1 on either side, ``B / G`` (the linear rule) as ``B_simple`` grows past both
batches (noise dominates: averaging ``B / G`` times more samples is worth ``B / G`` times the
step) and 1 (no scaling) as it falls below both (no noise: a larger batch gives the same
gradient). It is the sqrt rule exactly when ``B_simple = sqrt(B G)``. The estimate is the
previous steps' (the factor of a step is fixed before its gradients exist); until the hook has
one (its first step, and while the smoothed ``|G|^2`` is not positive or ``B_simple`` is
negative) the optimizer's default rule stands in (sqrt for AdamW and LAMB, linear for SGD and
LARS), which lies within AdaScale's range. AdaScale's "scale-invariant iterations", which
stretch the schedule by the gain, are not taken: the schedule stays indexed by samples seen.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from largebatch.batching import nearest_valid_global_batches
from largebatch.errors import ConfigError, UserError, whole_number

if TYPE_CHECKING:
    from largebatch.config.sections import Config

LR_RULES = ("sqrt", "linear", "none")
# The learning-rate rule by optimizer type when none is named (batch_schedule.lr_scaling, a study's branches):
# Adam-family and LAMB scale with sqrt(k) (Malladi et al. 2022; You et al. 2019), SGD and LARS with k (Goyal et al. 2017).
DEFAULT_LR_RULE = {"adamw": "sqrt", "adam": "sqrt", "lamb": "sqrt", "sgd": "linear", "lars": "linear"}
# batch_schedule.lr_scaling's choices: the rules above and AdaScale's gain, which reads the noise_scale hook's estimate
BATCH_LR_RULES = (*LR_RULES, "adascale")


def lr_multiplier(rule: str, k: float) -> float:
    """The learning rate's factor at k x B: ``sqrt`` sqrt(k), ``linear`` k, ``none`` 1 (``k``
    may be a fraction: a ramp's early stages, ``largebatch.batch_schedule``)."""
    if rule not in LR_RULES:
        raise ValueError(f"unknown learning-rate rule {rule!r}")
    return math.sqrt(k) if rule == "sqrt" else float(k) if rule == "linear" else 1.0


def adascale_multiplier(b_simple: float, batch: int, reference_batch: int) -> float:
    """AdaScale's gain at ``batch`` against ``reference_batch`` (the batch the rate is tuned at),
    ``(1 + b_simple / reference_batch) / (1 + b_simple / batch)`` (module docstring).

    Args:
        b_simple: the noise scale ``tr(Sigma) / |G|^2``, at least 0.
        batch: the global batch of the step.
        reference_batch: the config's ``global_batch_size``.

    Returns:
        The learning rate's factor: 1 at ``b_simple`` 0, ``batch / reference_batch`` as it grows.
    """
    return (1 + b_simple / reference_batch) / (1 + b_simple / batch)


def branch_efficiency(start: float, losses: Mapping[int, float]) -> dict[int, float] | None:
    """k -> ``(L0 - L(k)) / (L0 - L(1))`` from the held-out loss at the start ``L0`` and at the
    end of each branch (None when the k = 1 branch made no progress; ``largebatch.study.branches``)."""
    progress = start - losses[1]
    if not progress > 0:
        return None
    return {k: (start - loss) / progress for k, loss in sorted(losses.items())}


def critical_k(efficiency: Mapping[int, float], base_batch: int, tolerance: float) -> tuple[int, float, bool]:
    """(critical k, critical batch interpolated in log k, whether every k was efficient): the
    largest k whose efficiency, and every smaller k's, is at least ``1 - tolerance``."""
    ks = sorted(efficiency)
    k = ks[0]
    for candidate in ks:
        if efficiency[candidate] < 1 - tolerance:
            break
        k = candidate
    if k == ks[-1]:
        return k, float(k * base_batch), True
    after = ks[ks.index(k) + 1]
    hi, lo = efficiency[k], efficiency[after]  # hi >= 1 - tolerance > lo
    fraction = (hi - (1 - tolerance)) / (hi - lo)
    return k, base_batch * math.exp(math.log(k) + fraction * (math.log(after) - math.log(k))), False


# Adaptive checks every this many steps at the config's global batch when check_every_samples is None.
DEFAULT_CHECK_STEPS = 10


@dataclasses.dataclass(frozen=True)
class BatchSchedule:
    """The global batch along a run at one world size (what ``config show`` prints).

    Attributes:
        type: ``'fixed'``, ``'ramp'`` or ``'adaptive'``.
        reference_batch: the config's ``global_batch_size`` (``G``): the lr is
            ``optimizer.lr`` at it, and positions count steps at it.
        unit: ``micro_batch_size x world_size``; every batch is a multiple of it.
        batches: the batches the run may take, in order (fixed: ``(G,)``; ramp: the
            stages'; adaptive: start, 2 x start, ... up to the maximum).
        boundaries: ramp: the samples seen at which each stage starts; otherwise ``(0,)``.
        lr_rule: ``'sqrt'``, ``'linear'``, ``'none'`` or ``'adascale'``.
        fallback_rule: ``'adascale'``: the rule while the noise scale has no estimate (the
            optimizer's default; otherwise ``lr_rule`` itself).
        keep_wd_timescale: scale weight decay with the batch (module docstring).
        check_every_samples: adaptive: the criterion's check interval in samples.
        factor: adaptive: the criterion's factor.
        criterion: adaptive: ``'noise_scale'`` or ``'branch'``.
        branch_samples: ``'branch'``: the samples each fork trains on.
        branch_tolerance: ``'branch'``: the fraction of the B fork's progress the 2B fork may lose.
    """

    type: str
    reference_batch: int
    unit: int
    batches: tuple[int, ...]
    boundaries: tuple[int, ...]
    lr_rule: str
    keep_wd_timescale: bool = False
    check_every_samples: int = 0
    factor: float = 1.0
    criterion: str = ""
    branch_samples: int = 0
    branch_tolerance: float = 0.0
    fallback_rule: str = ""

    @property
    def fixed(self) -> bool:
        return self.type == "fixed"

    def accumulation(self, batch: int) -> int:
        """Micro-batches per device per step at global batch ``batch``."""
        return batch // self.unit

    def lr_multiplier(self, batch: int, b_simple: float = math.nan) -> float:
        """The learning rate's factor at ``batch`` (1 at the config's global batch); ``'adascale'``
        reads ``b_simple`` (the fallback rule's factor while it is NaN or negative)."""
        if self.lr_rule != "adascale":
            return lr_multiplier(self.lr_rule, batch / self.reference_batch)
        if math.isfinite(b_simple) and b_simple >= 0:
            return adascale_multiplier(b_simple, batch, self.reference_batch)
        return lr_multiplier(self.fallback_rule, batch / self.reference_batch)

    def weight_decay_multiplier(self, batch: int, b_simple: float = math.nan) -> float:
        """Weight decay's factor at ``batch``: ``(B / G) / lr_multiplier`` with
        ``keep_wd_timescale``, else 1."""
        if not self.keep_wd_timescale:
            return 1.0
        return (batch / self.reference_batch) / self.lr_multiplier(batch, b_simple)

    def position(self, samples_seen: int, step: int) -> float:
        """Progress in steps at the config's global batch: ``step`` when fixed (exactly
        today's numbers), else ``samples_seen / G``."""
        return float(step) if self.fixed else samples_seen / self.reference_batch

    def ramp_batch(self, samples_seen: int) -> int:
        """The ramp's batch for a step that starts at ``samples_seen``."""
        return self.batches[bisect.bisect_right(self.boundaries, samples_seen) - 1]

    def count_steps(self, batch_at: Callable[[int], int], micro_batches_per_epoch: int, epochs: int) -> list[int]:
        """Steps the run takes at each of ``batches`` when a step starting at samples seen
        ``s`` has batch ``batch_at(s)`` (windows cut at each epoch's end as the engine cuts them)."""
        steps = [0] * len(self.batches)
        per_epoch = micro_batches_per_epoch
        samples = 0
        for _ in range(epochs):
            used = 0
            while used < per_epoch:
                batch = batch_at(samples)
                window = min(self.accumulation(batch), per_epoch - used)
                used += window
                samples += window * self.unit
                steps[self.batches.index(batch)] += 1
        return steps

    def stages(self, micro_batches_per_epoch: int, epochs: int) -> list[dict[str, Any]]:
        """Each stage as ``config show`` prints it: samples from, global batch,
        accumulation, lr multiplier, steps in it (adaptive: the steps if the run stayed
        at the start batch, for the start; None for the later ones, which the criterion decides;
        the lr multiplier None under ``'adascale'``, which the noise scale sets along training)."""
        if self.type == "adaptive":
            steps: list[int | None] = [self.count_steps(lambda _: self.batches[0], micro_batches_per_epoch, epochs)[0]]
            steps += [None] * (len(self.batches) - 1)
            starts: list[int | None] = [0] + [None] * (len(self.batches) - 1)
        else:
            steps = list(self.count_steps(self.ramp_batch, micro_batches_per_epoch, epochs))
            starts = list(self.boundaries)
        return [
            {
                "samples_from": start,
                "global_batch": batch,
                "accumulation": self.accumulation(batch),
                "lr_multiplier": None if self.lr_rule == "adascale" else self.lr_multiplier(batch),
                "steps": count,
            }
            for start, batch, count in zip(starts, self.batches, steps)
        ]

    def criterion_settings(self) -> dict[str, Any]:
        """Adaptive: the criterion's settings as ``config show`` prints them (``branch``: with
        ``fork_share``, the forks' training samples per training sample, ``2 x branch_samples /
        check_every_samples``)."""
        settings: dict[str, Any] = {"name": self.criterion, "check_every_samples": self.check_every_samples}
        if self.criterion == "branch":
            share = 2 * self.branch_samples / self.check_every_samples
            return {**settings, "branch_samples": self.branch_samples, "branch_tolerance": self.branch_tolerance, "fork_share": share}
        return {**settings, "factor": self.factor}

    def run_steps(self, micro_batches_per_epoch: int, epochs: int) -> int:
        """Steps of the whole run (adaptive: at most this, the count at the start batch)."""
        batch_at = self.ramp_batch if self.type == "ramp" else (lambda _: self.batches[0])
        return sum(self.count_steps(batch_at, micro_batches_per_epoch, epochs))


def build_batch_schedule(cfg: Config, world_size: int) -> BatchSchedule:
    """The config's ``batch_schedule`` at ``world_size``.

    Raises:
        ConfigError: a batch of the schedule that is not a multiple of ``micro_batch_size x
            world_size``, naming the key and the nearest valid values.
    """
    section, reference = cfg.batch_schedule, cfg.global_batch_size
    unit = cfg.micro_batch_size * world_size
    default = DEFAULT_LR_RULE.get(cfg.optimizer.type, "sqrt")
    rule = section.lr_scaling or default
    kept = {"keep_wd_timescale": section.keep_wd_timescale, "fallback_rule": default if rule == "adascale" else rule}
    if section.type == "fixed":
        return BatchSchedule("fixed", reference, unit, (reference,), (0,), rule, **kept)
    start = section.start_batch_size
    assert start is not None  # validation requires it
    _check_multiple(start, cfg, world_size, "batch_schedule.start_batch_size")
    if section.type == "ramp":
        assert section.ramp_samples is not None
        batches = ramp_batches(start, reference, section.increment)
        if section.increment is not None:
            _check_multiple(section.increment, cfg, world_size, "batch_schedule.increment")
        gaps = len(batches) - 1
        boundaries = tuple(i * section.ramp_samples // gaps for i in range(len(batches)))
        return BatchSchedule("ramp", reference, unit, batches, boundaries, rule, **kept)
    top = section.max_batch_size or reference
    batches = doublings(start, top)
    every = section.check_every_samples or DEFAULT_CHECK_STEPS * reference
    branch_samples = section.branch_samples or 0
    if section.criterion == "branch" and branch_samples % top:
        raise ConfigError(
            f"{branch_samples} is not a whole number of steps at the largest batch {top} (max_batch_size); "
            f"set it to a multiple of {top}, e.g. {max(top, branch_samples // top * top)}",
            key="batch_schedule.branch_samples",
        )
    return BatchSchedule(
        "adaptive",
        reference,
        unit,
        batches,
        (0,),
        rule,
        check_every_samples=every,
        factor=section.factor,
        criterion=section.criterion,
        branch_samples=branch_samples,
        branch_tolerance=section.branch_tolerance,
        **kept,
    )


def ramp_batches(start: int, end: int, increment: int | None) -> tuple[int, ...]:
    """The ramp's stage batches from ``start`` to ``end`` (validated: they meet ``end``)."""
    if increment is None:
        return doublings(start, end)
    return tuple(range(start, end + 1, increment))


def doublings(start: int, end: int) -> tuple[int, ...]:
    """``start, 2 start, 4 start, ...`` up to ``end``."""
    out = [start]
    while out[-1] * 2 <= end:
        out.append(out[-1] * 2)
    return tuple(out)


def _check_multiple(batch: int, cfg: Config, world_size: int, key: str) -> None:
    unit = cfg.micro_batch_size * world_size
    if batch % unit:
        nearest = " or ".join(str(n) for n in nearest_valid_global_batches(batch, cfg.micro_batch_size, world_size))
        raise ConfigError(
            f"{batch} is not a multiple of micro_batch_size {cfg.micro_batch_size} x world_size {world_size} = {unit} "
            f"(the batch grows through accumulation); set it to {nearest}",
            key=key,
        )


@dataclasses.dataclass
class BatchController:
    """The batch in force during a run: the schedule plus, for ``adaptive``, the decisions
    taken so far. Saved in checkpoints (``state_dict``) beside the counters.

    Attributes:
        schedule: the run's ``BatchSchedule``.
        batch: the global batch of the next step.
        decisions: adaptive: ``[samples_seen, step, criterion, new batch]`` of each growth.
        criterion: the criterion's value at the last check (NaN before one).
        b_simple: ``lr_scaling = 'adascale'``: the ``noise_scale`` hook's smoothed B_simple after
            the last step (NaN before an estimate). Not saved here: the hook's averages are
            (``state_dict``), and the hook sets it from them again when a run resumes.
    """

    schedule: BatchSchedule
    batch: int = 0
    decisions: list[list[float]] = dataclasses.field(default_factory=list)
    criterion: float = math.nan
    b_simple: float = math.nan

    def __post_init__(self) -> None:
        if not self.batch:
            self.batch = self.schedule.batches[0]

    def lr_multiplier(self, batch: int) -> float:
        """The learning rate's factor at ``batch`` now (``BatchSchedule.lr_multiplier``)."""
        return self.schedule.lr_multiplier(batch, self.b_simple)

    def weight_decay_multiplier(self, batch: int) -> float:
        """Weight decay's factor at ``batch`` now (``BatchSchedule.weight_decay_multiplier``)."""
        return self.schedule.weight_decay_multiplier(batch, self.b_simple)

    def batch_for(self, samples_seen: int) -> int:
        """The global batch of the step that starts at ``samples_seen``."""
        if self.schedule.type == "ramp":
            self.batch = self.schedule.ramp_batch(samples_seen)
        return self.batch

    def check_due(self, samples_before: int, samples_after: int) -> bool:
        """Adaptive: whether a step from ``samples_before`` to ``samples_after`` crossed a check."""
        every = self.schedule.check_every_samples
        return self.schedule.type == "adaptive" and samples_after // every > samples_before // every

    def decide(
        self, value: float, grow_anywhere: Callable[[bool], bool], samples_seen: int, step: int, efficient: bool | None = None
    ) -> bool:
        """Adaptive, at a check: grow to 2B when 2B is within the maximum and 2B is
        ``efficient`` (the ``branch`` criterion's verdict), or, when that is None
        (``noise_scale``), when ``factor x value >= 2B``; ``grow_anywhere`` agrees the
        decision over ranks. Returns whether it grew."""
        self.criterion = value
        doubled = 2 * self.batch
        if efficient is None:
            efficient = math.isfinite(value) and self.schedule.factor * value >= doubled
        wanted = doubled <= self.schedule.batches[-1] and efficient
        if not grow_anywhere(wanted):
            return False
        self.batch = doubled
        self.decisions.append([float(samples_seen), float(step), value, float(doubled)])
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "decisions": [list(d) for d in self.decisions], "criterion": self.criterion}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from a checkpoint's ``batch_schedule`` entry, checked against this run's
        schedule: a checkpoint may come from another config (``--ignore-config``), another
        world size or someone else, and a batch the schedule cannot take would train every
        later step at a wrong accumulation.

        Raises:
            UserError: the entry is malformed, or its batch (or a decision's) is not one
                of the batches this run's schedule takes.
        """
        if not state:  # a checkpoint from before the schedule existed: a fixed run's
            return
        allowed = self.schedule.batches
        batch = state.get("batch") if isinstance(state, Mapping) else None
        decisions = state.get("decisions", []) if isinstance(state, Mapping) else None
        criterion = state.get("criterion", math.nan) if isinstance(state, Mapping) else None

        def number(value: Any) -> bool:
            return isinstance(value, int | float) and not isinstance(value, bool)

        malformed = (
            whole_number(batch) is None
            or not isinstance(decisions, list)
            or not all(
                isinstance(d, list) and len(d) == 4 and all(number(v) for v in d) and whole_number(d[3]) is not None for d in decisions
            )
            or not number(criterion)
        )
        if malformed:
            raise UserError(
                "the checkpoint's batch_schedule entry is malformed (expected batch: a whole number, decisions: "
                "[[samples, step, criterion, new batch], ...], criterion: a number); it was not written by this "
                "version of largebatch: resume from another checkpoint or start the run afresh"
            )
        taken = [int(batch), *(int(d[3]) for d in decisions)]
        stray = next((b for b in taken if b not in allowed), None)
        if stray is not None:
            raise UserError(
                f"the checkpoint trained at global batch {stray}, which this run's batch_schedule "
                f"({self.schedule.type}: {', '.join(map(str, allowed))}, a multiple of micro_batch_size x world_size "
                f"= {self.schedule.unit}) cannot take: resume with the batch_schedule, global_batch_size, "
                "micro_batch_size and world size the checkpoint was written with"
            )
        self.batch = int(batch)
        self.decisions = [[float(v) for v in d] for d in decisions]
        self.criterion = float(criterion)


def apply_weight_decay(optimizer: Any, multiplier: float) -> None:
    """Set every group's ``weight_decay`` to its configured value times ``multiplier``
    (``keep_wd_timescale``); the configured value is kept in the group as
    ``base_weight_decay``, so it travels with the optimizer's state into checkpoints."""
    for group in optimizer.param_groups:
        base = group.setdefault("base_weight_decay", group["weight_decay"])
        group["weight_decay"] = base * multiplier
