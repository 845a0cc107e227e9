"""Checkpoints: atomic save, keep the last K, a ``latest`` pointer, exact resume.

Under ``dist.strategy`` fsdp/hsdp a checkpoint is a folder of per-rank slices instead
(``_prepare_sharded``, at the end of this module); otherwise it is one file,
``<run_dir>/checkpoints/step-<N>.pt``, written by rank 0:
model, optimizer, grad scaler, counters, each hook's state, the resolved config and its
hash. No random generator state: every random stream of a run is derived from the seed
and the counters (``largebatch.randomness``), and so is the loader's position. It is written to
a temporary file in the same folder, flushed and fsync'ed, then renamed over its final
name, and the folder is fsync'ed: a crash mid-write leaves the previous checkpoints
intact and never a half-written file under a checkpoint's name. ``latest`` (a text file
naming the newest checkpoint) is replaced the same way, after the checkpoint.

Durability, in order: the checkpoint's bytes are fsync'ed before the rename (so the name
never points at data still in the page cache), the rename is made durable by fsync'ing
the folder, and the folder's own creation by fsync'ing the run directory. Temporary files
left by a crash (``.step-*.pt.tmp``) are never read and are removed by the next save.

A save has two halves: what must happen at the step boundary (``prepare_checkpoint``:
the collectives, and with ``checkpoint.async_save`` a host-memory copy of everything the
checkpoint holds) and the writing it returns, which ``largebatch.checkpoint_writer`` runs
at once or on a background thread. Either way the files appear as described above.

A checkpoint never holds non-finite weights or optimizer state: every rank checks them
before saving and the save is refused with an error naming the tensors (the previous checkpoints stay).

``--resume auto`` takes the newest checkpoint that loads, by step number. ``latest`` is
a hint for people and tools; when it names a missing or unreadable file, or an older one
than the newest on disk, a one-line warning says which file is used instead.

Checkpoints are read as data, never as code (``largebatch.safe_load``): ``weights_only=True``
everywhere, a checkpoint holding anything else refused unless ``--trust-checkpoint`` says to
trust it, and a hook whose state could not be read back that way named when it is saved. The
config a checkpoint holds is the redacted one (``largebatch.config.redact``), as in ``config.yaml``.

Model weights at the end of a run go to ``model.safetensors`` (timm's ``load_state_dict``
accepts them). ``read_model_weights`` reads a model's weights from any of these (a run
directory, an export folder, a ``.safetensors`` file, a checkpoint file or a sharded
checkpoint's folder) for ``model.init_from``. The files' names are ``largebatch.rundir``'s.

What a checkpoint reads and writes of a run is declared here as protocols (``CheckpointedState``,
``CheckpointedRun``, ``CheckpointedHook``, ``Stateful``), which the engine's ``TrainState``,
``Run`` and hooks satisfy: this module is in the runtime layer, below the engine, and imports
none of it. The counters and the step of the last evaluation go back through the state's own
transition (``restore``).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch

from largebatch import safe_load
from largebatch.config.redact import redact
from largebatch.config.schema import default_of
from largebatch.config.sections import Config
from largebatch.errors import UserError
from largebatch.rundir import CHECKPOINTS, LATEST, RunDir

if TYPE_CHECKING:
    from largebatch.backends.base import Backend
    from largebatch.batching import BatchPlan

NAME_PATTERN = re.compile(r"^step-(\d+)(\.pt)?$")  # a file (ddp) or a folder (fsdp/hsdp)
SHARDED_META = "meta.pt"  # in a sharded checkpoint's folder: everything but the tensors

# What a resume reads of a checkpoint's run record (``_run_record``) besides the tensors.
RESUME_KEYS = ("counters", "nan_guard", "hooks", "config")

# Keys that may change between a run and its resumption without changing its maths.
RESUME_FREE_KEYS = (
    "log.",
    "checkpoint.",
    "hooks",
    "max_steps",
    "eval.",
    "ema.eval",
    "data.num_workers",
    "data.prefetch",
    "dist.timeout_minutes",
    "data.root",
    "slurm.",
    "nan_guard.",
    "data.max_pixels",
)


class Stateful(Protocol):
    """What a checkpoint saves and restores the state of: a hook, the non-finite guard, the loader."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class CheckpointedHook(Stateful, Protocol):
    """A hook as a checkpoint sees it (``largebatch.engine.hook.Hook``): its state under its name."""

    @property
    def name(self) -> str: ...

    priority: int


class CheckpointedRun(Protocol):
    """What a checkpoint reads of the run (``largebatch.engine.state.Run``): the objects
    whose tensors and states it saves and restores, and where it writes them."""

    @property
    def config(self) -> Config: ...
    @property
    def model(self) -> torch.nn.Module: ...
    @property
    def optimizer(self) -> torch.optim.Optimizer: ...
    @property
    def scaler(self) -> torch.amp.GradScaler | None: ...
    @property
    def guard(self) -> Stateful: ...
    @property
    def batch(self) -> Stateful: ...
    @property
    def backend(self) -> Backend: ...
    @property
    def run_dir(self) -> RunDir: ...
    @property
    def plan(self) -> BatchPlan: ...
    @property
    def is_main(self) -> bool: ...
    @property
    def world_size(self) -> int: ...


class Counted(Protocol):
    """The run's counters as a checkpoint saves them (``largebatch.engine.state.Counters``)."""

    def state_dict(self) -> dict[str, int]: ...


class CheckpointedState(Protocol):
    """What a checkpoint reads and writes of the training state
    (``largebatch.engine.state.TrainState``): it reads the run, the counters and the step
    of the last evaluation, and puts the saved ones back with ``restore``."""

    @property
    def run(self) -> CheckpointedRun: ...
    @property
    def counters(self) -> Counted: ...
    @property
    def step(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def samples_in_epoch(self) -> int: ...
    @property
    def last_eval_step(self) -> int | None: ...

    def restore(self, counters: dict[str, int], last_eval_step: int | None) -> None: ...


def fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def atomic_torch_save(obj: Any, path: pathlib.Path, what: str) -> None:
    """``torch.save`` to ``path`` so readers see the old file or the whole new one, and only
    when it reads back as data (``weights_only=True``).

    Raises:
        UserError: ``obj`` holds more than tensors and plain values (naming ``what`` is saved).
    """
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())
    safe_load.refuse_unsafe_file(tmp, what)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def config_hash(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Dotted keys whose values differ, ignoring ``RESUME_FREE_KEYS`` and keys the saved
    config lacks because they were added to the schema after it was written, when this
    run leaves them at their default (which keeps the old behaviour)."""
    a, b = flatten(saved), flatten(current)
    keys = sorted(set(a) | set(b))
    return [
        k
        for k in keys
        if a.get(k) != b.get(k)
        and not any(k == f or k.startswith(f) for f in RESUME_FREE_KEYS)
        and not (k not in a and b.get(k) == default_of(k))
    ]


def config_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """``key (old -> new)`` for each dotted key whose value differs between two configs."""
    a, b = flatten(before), flatten(after)
    return [f"{k} ({a.get(k)!r} -> {b.get(k)!r})" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def list_checkpoints(run_dir: RunDir | pathlib.Path) -> list[pathlib.Path]:
    """Complete checkpoints in ``run_dir``, oldest first."""
    folder = RunDir(run_dir).checkpoints
    if not folder.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in folder.iterdir()
        if (m := NAME_PATTERN.match(p.name)) and (p.is_file() if m.group(2) else (p / SHARDED_META).is_file())
    ]
    return [p for _, p in sorted(found)]


def remove_checkpoint(path: pathlib.Path) -> None:
    """Delete a checkpoint file or a sharded checkpoint's folder."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _non_finite(named: Iterable[tuple[str, Any]]) -> list[str]:
    """``name (count of numel)`` for each floating-point tensor holding NaN or inf.

    A tensor's sum is NaN or inf when any of its values is, so one pass over each tensor
    and one host sync for all of them clear the usual case; only the tensors whose sum is
    not finite (a non-finite value, or finite values whose sum overflows) are counted
    value by value. (Counting every tensor that way cost 16 times as long on the CPU.)
    """
    from largebatch.dtensors import local

    tensors = [
        (name, local(tensor).detach())  # a sharded tensor: this rank's slice
        for name, tensor in named
        if isinstance(tensor, torch.Tensor) and (torch.is_floating_point(tensor) or torch.is_complex(tensor))
    ]
    if not tensors:
        return []
    finite_sums = torch.stack([torch.isfinite(tensor.sum()).all() for _, tensor in tensors]).tolist()
    out = []
    for (name, tensor), finite_sum in zip(tensors, finite_sums):
        bad = 0 if finite_sum else int((~torch.isfinite(tensor)).sum())
        if bad:
            out.append(f"{name} ({bad} of {tensor.numel()})")
    return out


def non_finite_tensors(module: torch.nn.Module) -> list[str]:
    """Names of the module's floating-point parameters and buffers holding NaN or inf,
    each with its count of non-finite values."""
    return _non_finite(module.state_dict().items())


def non_finite_optimizer_state(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> list[str]:
    """The optimizer's per-parameter state tensors holding NaN or inf (``name.exp_avg``, ...)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return _non_finite(
        (f"optimizer {names.get(id(param), '?')}.{key}", value) for param, entry in optimizer.state.items() for key, value in entry.items()
    )


def check_finite(state: CheckpointedState) -> None:
    """Refuse to checkpoint weights (or optimizer state) holding NaN or inf.

    Each rank checks what it holds: the whole model, or under fsdp/hsdp its slices, in
    which case the ranks agree (one all-reduce) so that all refuse together or none does.

    Raises:
        UserError: naming the first non-finite tensors and the checkpoint left intact.
    """
    run = state.run
    bad = non_finite_tensors(run.model) + non_finite_optimizer_state(run.optimizer, run.model)
    refuse = bool(bad)
    if uses_sharded_format(run.config):
        from largebatch.dist import all_reduce_sum

        refuse = float(all_reduce_sum(torch.tensor([float(len(bad))], device=run.backend.device))[0]) > 0
    if refuse:
        kept = list_checkpoints(run.run_dir)
        previous = f"the newest checkpoint, {kept[-1]}, is intact" if kept else "there is no earlier checkpoint"
        where = f"{len(bad)} tensor(s): {', '.join(bad[:5])}" if bad else "tensors held by another rank"
        raise UserError(
            f"refusing to save the checkpoint of step {state.step}: the model weights or optimizer state hold NaN or inf in "
            f"{where}; {previous}. The run diverged: lower the learning rate, "
            "set clip_grad_norm, or resume from an earlier checkpoint",
            path=str(run.run_dir),
        )


def _remove_stale_temporaries(folder: pathlib.Path) -> None:
    for stale in folder.glob(".*.tmp"):
        remove_checkpoint(stale)


def hook_state_keys(hooks: Sequence[CheckpointedHook]) -> list[str]:
    """Each hook's key in a checkpoint, in the order of ``hooks``: its name, and ``name#2``,
    ``name#3`` ... for the second and later hooks of one name in firing order (priority,
    then the config's order, as the engine sorts them), so two instances of one hook
    class keep their own state whatever order the list is in."""
    seen: dict[str, int] = {}
    keys = [""] * len(hooks)
    for i in sorted(range(len(hooks)), key=lambda i: hooks[i].priority):
        name = hooks[i].name
        seen[name] = seen.get(name, 0) + 1
        keys[i] = name if seen[name] == 1 else f"{name}#{seen[name]}"
    return keys


def hook_states(hooks: Sequence[CheckpointedHook]) -> dict[str, Any]:
    return {key: hook.state_dict() for key, hook in zip(hook_state_keys(hooks), hooks)}


def save_checkpoint(state: CheckpointedState, hooks: Sequence[CheckpointedHook], keep: int) -> pathlib.Path | None:
    """Save a checkpoint of the run (collective: every rank must call it).

    Returns:
        The checkpoint's path on rank 0, None on other ranks.

    Raises:
        UserError: the weights hold NaN or inf (on every rank: the check runs everywhere,
            before the collective, so no rank is left waiting).
    """
    check_finite(state)
    return prepare_checkpoint(state, hooks, keep)()


Write = Callable[[], pathlib.Path | None]


def prepare_checkpoint(
    state: CheckpointedState, hooks: Sequence[CheckpointedHook], keep: int, *, stage: Callable[[Any], Any] | None = None, group: Any = None
) -> Write:
    """Everything a save does at the step boundary; returns the writing, to run now or on
    another thread (``largebatch.checkpoint_writer``). Collective under sharding: every
    rank calls it, and every rank runs what it returns.

    Args:
        state: the run's state; the caller has run ``check_finite``.
        hooks: whose states the checkpoint holds.
        keep: how many checkpoints to keep.
        stage: copies what the writing reads (the tensors, the counters, the hooks'
            states) so that training may go on while it writes; None writes the live
            objects, so the writing must run before the next step.
        group: the process group of a sharded save's collectives (None: the default one);
            a writing on another thread needs a group of its own.

    Returns:
        The writing: it returns the checkpoint's path on rank 0, None elsewhere.
    """
    stage = stage or (lambda obj: obj)
    run = state.run
    if uses_sharded_format(run.config):
        return _prepare_sharded(state, hooks, keep, stage, group)
    if not run.is_main:
        return lambda: None
    record = _run_record(state, hooks)  # first: a hook state it refuses leaves nothing behind
    _checkpoint_folder(run.run_dir)
    path = run.run_dir.checkpoint(state.step)
    what = f"the checkpoint of step {state.step}"
    payload = stage({"format": 1, "model": run.model.state_dict(), "optimizer": run.optimizer.state_dict(), **record})

    def write() -> pathlib.Path:
        atomic_torch_save(payload, path, what)
        _publish(path, run.run_dir, keep)
        return path

    return write


def _checkpoint_folder(run_dir: RunDir) -> pathlib.Path:
    """``run_dir/checkpoints``, made durably if new, without a crash's temporaries (rank 0)."""
    folder = run_dir.checkpoints
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        fsync_dir(folder.parent)
    _remove_stale_temporaries(folder)
    return folder


def _run_record(state: CheckpointedState, hooks: Sequence[CheckpointedHook]) -> dict[str, Any]:
    """What every checkpoint holds besides the tensors of the model and optimizer: plain
    values only, the config redacted.

    Raises:
        UserError: a hook's state holds something a checkpoint does not store (named).
    """
    run = state.run
    config = redact(run.config)
    states = hook_states(hooks)
    safe_load.check_hook_states(states)
    return {
        "scaler": run.scaler.state_dict() if run.scaler else None,
        "counters": state.counters.state_dict(),
        "nan_guard": run.guard.state_dict(),
        "batch_schedule": run.batch.state_dict(),
        "last_eval_step": state.last_eval_step,
        "hooks": states,
        "world_size": run.world_size,
        "config": config,
        "config_hash": config_hash(config),
    }


def _publish(path: pathlib.Path, run_dir: RunDir, keep: int) -> None:
    """Point ``latest`` at the checkpoint just written, then drop all but the last ``keep``."""
    atomic_write_bytes(path.parent / LATEST, path.name.encode())
    for old in list_checkpoints(run_dir)[:-keep]:
        remove_checkpoint(old)


def read_checkpoint(path: pathlib.Path, *, trust: bool = False) -> dict[str, Any]:
    """The payload of one checkpoint file (or sharded checkpoint's folder), read as data
    (``weights_only=True``) unless ``trust``.

    Raises:
        UntrustedCheckpoint: it holds more than tensors and plain values (``--trust-checkpoint``).
        UserError: the file is unreadable or not a largebatch checkpoint.
    """
    if path.is_dir():
        return _read_sharded_meta(path, trust=trust)
    payload = safe_load.load_file(path, trust=trust)
    if not isinstance(payload, dict) or payload.get("format") != 1 or "model" not in payload:
        raise UserError("not a largebatch checkpoint (no format-1 payload); resume from a step-*.pt file", path=str(path))
    return payload


def _latest_pointer(run_dir: RunDir) -> str | None:
    try:
        return run_dir.latest.read_text().strip() or None
    except OSError:
        return None


def read_resume_checkpoint(
    resume: str, run_dir: RunDir | pathlib.Path, *, warn: bool = True, trust: bool = False
) -> tuple[pathlib.Path, dict[str, Any]] | None:
    """The checkpoint ``--resume`` names, read (as data unless ``trust``).

    ``auto``: the newest checkpoint in ``run_dir`` that loads (None when there is none:
    a fresh start). Unreadable ones are skipped with a one-line warning each, as is a
    ``latest`` pointer naming a missing or unreadable file; one that holds more than data
    is not skipped but refused. Anything else is a file path. Only rank 0 should ``warn``.

    Returns:
        ``(path, payload)``, or None.

    Raises:
        UntrustedCheckpoint: the checkpoint holds more than tensors and plain values.
        UserError: a named file is missing or unreadable, or no checkpoint of several loads.
    """
    if resume != "auto":
        path = pathlib.Path(resume)
        if not (path.is_file() or (path / SHARDED_META).is_file()):
            raise UserError("checkpoint not found; give a step-* file or folder, or --resume auto", path=str(path))
        return path, read_checkpoint(path, trust=trust)
    run_dir = RunDir(run_dir)
    latest = _latest_pointer(run_dir)
    candidates = list_checkpoints(run_dir)
    for path in reversed(candidates):
        try:
            payload = read_checkpoint(path, trust=trust)
        except safe_load.UntrustedCheckpoint:
            raise  # not damaged: falling back to an older one would hide it
        except UserError as exc:
            if warn:
                print(f"warning: skipping unreadable checkpoint: {exc}", flush=True)
            continue
        if warn and latest is not None and latest != path.name:
            print(
                f"warning: {CHECKPOINTS}/{LATEST} names {latest}, but the newest loadable checkpoint is {path.name}: using it",
                flush=True,
            )
        return path, payload
    if candidates:
        raise UserError(
            f"none of the {len(candidates)} checkpoint(s) loads (see the warnings above); resume from a copy, or start a new run directory",
            path=str(run_dir.checkpoints),
        )
    if warn and latest is not None:
        print(f"warning: {CHECKPOINTS}/{LATEST} names {latest}, but {run_dir} holds no checkpoint: starting afresh", flush=True)
    return None


def check_weights_fit(saved: dict[str, Any], current: dict[str, Any], path: pathlib.Path) -> None:
    """The checkpoint's weights must have this model's names and shapes.

    Raises:
        UserError: naming how many tensors are missing, extra or of another shape, and the
            first of each.
    """
    missing = [k for k in current if k not in saved]
    extra = [k for k in saved if k not in current]
    shapes = [k for k in current if k in saved and _shape(saved[k]) != _shape(current[k])]
    if not (missing or extra or shapes):
        return
    parts = []
    if shapes:
        k = shapes[0]
        parts.append(f"{len(shapes)} of another shape (first {k}: {list(_shape(saved[k]))} saved, {list(_shape(current[k]))} here)")
    if missing:
        parts.append(f"{len(missing)} missing (first {missing[0]})")
    if extra:
        parts.append(f"{len(extra)} not in this model (first {extra[0]})")
    raise UserError(
        f"the checkpoint's weights do not fit this model: {'; '.join(parts)}; resume with the model config it was made with",
        path=str(path),
    )


def check_same_config(saved: dict[str, Any], config: dict[str, Any], path: pathlib.Path) -> None:
    """Refuse a resume whose config changes the maths.

    Raises:
        UserError: the configs differ in keys outside ``RESUME_FREE_KEYS`` (listed).
    """
    diffs = set(config_differences(saved, config))
    if diffs:
        shown = ", ".join([change for change in config_changes(saved, config) if change.split(" ")[0] in diffs][:8])
        raise UserError(
            f"the checkpoint was made with a different config: {shown}; resume with the same config, "
            "or pass --resume-ignore-config to accept the new values",
            path=str(path),
        )


def load_checkpoint(
    path: pathlib.Path,
    state: CheckpointedState,
    hooks: Sequence[CheckpointedHook],
    train_loader: Stateful,
    *,
    ignore_config: bool = False,
    payload: dict[str, Any] | None = None,
    trust: bool = False,
) -> None:
    """Restore a run from ``path`` (or its already read ``payload``) into ``state``, the
    hooks and the loader; read as data unless ``trust``.

    Raises:
        UserError: the file is unreadable or holds more than data, or its config differs
            from this run's in keys that change the maths (listed) and ``ignore_config`` is false.
    """
    if payload is None:
        payload = read_checkpoint(path, trust=trust)
    run = state.run
    _load_training_tensors(path, payload, run, check_resumable(path, payload, state, ignore_config=ignore_config), trust=trust)
    counters = dict(payload["counters"])
    # a checkpoint from before the position was kept in samples: its steps were full global batches
    counters.setdefault("samples_in_epoch", counters["step_in_epoch"] * run.plan.global_batch_size)
    state.restore(counters, payload.get("last_eval_step"))
    run.guard.load_state_dict(payload["nan_guard"])
    run.batch.load_state_dict(payload.get("batch_schedule", {}))
    for key, hook in zip(hook_state_keys(hooks), hooks):
        if key in payload["hooks"]:
            hook.load_state_dict(payload["hooks"][key])
    # The position within the epoch is kept in samples: checkpoints are taken at
    # optimizer-step boundaries, and the samples of each step do not depend on the world
    # size (``largebatch.data.sharding``), so this also holds after a change of world size,
    # and whatever the batch schedule made of the steps before.
    unit = run.plan.micro_batch_size * run.world_size
    train_loader.load_state_dict({"epoch": state.epoch, "micro_batch": state.samples_in_epoch // unit})


def _load_training_tensors(path: pathlib.Path, payload: dict[str, Any], run: CheckpointedRun, sharded_file: bool, *, trust: bool) -> None:
    """The model's weights, the optimizer's state and the grad scaler's from a checkpoint
    already checked by ``check_resumable``."""
    try:
        if sharded_file:
            load_sharded_tensors(path, run, trust=trust)
        else:
            run.model.load_state_dict(payload["model"])
            run.optimizer.load_state_dict(payload["optimizer"])
    except (ValueError, KeyError, RuntimeError) as exc:
        raise UserError(
            f"the optimizer state does not fit this run's parameter groups ({type(exc).__name__}: {exc}); resume with the "
            "same optimizer settings (no_weight_decay, exclude_1d, layer_decay)",
            path=str(path),
        ) from exc
    if run.scaler and payload["scaler"]:
        run.scaler.load_state_dict(payload["scaler"])


def load_branch_start(path: pathlib.Path, state: CheckpointedState, *, trust: bool = False) -> int:
    """Start a new run from another run's checkpoint (``--branch-from``): its model
    weights, optimizer state and grad scaler, nothing else. The counters stay at zero, so
    the new run's schedule, data order (from its own seed) and hooks start afresh, and
    its config may change anything that keeps the weights' shapes and the optimizer type:
    the global batch, the learning rate and its schedule, the seed, the length.

    Returns:
        The checkpoint's step.

    Raises:
        UserError: no checkpoint at ``path``, or one that does not fit this run (its
            format, weights or optimizer; named as for a resume).
    """
    if not (path.is_file() or (path / SHARDED_META).is_file()):
        raise UserError("--branch-from: checkpoint not found; give a step-* file (or a sharded checkpoint's folder)", path=str(path))
    payload = read_checkpoint(path, trust=trust)
    _load_training_tensors(path, payload, state.run, check_resumable(path, payload, state, ignore_config=True), trust=trust)
    return int(payload["counters"]["step"])


def check_resumable(path: pathlib.Path, payload: dict[str, Any], state: CheckpointedState, *, ignore_config: bool = False) -> bool:
    """Whether the checkpoint's ``payload`` can resume this run: its config (unless
    ``ignore_config``), its format (sharded or not), its weights' shapes and its
    optimizer. Returns whether it is a sharded checkpoint.

    Raises:
        UserError: naming what does not fit and how to resume.
    """
    missing = [key for key in RESUME_KEYS if key not in payload]
    if missing:
        raise UserError(
            f"the checkpoint has no {', '.join(missing)}, which every checkpoint of this largebatch holds and a resume "
            "reads; resume from a checkpoint this version wrote, or start a new run from its weights (model.init_from)",
            path=str(path),
        )
    config = state.run.config
    if not ignore_config:  # both redacted: the checkpoint's is, and an older one's is compared as it
        check_same_config(redact(payload["config"]), redact(config), path)
    sharded_file = payload.get("sharded", False)
    if sharded_file != uses_sharded_format(config):
        made = "a sharded (fsdp/hsdp)" if sharded_file else "a ddp"
        raise UserError(
            f"this is {made} checkpoint and this run uses dist.strategy {config.dist.strategy!r}: the two "
            "formats do not convert; resume with the strategy it was made with",
            path=str(path),
        )
    current = {k: v.shape for k, v in state.run.model.state_dict().items()}
    check_weights_fit(payload["model"], current, path)
    saved_type = payload["config"].get("optimizer", {}).get("type")  # the saved dict: an old checkpoint's may lack keys
    if saved_type != config.optimizer.type:
        raise UserError(
            f"the checkpoint holds {saved_type}'s state, this run builds {config.optimizer.type}: an optimizer's "
            "state cannot carry over to another; resume with the same optimizer.type, or start a new run from the weights",
            path=str(path),
        )
    return sharded_file


def save_weights(model: torch.nn.Module, path: pathlib.Path) -> None:
    """Write the model's weights as safetensors, atomically."""
    save_tensors(model.state_dict(), path)


def save_final_weights(model: torch.nn.Module, path: pathlib.Path, *, is_main: bool) -> None:
    """Rank 0 writes the whole model's weights (collective: every rank must call it).

    Sharded (FSDP2) weights are gathered first, to the CPU of rank 0 only, so the file
    is the same full state dict an unsharded run writes.
    """
    from largebatch.dtensors import is_sharded

    if any(is_sharded(p) for p in model.parameters()):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if is_main:
            save_tensors(cast(dict[str, torch.Tensor], full), path)  # a model's full state dict: tensors only
        return
    if is_main:
        save_weights(model, path)


def save_tensors(state: dict[str, torch.Tensor], path: pathlib.Path) -> None:
    """Write a state dict as safetensors, atomically."""
    from safetensors.torch import save

    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    atomic_write_bytes(path, save(tensors, metadata={"format": "pt"}))


def _shape(value: Any) -> tuple[int, ...]:
    return tuple(value.shape if hasattr(value, "shape") else value)


# --------------------------------------------------------------------------- sharded (DCP)


def uses_sharded_format(cfg: Config) -> bool:
    """Whether the run writes sharded checkpoints (``dist.strategy`` fsdp or hsdp)."""
    return cfg.dist.strategy != "ddp"


def _prepare_sharded(
    state: CheckpointedState, hooks: Sequence[CheckpointedHook], keep: int, stage: Callable[[Any], Any], group: Any
) -> Write:
    """A sharded checkpoint: ``step-<N>/`` holding each rank's slices of the model and
    optimizer state (``torch.distributed.checkpoint``, which can load them at another
    world size) and ``meta.pt`` with everything else (collective: every rank calls it,
    and every rank runs the writing it returns).

    Atomic as the file format: every rank writes its slices into ``.step-<N>.tmp/``
    (fsync'ed by DCP), rank 0 adds ``meta.pt`` last, then renames the folder to its
    final name and fsyncs the parent; a crash before the rename leaves a temporary
    folder that is never read and is removed by the next save. The writing ends with a
    barrier, so on every rank it returns once the checkpoint has its name.
    """
    import torch.distributed as torch_dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from largebatch.dist import barrier

    run = state.run
    final = run.run_dir.checkpoint(state.step, sharded=True)
    folder = final.parent
    tmp = folder / f".{final.name}.tmp"
    record = _agreed_run_record(state, hooks)  # before any file: a refused hook state leaves none
    if run.is_main:
        _checkpoint_folder(run.run_dir)
        tmp.mkdir()
    barrier()
    model_state, optimizer_state = get_state_dict(run.model, run.optimizer)
    tensors = stage({"model": model_state, "optimizer": optimizer_state})
    meta = stage({"format": 2, "sharded": True, **record}) if run.is_main else None
    what = f"the checkpoint of step {state.step}"

    def write() -> pathlib.Path | None:
        dcp.save(tensors, checkpoint_id=str(tmp), process_group=group)
        if meta is not None:
            atomic_torch_save(meta, tmp / SHARDED_META, what)
            if final.exists():
                remove_checkpoint(final)
            os.replace(tmp, final)
            fsync_dir(folder)
            _publish(final, run.run_dir, keep)
        if torch_dist.is_initialized():
            torch_dist.barrier(group=group)
        return final if meta is not None else None

    return write


def _agreed_run_record(state: CheckpointedState, hooks: Sequence[CheckpointedHook]) -> dict[str, Any]:
    """Rank 0's ``_run_record`` (empty elsewhere), refused on every rank when rank 0
    refuses it, so that no rank is left waiting in the collective save.

    Raises:
        UserError: rank 0's reason on rank 0, a pointer to it elsewhere.
    """
    from largebatch.dist import any_rank

    run = state.run
    record: dict[str, Any] = {}
    refused: UserError | None = None
    if run.is_main:
        try:
            record = _run_record(state, hooks)
        except UserError as exc:
            refused = exc
    if any_rank(refused is not None, run.backend.device):
        raise refused or UserError(f"rank 0 refused to save the checkpoint of step {state.step} (its error says why)")
    return record


def _read_sharded_meta(path: pathlib.Path, *, trust: bool = False) -> dict[str, Any]:
    """A sharded checkpoint's ``meta.pt``, with the saved tensors' shapes under ``model``
    (both read as data unless ``trust``)."""
    meta = safe_load.load_file(path / SHARDED_META, trust=trust)
    metadata = _dcp_metadata(path, trust=trust)
    if not isinstance(meta, dict) or meta.get("format") != 2:
        raise UserError("not a largebatch sharded checkpoint (no format-2 meta.pt); resume from a step-* folder", path=str(path))
    shapes = {
        key.removeprefix("model."): tuple(entry.size)
        for key, entry in metadata.state_dict_metadata.items()
        if key.startswith("model.") and hasattr(entry, "size")
    }
    return {**meta, "model": shapes}


def _dcp_metadata(path: pathlib.Path, *, trust: bool = False) -> Any:
    """DCP's metadata of a sharded checkpoint's folder, read as data unless ``trust``.

    Raises:
        UntrustedCheckpoint: it names classes outside ``safe_load.DCP_METADATA_GLOBALS``.
        UserError: it cannot be read.
    """
    try:
        return safe_load.storage_reader(path, trust=trust).read_metadata()
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - any unreadable folder is reported the same way
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        raise UserError(f"cannot read checkpoint ({type(exc).__name__}: {first}); resume from an earlier one", path=str(path)) from exc


def load_sharded_tensors(path: pathlib.Path, run: CheckpointedRun, *, trust: bool = False) -> None:
    """Load a sharded checkpoint's model and optimizer state into this run's model,
    sharded or not, at any world size (DCP reads the slices each rank needs), as data
    unless ``trust``."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optimizer_state = get_state_dict(run.model, run.optimizer)
    loaded: dict[str, Any] = {"model": model_state, "optimizer": optimizer_state}
    safe_load.load_dcp(loaded, path, trust=trust)
    set_state_dict(run.model, run.optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"])


# --------------------------------------------------------------------------- model weights for init_from


def read_model_weights(path: pathlib.Path, *, trust: bool = False) -> pathlib.Path | dict[str, torch.Tensor] | None:
    """A model's weights from what ``model.init_from`` may name: the ``.safetensors`` file
    of a run directory or export folder (or the file itself), returned as its path; the
    model's tensors of a checkpoint file or of a sharded checkpoint's folder (gathered
    without a process group); None when ``path`` holds none of these.

    Checkpoints are read as data unless ``trust``.

    Raises:
        UserError: a checkpoint that cannot be read, or holds more than data.
    """
    if path.is_dir() and RunDir(path).finished:
        return RunDir(path).weights()
    if path.is_file() and path.suffix == ".safetensors":
        return path
    if path.is_dir() and (path / ".metadata").is_file():
        return _sharded_model_state(path, trust=trust)
    if path.is_file():
        return read_checkpoint(path, trust=trust)["model"]
    return None


def _sharded_model_state(folder: pathlib.Path, *, trust: bool = False) -> dict[str, torch.Tensor]:
    """The full model weights of a sharded (DCP) checkpoint, read without a process group:
    the metadata names each weight's full shape and dtype, DCP fills tensors of those."""
    metadata = _dcp_metadata(folder, trust=trust)
    model = {
        key.removeprefix("model."): torch.empty(tuple(entry.size), dtype=entry.properties.dtype)
        for key, entry in metadata.state_dict_metadata.items()
        if key.startswith("model.") and hasattr(entry, "size")
    }
    safe_load.load_dcp({"model": model}, folder, trust=trust, no_dist=True)
    return model
