"""Where a run starts, decided once from its command line: ``plan_start``.

A run starts fresh from ``--config``, or (``--resume``) continues a run from one of its
checkpoints with the config that run was started with. Everything that choice depends on
is read here, once, before a device, a process group or a file of the run is touched, and
kept in one frozen ``StartPlan`` that ``largebatch.launch.build_run`` builds the run from:

* the run directory: ``--run-dir``; for ``--resume PATH``, the run that holds the
  checkpoint; otherwise ``default_run_dir``. A new run refuses a folder that holds a run's
  files (``check_run_dir``);
* the config: ``--config`` for a new run. A resumed run keeps its saved ``config.yaml``
  (``--set`` values included), read as data (``largebatch.config.resolve_saved_config``:
  a run directory may come from anyone, so nothing in it is run or followed), with this
  command's ``--set`` applied on top, and the credentials it holds redacted given back
  from ``--config`` (``largebatch.config.redact``). The config file is resolved at most
  twice: the saved one, and ``--config`` when given;
* the config file beside which hook and task files named by a relative path are looked up
  (with the working directory): the ``--config`` the user named, never the run directory;
* the checkpoint, read (as data unless ``--trust-checkpoint``): ``--resume PATH``, or for
  ``--resume auto`` the newest that loads (none: a fresh start);
* what to tell the user once (rank 0): the keys ``--set`` changed, and where ``--config``
  differs from the saved config whose values are kept.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import pathlib
from typing import Any

from largebatch import checkpoint as ckpt
from largebatch.config import Config, resolve_config, resolve_saved_config, restore_secrets
from largebatch.config.redact import REDACTED, redact, unresolved
from largebatch.errors import UserError
from largebatch.rundir import CHECKPOINTS, CONFIG, METRICS, WEIGHTS, RunDir


@dataclasses.dataclass
class TrainArgs:
    """The command line of ``train.py``; ``config`` may be None when resuming (the run's
    saved ``config.yaml`` is the config then)."""

    config: str | None
    overrides: list[str] = dataclasses.field(default_factory=list)
    run_dir: str | None = None
    resume: str | None = None
    resume_ignore_config: bool = False
    trust_checkpoint: bool = False
    branch_from: str | None = None


# What a run writes into its folder that a new run would overwrite or mix with its own.
RUN_FILES = (CONFIG, METRICS, WEIGHTS, CHECKPOINTS)


@dataclasses.dataclass(frozen=True)
class StartPlan:
    """How one run starts (``plan_start``).

    Attributes:
        run_dir: the folder the run writes; made once the run has been accepted.
        config: the config it trains with.
        config_file: the config file the user named, beside which hook and task files are
            looked up (None: the working directory only).
        saved_config: the run directory's ``config.yaml`` the config was read from (None:
            ``--config``, for a new run).
        resumed_from: the run whose saved config is continued (None for a new run).
        checkpoint: the checkpoint to continue from (None: a fresh start).
        payload: that checkpoint, read.
        changed: ``key (old -> new)``, redacted, for each key ``--set`` changed on the saved config.
        ignored: ``key (saved -> --config's)``, redacted, where ``--config`` differs from the
            saved config, whose values are kept.
        restored: the keys whose redacted saved values were taken from ``--config``.
    """

    run_dir: RunDir
    config: Config
    config_file: pathlib.Path | None
    saved_config: pathlib.Path | None = None
    resumed_from: RunDir | None = None
    checkpoint: pathlib.Path | None = None
    payload: dict[str, Any] | None = dataclasses.field(default=None, repr=False, compare=False)
    changed: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    restored: tuple[str, ...] = ()

    def messages(self) -> list[str]:
        """The lines rank 0 prints about a resumed run's config (none for a new run)."""
        if self.saved_config is None:
            return []
        note = f"; --set changed {', '.join(self.changed)}" if self.changed else ""
        if self.restored:
            note += f"; the redacted {', '.join(self.restored)} taken from --config {self.config_file}"
        lines = [f"largebatch: resuming {self.resumed_from} with its saved config {self.saved_config}{note}"]
        if self.ignored:
            shown = ", ".join(self.ignored[:4]) + (f" and {len(self.ignored) - 4} more" if len(self.ignored) > 4 else "")
            lines.append(
                f"largebatch: --config {self.config_file} differs from the saved config in {shown}; the saved values are kept "
                "(change one with --set KEY=VALUE)"
            )
        return lines


def plan_start(args: TrainArgs, *, is_main: bool) -> StartPlan:
    """The ``StartPlan`` of a ``train`` command line; only rank 0 (``is_main``) warns
    about skipped checkpoints.

    Raises:
        UserError: no ``--config`` and no run to resume; a run directory that cannot hold
            the run (``check_run_dir``); a config that does not resolve, still holds a
            redacted value, or (saved) names a ``_base_``; a checkpoint that is missing,
            unreadable or holds more than data.
    """
    if args.config is None and not args.resume:
        raise UserError(
            "--config CONFIG is required to start a run (only --resume, which continues a run with its saved config, goes without)"
        )
    source = _run_to_continue(args) if args.resume else None
    saved = source.config if source is not None and source.config.is_file() and ckpt.list_checkpoints(source) else None
    if saved is None and args.config is None:
        where = f" in {source}" if source is not None else ""
        raise UserError(
            f"no run to resume{where} (no checkpoint with its config.yaml); give --config CONFIG to start one",
            path=args.resume if args.resume != "auto" else None,
        )
    if args.run_dir:
        run_dir = pathlib.Path(args.run_dir)
    elif source is not None:
        run_dir = source.path
    else:
        assert args.config is not None  # checked above: no saved config without one
        run_dir = default_run_dir(args.config, args.resume)
    check_run_dir(run_dir, resuming=bool(args.resume))

    if saved is None:
        assert args.config is not None
        plan = StartPlan(
            RunDir(run_dir), refuse_redacted(resolve_config(args.config, args.overrides), args.config), pathlib.Path(args.config)
        )
    else:
        plan = _continue_saved(args, RunDir(run_dir), source, saved)
    if not args.resume:
        return plan
    found = ckpt.read_resume_checkpoint(args.resume, run_dir, warn=is_main, trust=args.trust_checkpoint)
    return dataclasses.replace(plan, checkpoint=found[0], payload=found[1]) if found is not None else plan


def _continue_saved(args: TrainArgs, run_dir: RunDir, source: RunDir | None, saved: pathlib.Path) -> StartPlan:
    """The plan of a run continued with its saved ``config.yaml`` (read as data)."""
    before, config = resolve_saved_config(saved, args.overrides, trust=args.trust_checkpoint)
    given = pathlib.Path(args.config) if args.config is not None else None
    if given is not None and given.resolve() == saved.resolve():
        given = None  # the saved file itself: read as data above, not as a file of the user's
    named = resolve_config(given, args.overrides) if given is not None else None
    missing = unresolved(config)
    if named is not None and missing:
        config = restore_secrets(config, named)
    refuse_redacted(config, str(saved))
    shown = redact(config)
    return StartPlan(
        run_dir,
        config,
        # --trust-checkpoint trusts the run directory: its files are looked up as before
        given if given is not None or not args.trust_checkpoint else saved,
        saved_config=saved,
        resumed_from=source,
        changed=tuple(ckpt.config_changes(redact(before), shown)),
        ignored=tuple(ckpt.config_changes(shown, redact(named))) if named is not None else (),
        restored=tuple(missing) if named is not None else (),
    )


def _run_to_continue(args: TrainArgs) -> RunDir | None:
    """The run ``--resume`` continues: for a checkpoint path, the run that holds it; for
    ``auto``, ``--run-dir``, or without it the newest run of ``--config``'s name
    (``default_run_dir``). None when there is none yet (a fresh start).

    Raises:
        UserError: ``--resume auto`` with neither ``--run-dir`` nor ``--config``.
    """
    if args.resume != "auto":
        path = pathlib.Path(str(args.resume))
        return RunDir(path.parent.parent) if path.parent.name == CHECKPOINTS else None
    if args.run_dir:
        return RunDir(args.run_dir)
    if args.config is None:
        raise UserError("--resume auto needs the run to continue: give --run-dir RUN (or --config, for the newest run of that config)")
    found = default_run_dir(args.config, "auto")
    return RunDir(found) if ckpt.list_checkpoints(found) else None


def default_run_dir(config_path: str, resume: str | None, env: dict[str, str] | None = None) -> pathlib.Path:
    """The run directory when ``--run-dir`` is not given.

    A name that survives restarts, so ``--resume auto`` finds the run again:
    ``runs/<config name>-job<SLURM_JOB_ID>`` inside a Slurm job (a requeued job keeps its
    id), ``runs/<config name>-<rdzv id>`` under torchrun with ``--rdzv-id`` or
    ``--standalone`` (the same for all restarts of one torchrun). Otherwise
    ``runs/<config name>-<timestamp>``, or with ``--resume auto`` the newest existing one.
    """
    env = dict(os.environ if env is None else env)
    stem = pathlib.Path(config_path).stem
    if env.get("SLURM_JOB_ID"):
        return pathlib.Path("runs") / f"{stem}-job{env['SLURM_JOB_ID']}"
    run_id = env.get("TORCHELASTIC_RUN_ID", "none")
    if run_id != "none":
        return pathlib.Path("runs") / f"{stem}-{run_id}"
    if resume == "auto":
        existing = sorted(p for p in pathlib.Path("runs").glob(f"{stem}-*") if ckpt.list_checkpoints(p))
        if existing:
            return existing[-1]
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return pathlib.Path("runs") / f"{stem}-{stamp}"


def refuse_redacted(cfg: Config, path: str) -> Config:
    """``cfg``, unless a value in it was redacted (a run's ``config.yaml`` given as the
    config, or resumed without the file holding the credential): the run would use the
    placeholder instead of the credential.

    Raises:
        UserError: naming the keys and where to give the values.
    """
    missing = unresolved(cfg)
    if missing:
        raise UserError(
            f"{', '.join(missing[:3])}: {REDACTED!r}, as written to the run directory, which keeps credentials out; give the "
            "real values again with --config (the file that holds them) or --set, or pass credentials through the environment "
            "(MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD, WANDB_API_KEY) instead of the config",
            path=path,
        )
    return cfg


def check_run_dir(run_dir: pathlib.Path, *, resuming: bool) -> None:
    """A run directory that cannot hold the run is the user's mistake, caught before any work.

    Raises:
        UserError: the path, or one of its parents, is a file; the nearest existing
            folder is not writable; or, without ``--resume``, the folder holds a run's
            files (``RUN_FILES``), which a new run would overwrite.
    """
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError("--run-dir names a file, not a folder; give a new or existing folder", path=str(run_dir))
    parent = run_dir
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"--run-dir {str(run_dir)!r} would be made inside a file; choose a path under a folder", path=str(parent))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"--run-dir {str(run_dir)!r}: no permission to write in this folder", path=str(parent))
    if resuming or not run_dir.is_dir():
        return
    checkpoints = ckpt.list_checkpoints(run_dir)
    if checkpoints:
        raise UserError(
            f"--run-dir already holds a run's checkpoints (newest {checkpoints[-1].name}); continue it with "
            f"`largebatch train --run-dir {run_dir} --resume auto`, or choose another --run-dir",
            path=str(run_dir),
        )
    held = [name for name in RUN_FILES if (run_dir / name).exists()]
    if held:
        raise UserError(
            f"--run-dir already holds a run's files ({', '.join(held)}) and no checkpoint to continue it from; a new run would "
            "overwrite them: choose another --run-dir, or move those files away",
            path=str(run_dir),
        )
