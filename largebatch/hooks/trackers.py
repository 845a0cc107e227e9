"""Experiment trackers as hooks: MLflow (``'mlflow'``) and Weights & Biases (``'wandb'``), on rank 0.

Both log the same things:

* at the start, the run's config, flattened to dotted keys (``optimizer.lr``), with the
  derived batch arithmetic (``derived.accumulation``, ...);
* every numeric value of ``metrics.jsonl`` at its optimizer step: each logging step's
  record (``loss``, ``lr``, ``train/top1``, ``grad_norm``, ...) and each evaluation's
  (``eval/top1``, ...); text values are skipped;
* at the end, as artifacts: ``config.yaml`` and ``metrics.jsonl``, the ``largebatch plot``
  figures (``plots=True``, needs matplotlib) and, for a finished run, the final weights
  ``model.safetensors`` with timm's ``config.json`` (``largebatch.export``) and any extra
  model's (``model_ema.safetensors`` with ``ema.decay``);
* the tracker run's status: finished, failed (an exception) or, for a run stopped by a
  preemption signal, killed (MLflow) / preempting (W&B).

Credentials never reach a tracker: the parameters, tags and W&B's record of the command
line are redacted as ``config.yaml`` is (``largebatch.config.redact``: user-info, query
parameters and ``NAME=value`` pairs named like credentials in any text, every text under a
key named like one: ``token``, ``api_key``, ``HFToken``, ...), and so are the hook's
messages and error lines (a ``tracking_uri``'s ``?token=``). The hook
itself uses the real values (a ``tracking_uri`` with user-info logs in with it); the
trackers' own environment variables (``MLFLOW_TRACKING_USERNAME`` /
``MLFLOW_TRACKING_PASSWORD``, ``MLFLOW_TRACKING_TOKEN``, ``WANDB_API_KEY``) keep
credentials out of the config altogether.

The tracker's run id is saved in checkpoints (the hook's state), so a resumed run
(``--resume auto``, a Slurm requeue) logs into the same tracker run. Both need their
package (``pip install 'largebatch[mlflow]'`` / ``'largebatch[wandb]'``); asking for a
hook without it is an error before training starts.

A tracker never takes a run down. One that cannot start (a store it cannot open, a server
it cannot reach, W&B without credentials) is one ``error:`` line in ``before_run``, before
the first step. One that fails later prints one warning, detaches, and the run goes on:
``metrics.jsonl`` keeps every value. Their files stay inside the run directory: MLflow
without a tracking URI (none given, ``MLFLOW_TRACKING_URI`` unset) writes
``<run_dir>/mlflow.db`` and ``<run_dir>/mlartifacts``, W&B ``<run_dir>/wandb``. Both print
only what matters (MLflow's INFO lines and W&B's banner and summary are hidden) unless
``log.verbose`` is set.

MLflow on a file store (``tracking_uri='file:...'``, which MLflow 3 accepts only when asked
to, as choosing that URI does here) keeps each metric in a file named after it, so a
metric named like another's folder (``lr`` and ``lr/no_decay``) cannot be stored: there,
and only there, ``/`` in metric names is written as ``.`` (``lr.no_decay``).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import pathlib
import sys
from collections.abc import Iterator
from typing import Any

from largebatch.config.derive import Derived
from largebatch.config.redact import config_record, redact, redact_argv, redact_text
from largebatch.config.sections import Config
from largebatch.engine.hook import Hook, Priority
from largebatch.errors import UserError
from largebatch.hooks.logger import numeric_values
from largebatch.rundir import RunDir

# MLflow's limits: parameters and metrics per log_batch call, characters per parameter value
MLFLOW_PARAMS_PER_BATCH = 100
MLFLOW_METRICS_PER_BATCH = 1000
MLFLOW_PARAM_CHARS = 6000


def _first_line(err: BaseException, limit: int = 200) -> str:
    """``Type: the message's first line`` (cut at ``limit`` characters, credentials
    redacted: ``largebatch.config.redact``) for one-line reports."""
    text = redact_text(str(err)).strip().splitlines()
    first = text[0] if text else ""
    if len(first) > limit:
        first = first[: limit - 3].rstrip() + "..."
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def flat_config(config: Config, derived: Derived) -> dict[str, Any]:
    """The config with its derived numbers as dotted keys, redacted: the tracker's parameters."""
    from largebatch.checkpoint import flatten

    return flatten(config_record(config, derived))


def _require(module: str, needed_by: str, extra: str, otherwise: str) -> None:
    try:
        __import__(module)
    except ImportError:
        raise UserError(
            f"{needed_by} needs the {module} package, which is not installed; "
            f"pip install 'largebatch[{extra}]' (or {module}), or {otherwise}",
            key="hooks",
        ) from None


@contextlib.contextmanager
def _redacted_argv() -> Iterator[None]:
    """``sys.argv`` redacted for a block: W&B records the command line when a run starts."""
    argv = sys.argv
    sys.argv = redact_argv(argv)
    try:
        yield
    finally:
        sys.argv = argv


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    """Environment variables set for a block (those already set by the user are kept)."""
    added = {k: v for k, v in values.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


class TrackerHook(Hook):
    """What the trackers share: when to log what, the run id kept in checkpoints, and what
    happens when a tracker fails (the module docstring).

    A tracker implements ``_start`` (returns the run id), ``_log_params``,
    ``_log_metrics``, ``_log_files`` and ``_end``.
    """

    priority = Priority.LOWEST
    package = ""  # the module the tracker needs, also the name of its pip extra
    loggers: tuple[str, ...] = ()  # the tracker's loggers, quiet unless log.verbose

    def __init__(self, artifacts: bool = True, plots: bool = True, priority: int | str | None = None) -> None:
        super().__init__(priority)
        _require(self.package, f"the {self.package} hook", self.package, "drop the hook")
        if artifacts and plots:
            _require("matplotlib", f"the {self.package} hook's plots", "plot", "set plots=False in the hook's arguments")
        self.artifacts = artifacts
        self.plots = plots
        self.verbose = False
        self.run_id: str | None = None
        self._active = False

    def state_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.run_id = state.get("run_id")

    def before_run(self, state) -> None:
        if not state.run.is_main:
            return
        self.verbose = state.run.config.log.verbose
        try:
            with self._quiet():
                self.run_id, continued = self._start(state, self.run_id)
                if not continued:  # a continued run's parameters are already there (and may not change)
                    self._log_params(flat_config(state.run.config, state.run.derived))
        except UserError:
            raise
        except Exception as err:  # noqa: BLE001 - any failure to start is reported the same way
            raise UserError(f"the {self.package} hook cannot start: {_first_line(err)}; {self._start_hint()}") from err
        self._active = True

    def after_step(self, state) -> None:
        if self._active and state.current.log_record is not None:
            self._guarded(state, self._log_metrics, numeric_values(state.current.log_record), state.step)

    def after_eval(self, state) -> None:
        if self._active:
            self._guarded(state, self._log_metrics, numeric_values({"epoch": state.epoch_number, **state.eval_metrics}), state.step)

    def after_run(self, state) -> None:
        if self._active and self.artifacts:
            self._guarded(state, lambda: self._log_files(*self._outputs(state.run.run_dir, finished=not state.interrupted)))
        if self._active:
            self._guarded(state, self._end, "interrupted" if state.interrupted else "finished")
        self._active = False

    def on_exception(self, state, exception: BaseException) -> None:
        if self._active:
            self._active = False
            with contextlib.suppress(Exception), self._quiet():
                self._end("failed")

    def _guarded(self, state, call, *args: Any) -> None:
        """``call(*args)``; a failure detaches the tracker with one warning, and the run goes on."""
        try:
            with self._quiet():
                call(*args)
        except Exception as err:  # noqa: BLE001 - a tracker must not end the run
            self._active = False
            print(
                f"warning: the {self.package} hook failed at step {state.step} ({_first_line(err)}); it is detached and the run "
                f"goes on: {state.run.run_dir / 'metrics.jsonl'} keeps every value",
                flush=True,
            )

    @contextlib.contextmanager
    def _quiet(self) -> Iterator[None]:
        """The tracker's own log lines hidden (unless ``log.verbose``) while it runs."""
        if self.verbose:
            yield
            return
        loggers = [logging.getLogger(name) for name in self.loggers]
        levels = [logger.level for logger in loggers]
        for logger in loggers:
            logger.setLevel(logging.WARNING)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels):
                logger.setLevel(level)

    def _start_hint(self) -> str:
        """What to check when the tracker cannot start."""
        return "check the hook's settings, or drop the hook (metrics.jsonl holds every value anyway)"

    def _outputs(self, run_dir: RunDir, finished: bool) -> tuple[list[pathlib.Path], list[pathlib.Path], list[pathlib.Path]]:
        """(run files, plots, model files) that exist."""
        run_files = [p for p in (run_dir.config, run_dir.metrics) if p.is_file()]
        plots: list[pathlib.Path] = []
        if self.plots and run_dir.metrics.is_file():
            from largebatch.run_curves import plot_run

            plots = plot_run(run_dir)
        candidates = [run_dir.weights(), run_dir.hub_config, *run_dir.extra_weights()]
        model = [p for p in candidates if finished and p.is_file()]  # model_ema.safetensors: state.extra_models
        return run_files, plots, model

    # what each tracker implements
    def _start(self, state, resume_id: str | None) -> tuple[str, bool]:
        """Start or continue the tracker run: ``(run id, whether an earlier run continues)``."""
        raise NotImplementedError

    def _log_params(self, params: dict[str, Any]) -> None:
        raise NotImplementedError

    def _log_metrics(self, values: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def _log_files(self, run_files: list[pathlib.Path], plots: list[pathlib.Path], model: list[pathlib.Path]) -> None:
        raise NotImplementedError

    def _end(self, outcome: str) -> None:
        raise NotImplementedError


class MlflowHook(TrackerHook):
    """Log to an MLflow tracking server (or a local store) through ``MlflowClient``.

    Args:
        tracking_uri: the server (``http://host:5000``) or store; None: MLflow's own
            default (``MLFLOW_TRACKING_URI``, else its local default).
        experiment: the experiment's name, created when missing.
        run_name: the MLflow run's name; None: the run directory's name.
        tags: extra tags of the MLflow run.
        artifacts: log config.yaml, metrics.jsonl, plots and the final weights at the end.
        plots: include the ``largebatch plot`` figures (needs matplotlib).

    Artifacts land under ``run/`` (config.yaml, metrics.jsonl), ``plots/`` and ``model/``
    (model.safetensors, config.json). The run carries the tag ``largebatch.run_dir``.
    Without a URI (here or in ``MLFLOW_TRACKING_URI``) the store is
    ``sqlite:///<run_dir>/mlflow.db`` with artifacts in ``<run_dir>/mlartifacts``.
    """

    package = "mlflow"
    loggers = ("mlflow", "alembic")

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment: str = "largebatch",
        run_name: str | None = None,
        tags: dict[str, str] | None = None,
        artifacts: bool = True,
        plots: bool = True,
        priority: int | str | None = None,
    ) -> None:
        super().__init__(artifacts=artifacts, plots=plots, priority=priority)
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.run_name = run_name
        self.tags = dict(tags or {})
        self.client = None
        self._file_store = False

    def _start(self, state, resume_id: str | None) -> tuple[str, bool]:
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        run_dir = state.run.run_dir
        uri = self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{pathlib.Path(run_dir).resolve() / 'mlflow.db'}"
        artifacts = None if (self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")) else (run_dir / "mlartifacts").resolve().as_uri()
        self._file_store = uri.startswith("file:") or "://" not in uri  # a plain path is a file store too
        if self._file_store:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 asks for this; naming a file: URI is the asking
        with _environ(MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT="20"):  # fail fast at the start
            self.client = MlflowClient(tracking_uri=uri)
            self.client.search_experiments(max_results=1)  # opens the store: fails here, not mid-run
        if resume_id is not None:
            try:
                self.client.update_run(resume_id, status="RUNNING")
                return resume_id, True
            except MlflowException as err:  # another server, or the run was deleted
                print(f"largebatch: MLflow run {resume_id} cannot continue ({err.error_code}); starting a new one", flush=True)
        found = self.client.get_experiment_by_name(self.experiment)
        experiment_id = (
            found.experiment_id if found is not None else self.client.create_experiment(self.experiment, artifact_location=artifacts)
        )
        tags = {"largebatch.run_dir": str(state.run.run_dir), **redact(self.tags)}
        run = self.client.create_run(experiment_id, run_name=self.run_name or state.run.run_dir.name, tags=tags)
        return run.info.run_id, False

    def _log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(key, str(value)[:MLFLOW_PARAM_CHARS]) for key, value in params.items()]
        for i in range(0, len(items), MLFLOW_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[i : i + MLFLOW_PARAMS_PER_BATCH])

    def _log_metrics(self, values: dict[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(key.replace("/", ".") if self._file_store else key, value, now, step) for key, value in values.items()]
        for i in range(0, len(items), MLFLOW_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=items[i : i + MLFLOW_METRICS_PER_BATCH])

    def _log_files(self, run_files: list[pathlib.Path], plots: list[pathlib.Path], model: list[pathlib.Path]) -> None:
        for folder, paths in (("run", run_files), ("plots", plots), ("model", model)):
            for path in paths:
                self.client.log_artifact(self.run_id, str(path), artifact_path=folder)

    def _end(self, outcome: str) -> None:
        status = {"finished": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}[outcome]
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):  # MLflow prints the run's link, with the tracking URI as given
            self.client.set_terminated(self.run_id, status=status)
        sys.stdout.write(redact_text(printed.getvalue()))

    def _start_hint(self) -> str:
        return (
            "check tracking_uri (an MLflow server http://host:port, sqlite:///path/mlflow.db or file:/path/mlruns) and that the "
            "server is up, or drop the hook (metrics.jsonl holds every value anyway)"
        )


class WandbHook(TrackerHook):
    """Log to Weights & Biases through ``wandb.init``.

    Args:
        project / entity / group / tags: as ``wandb.init`` takes them.
        run_name: the W&B run's display name (``wandb.init``'s ``name``); None: the run
            directory's name.
        mode: ``'online'``, ``'offline'`` (files under ``<run_dir>/wandb``, uploaded later
            with ``wandb sync``) or ``'disabled'``; None: W&B's own (``WANDB_MODE``).
        artifacts: log config.yaml, metrics.jsonl, plots and the final weights at the end.
        plots: include the ``largebatch plot`` figures (needs matplotlib).

    The run's config is the nested config (with ``derived``); metrics are plotted against
    ``step`` (the optimizer step, ``define_metric``), so a resumed run that repeats steps
    past its last checkpoint is still accepted. Artifacts: ``<run id>-run`` (type ``run``:
    config.yaml, metrics.jsonl, plots) and ``<run id>-model`` (type ``model``:
    model.safetensors, config.json).
    """

    package = "wandb"
    loggers = ("wandb",)

    def __init__(
        self,
        project: str = "largebatch",
        entity: str | None = None,
        run_name: str | None = None,
        group: str | None = None,
        tags: list[str] | None = None,
        mode: str | None = None,
        artifacts: bool = True,
        plots: bool = True,
        priority: int | str | None = None,
    ) -> None:
        super().__init__(artifacts=artifacts, plots=plots, priority=priority)
        if mode not in (None, "online", "offline", "disabled"):
            raise UserError(f"wandb hook: mode {mode!r} is not one of 'online', 'offline', 'disabled'", key="hooks")
        self.project, self.entity, self.run_name, self.group = project, entity, run_name, group
        self.tags = list(tags or [])
        self.mode = mode
        self.run = None

    def _start(self, state, resume_id: str | None) -> tuple[str, bool]:
        import wandb

        with _redacted_argv():
            self.run = wandb.init(
                project=self.project,
                entity=self.entity,
                name=self.run_name or state.run.run_dir.name,
                group=self.group,
                tags=redact(self.tags) or None,
                mode=self.mode,
                dir=str(state.run.run_dir),
                id=resume_id,
                resume="allow" if resume_id is not None else None,
                config=config_record(state.run.config, state.run.derived),
                settings=wandb.Settings(silent=not self.verbose),
            )
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")
        return self.run.id, resume_id is not None

    def _log_params(self, params: dict[str, Any]) -> None:
        """Nothing more: ``wandb.init`` took the nested config (W&B flattens it itself)."""

    def _log_metrics(self, values: dict[str, float], step: int) -> None:
        self.run.log({"step": step, **values})

    def _log_files(self, run_files: list[pathlib.Path], plots: list[pathlib.Path], model: list[pathlib.Path]) -> None:
        import wandb

        for kind, paths in (("run", run_files + plots), ("model", model)):
            if paths:
                artifact = wandb.Artifact(f"{self.run.id}-{kind}", type=kind)
                for path in paths:
                    artifact.add_file(str(path), name=f"plots/{path.name}" if path in plots else path.name)
                self.run.log_artifact(artifact)

    def _end(self, outcome: str) -> None:
        if outcome == "interrupted":
            self.run.mark_preempting()
        self.run.finish(exit_code=1 if outcome == "failed" else 0)
        self.run = None
        import wandb

        wandb.teardown()  # waits until W&B's service has written everything (finish alone returns before, when silent)

    def _start_hint(self) -> str:
        return (
            "check project and entity, and W&B's credentials (WANDB_API_KEY, or `wandb login`); on a machine without "
            "network use mode='offline' and `wandb sync` later; or drop the hook (metrics.jsonl holds every value anyway)"
        )
