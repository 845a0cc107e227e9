"""Build a run from a config and train it: the body of ``train.py`` / ``largebatch train``.

Order matters: everything that can be checked without the device or the data is
checked first (the config, the model name), so a mistake costs seconds, not a queue slot.
"""

from __future__ import annotations

import pathlib
import random

import numpy as np
import torch

from largebatch import checkpoint as ckpt
from largebatch import data as data_mod
from largebatch import preemption
from largebatch.backends import create_backend
from largebatch.backends.base import Backend
from largebatch.config import Config, Derived, derive, dump_yaml
from largebatch.config.redact import config_record
from largebatch.data.base import Loader
from largebatch.data.mixup import MixupCutmix
from largebatch.dist import DistInfo, barrier, broadcast_object, destroy_process_group, discover
from largebatch.engine.engine import Engine
from largebatch.engine.hook import Hook
from largebatch.engine.state import Run, TrainState
from largebatch.export import check_timm, write_run_hub_config
from largebatch.hooks import build_hooks
from largebatch.hooks.eval import EvalHook
from largebatch.models import build_model
from largebatch.optim import build_optimizer
from largebatch.optim.schedules import build_schedule
from largebatch.randomness import RandomStreams
from largebatch.rundir import RunDir
from largebatch.start import StartPlan, TrainArgs, plan_start
from largebatch.tasks import build_task


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def batch_schedule_note(derived: Derived) -> str:
    """What the launch line adds for a batch that changes along the run (empty when fixed)."""
    schedule = derived.batch_schedule
    if schedule.fixed:
        return ""
    batches = " -> ".join(str(b) for b in schedule.batches)
    bound = ", steps at most" if schedule.type == "adaptive" else ""
    return f" ({schedule.type} batch {batches}, lr rule {schedule.lr_rule}{bound})"


def build_run(args: TrainArgs) -> tuple[Engine, list[Hook]]:
    """Everything a run needs, resumed if asked; returns the engine and its hooks.

    Where the run starts (its folder, config and checkpoint) is decided first, once
    (``largebatch.start.plan_start``); the run directory is made only once the run has
    been accepted, so a refused command leaves none behind.
    """
    check_timm()  # a run must not train for hours and then fail to write its config.json
    info = discover()
    plan = plan_start(args, is_main=info.is_main)
    if info.is_main:
        for line in plan.messages():
            print(line, flush=True)
    cfg = plan.config
    hooks = build_hooks(cfg.hooks, checkpoint=cfg.checkpoint, log=cfg.log, ema=cfg.ema, config_path=plan.config_file)
    task = build_task(cfg.task, plan.config_file)
    backend = create_backend(cfg.device, cfg.precision, info.local_rank, cuda=cfg.cuda, hpu=cfg.hpu)
    dist_backend = backend.dist_backend if cfg.dist.backend == "auto" else cfg.dist.backend
    backend.init_process_group(info, dist_backend, cfg.dist.timeout_minutes)

    derived = derive(cfg, info.world_size, data_mod.count_samples(cfg.data, "train"))
    run_dir = RunDir(broadcast_object(str(plan.run_dir)))
    model, train_model, optimizer = build_training_model(cfg, derived, info, backend, trust_checkpoint=args.trust_checkpoint)
    train_loader, eval_loader = build_loaders(cfg, derived, hooks, info, backend.device)
    run = Run(
        config=cfg,
        derived=derived,
        dist=info,
        backend=backend,
        model=model,
        train_model=train_model,
        optimizer=optimizer,
        schedule=build_schedule(cfg.lr_schedule, derived),
        scaler=backend.make_grad_scaler(),
        mixup=build_mixup(cfg, info.rank),
        task=task,
        run_dir=run_dir,
        random=RandomStreams(cfg.seed, info.rank, backend),
    )
    state = TrainState(run)
    if plan.checkpoint is not None:
        resume(plan, args, state, hooks, train_loader)
    if args.branch_from and state.step == 0:  # a branch resumed from its own checkpoint goes on from there
        branch_from(args.branch_from, state, trust=args.trust_checkpoint)
    # Only once a resume has been accepted (a refused one leaves the run's config as it
    # was), and not for a finished run that has nothing to do.
    if info.is_main and not finished(state):
        run_dir.path.mkdir(parents=True, exist_ok=True)
        run_dir.config.write_text(dump_yaml(config_record(cfg, derived)))
    barrier()  # every rank's hooks may write into the folder from the first event on
    return Engine(state, hooks, train_loader, eval_loader, finish=write_final_outputs), hooks


def build_training_model(
    cfg: Config, derived: Derived, info: DistInfo, backend: Backend, *, trust_checkpoint: bool = False
) -> tuple[torch.nn.Module, torch.nn.Module, torch.optim.Optimizer]:
    """``(model, train_model, optimizer)``: the model with the same initial weights on
    every rank, sharded or wrapped for the run, compiled if asked, and its optimizer;
    each rank's own randomness is seeded on the way out. A checkpoint ``model.init_from``
    names is read as data unless ``trust_checkpoint``."""
    seed_everything(cfg.seed)  # the same initial weights on every rank
    model = build_model(cfg.model, cfg.data, initial_weights=True, trust_checkpoint=trust_checkpoint)
    if derived.sharded:
        # Sharded on the host: FSDP2 moves each block's slices to the device as it
        # shards it, so the whole model never sits in one device's memory.
        train_model = model = backend.shard_model(model, derived)  # in place: parameters become DTensors
    else:
        model = backend.prepare_model(model)
        train_model = backend.wrap_ddp(model, cfg.dist) if info.distributed else model
    seed_everything(cfg.seed + info.rank)  # then each rank its own randomness
    backend.seed(cfg.seed + info.rank)
    train_model = backend.compile(train_model, cfg.compile)
    optimizer = build_optimizer(cfg.optimizer, model, fused_lamb=backend.fused_lamb())  # after sharding: it holds the sharded parameters
    return model, train_model, optimizer


def build_mixup(cfg: Config, rank: int) -> MixupCutmix:
    """Mixup/CutMix as the ``mixup`` section says, seeded per rank."""
    mix = cfg.mixup
    return MixupCutmix(
        cfg.data.num_classes,
        mix.mixup_alpha,
        mix.cutmix_alpha,
        mix.prob,
        mix.switch_prob,
        mix.label_smoothing,
        seed=cfg.seed * 7919 + rank,
    )


def build_loaders(cfg: Config, derived: Derived, hooks: list[Hook], info: DistInfo, device: torch.device) -> tuple[Loader, Loader | None]:
    """The training loader, and the evaluation loader when anything evaluates and the
    evaluation split has samples (else None)."""
    train_loader = data_mod.build_train_loader(cfg.data, derived.plan, rank=info.rank, seed=cfg.seed, device=device)
    wants_eval = cfg.eval.interval_epochs or cfg.eval.at_end or any(isinstance(h, EvalHook) for h in hooks)
    if not wants_eval or data_mod.count_samples(cfg.data, "eval") == 0:
        return train_loader, None
    eval_loader = data_mod.build_eval_loader(
        cfg.data,
        batch_size=cfg.eval.batch_size or cfg.micro_batch_size,
        rank=info.rank,
        world_size=info.world_size,
        device=device,
        cache=cfg.eval.cache,
    )
    return train_loader, eval_loader


def resume(plan: StartPlan, args: TrainArgs, state: TrainState, hooks: list[Hook], train_loader: Loader) -> None:
    """Load the plan's checkpoint (read already) into ``state``, the hooks and the loader.

    Raises:
        UserError: the checkpoint does not fit this run (``largebatch.checkpoint.check_resumable``).
    """
    assert plan.checkpoint is not None
    run = state.run
    ckpt.load_checkpoint(
        plan.checkpoint,
        state,
        hooks,
        train_loader,
        ignore_config=args.resume_ignore_config,
        payload=plan.payload,
        trust=args.trust_checkpoint,
    )
    if run.is_main and state.step < run.total_steps:  # a finished run says so instead (train)
        print(
            f"resumed from {plan.checkpoint} at step {state.step}/{run.total_steps}, epoch {state.epoch + 1}/{run.config.epochs}",
            flush=True,
        )


def branch_from(path: str, state: TrainState, *, trust: bool = False) -> None:
    """Start this run from another run's checkpoint (``--branch-from``): weights, optimizer
    and grad scaler state, with this run's own config and counters from zero
    (``largebatch.checkpoint.load_branch_start``). A short run at another global batch or
    learning rate from a point of a longer one: the critical-batch study's branches.

    Raises:
        UserError: the checkpoint is missing or does not fit this run.
    """
    step = ckpt.load_branch_start(pathlib.Path(path), state, trust=trust)
    if state.run.is_main:
        print(f"largebatch: branching from {path} (its step {step}): weights and optimizer state; counters from 0", flush=True)


def how_to_train_on(state: TrainState) -> str:
    """What to run to train a finished run further: more ``max_steps`` when they stopped it,
    else more epochs (a longer schedule: accepted with ``--resume-ignore-config``)."""
    run, cmd = state.run, f"largebatch train --run-dir {state.run.run_dir} --resume auto"
    if state.epoch < run.config.epochs:  # max_steps stopped it before its schedule's end
        return f"to train on, raise max_steps: `{cmd} --set max_steps={min(run.derived.batch_steps, 2 * state.step)}`"
    epochs = run.config.epochs
    return f"it trained all {epochs} epochs; to train on with a longer schedule: `{cmd} --set epochs={2 * epochs} --resume-ignore-config`"


def finished(state: TrainState) -> bool:
    """A resumed run that has taken all its steps and written its final weights."""
    return state.step >= state.run.total_steps and state.run.run_dir.finished


def write_final_outputs(state: TrainState) -> None:
    """The finished run's ``model.safetensors``, ``model_<name>.safetensors`` for each of
    ``state.extra_models`` (the EMA), and ``config.json`` (rank 0 writes; every
    rank calls: sharded weights are gathered). The engine calls this between
    ``after_train`` and ``after_run`` of a run that was not interrupted."""
    run = state.run
    ckpt.save_final_weights(run.model, run.run_dir.weights(), is_main=run.is_main)
    for name, model in state.extra_models.items():  # model_ema.safetensors, ...
        ckpt.save_final_weights(model, run.run_dir.weights(name), is_main=run.is_main)
    if run.is_main:
        write_run_hub_config(run.config, run.run_dir)


def train(args: TrainArgs) -> TrainState:
    """Train as ``args`` say; rank 0 writes ``model.safetensors`` at the end.

    A run stopped by a preemption signal (``state.interrupted``) writes a checkpoint
    instead, and with ``slurm.requeue`` rank 0 requeues the Slurm job once every rank is
    done; the caller exits with ``largebatch.preemption.EXIT_REQUEUE``.
    """
    engine = None
    try:
        engine, _ = build_run(args)
        state, run = engine.state, engine.state.run
        if finished(state):
            if run.is_main:
                print(f"largebatch: {run.run_dir} already finished at step {state.step}; {how_to_train_on(state)}", flush=True)
            return state
        if run.is_main:
            d = run.derived
            print(
                f"largebatch: {run.backend.describe()}, world size {d.world_size}, global batch "
                f"{d.plan.global_batch_size} = {d.plan.micro_batch_size} x {d.accumulation} accumulation x "
                f"{d.world_size}, {run.total_steps} steps{batch_schedule_note(d)}; run directory {run.run_dir}",
                flush=True,
            )
        engine.run()
        if run.is_main and state.should_stop and not state.interrupted:
            print(f"largebatch: stopped at step {state.step}: {state.stop_reason}", flush=True)
        barrier()
        if state.interrupted and run.is_main:
            print(
                f"largebatch: {state.stop_reason} at step {state.step}; checkpoint written, exiting with status "
                f"{preemption.EXIT_REQUEUE} (requeue)",
                flush=True,
            )
            if run.config.slurm.requeue:
                preemption.requeue_slurm_job()
        return state
    finally:
        if engine is not None:
            engine.close()
        destroy_process_group()
