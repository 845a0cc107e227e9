"""The training command: ``largebatch train``, ``python train.py`` and a study's trials
(``largebatch.study.runner``) all start in ``train_main``; and ``run``, which every
command of ``largebatch.cli`` goes through too.

A user mistake (``UserError``) prints one line starting with ``error:`` and exits with
status 2. A hook that raises prints one ``error:`` line naming the hook, the event, the
exception and the line of the hook's file it came from, and exits with status 1.
``--debug`` shows the traceback as well. A training run stopped by SIGUSR1, SIGUSR2 or
SIGTERM checkpoints and exits with status 75 (``largebatch.preemption.EXIT_REQUEUE``).
This module imports nothing of the other commands.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import traceback
import typing
from collections.abc import Sequence

from largebatch import preemption
from largebatch.errors import UserError


class ArgumentParser(argparse.ArgumentParser):
    """argparse with its mistakes as one ``error:`` line (status 2) and a "did you mean"
    for a misspelled flag or command. A misspelled flag is named even when argparse would
    first complain that the flag it stands for is missing."""

    _seen: list[str] | None = None

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self._seen = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def _flags(self) -> list[str]:
        return [opt for action in self._actions for opt in action.option_strings if opt.startswith("--")]

    def _misspelt_flag(self, words: list[str]) -> tuple[str, str] | None:
        flags = self._flags()
        for word in words:
            name = word.split("=")[0]
            if not name.startswith("-") or name in flags:
                continue
            close = difflib.get_close_matches(name, flags, n=1, cutoff=0.6)
            if close:
                return name, close[0]
        return None

    def error(self, message: str) -> typing.NoReturn:
        hint = ""
        found = self._misspelt_flag(re.findall(r"(?<![\w-])(--?[\w-]+)", message))
        if found is None and "are required" in message:
            found = self._misspelt_flag(self._seen or [])
            if found is not None:
                message = f"unrecognized argument {found[0]} ({message})"
        if found is not None:
            hint = f"; did you mean {found[1]}?"
        else:
            choices = re.search(r"invalid choice: '([^']+)' \(choose from (.+)\)", message)
            if choices:
                names = re.findall(r"'?([\w-]+)'?", choices.group(2))
                close = difflib.get_close_matches(choices.group(1), names, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
        self.exit(2, f"error: {self.prog}: {message}{hint} (see {self.prog} --help)\n")


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", help="a .py or .yaml config file (with --resume: optional, the run continues with its saved config.yaml)"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set optimizer.lr=0.02 (repeatable)",
    )
    parser.add_argument("--run-dir", help="run directory (default: runs/<config name>-<timestamp>)")
    parser.add_argument(
        "--resume",
        metavar="auto|PATH",
        help="resume from the newest checkpoint in the run directory (auto) or from a file, with the run's saved config "
        "and any --set on top",
    )
    parser.add_argument("--resume-ignore-config", action="store_true", help="resume even if the config differs from the checkpoint's")
    parser.add_argument(
        "--branch-from",
        metavar="CHECKPOINT",
        help="start a new run from another run's checkpoint: its weights and optimizer state, this run's config "
        "(any global batch, learning rate or schedule) and counters from zero",
    )
    parser.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="load a checkpoint (--resume, model.init_from) that holds more than tensors and plain values; loading it may "
        "run code it carries, so only for files you trust",
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback behind an error: line (a mistake, a failing hook)")


def cmd_train(args: argparse.Namespace) -> int:
    """Train; status 0 when done, ``EXIT_REQUEUE`` (75) when stopped by a preemption signal."""
    preemption.install_signal_handlers()  # before torch is imported: a signal before it would kill us
    from largebatch.launch import TrainArgs, train

    state = train(
        TrainArgs(
            args.config,
            args.overrides,
            args.run_dir,
            args.resume,
            args.resume_ignore_config,
            trust_checkpoint=args.trust_checkpoint,
            branch_from=args.branch_from,
        )
    )
    return preemption.EXIT_REQUEUE if state.interrupted else 0


def failure_status(exc: BaseException) -> int | None:
    """The exit status of a command that raised ``exc`` and ends with one ``error:`` line:
    2 for a user mistake (a ``UserError``, or an error caused by one, such as a hook's),
    1 for a hook's own exception; None for anything else (a traceback: a fault of ours)."""
    from largebatch.engine.hook import HookError

    if isinstance(exc, UserError) or isinstance(exc.__cause__, UserError):
        return 2
    return 1 if isinstance(exc, HookError) else None


def run(func: typing.Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Call ``func(args)``, turning user errors and hook failures into one ``error:`` line
    (status ``failure_status``; credentials redacted: ``largebatch.config.redact``)."""
    from largebatch.config.redact import redact_text

    try:
        return func(args)
    except Exception as exc:
        status = failure_status(exc)
        if status is None:
            raise
        debug = getattr(args, "debug", False)
        if debug:
            traceback.print_exc()
        message = exc.render() if isinstance(exc, UserError) else str(exc)
        hint = "" if status == 2 or debug else " (--debug shows the traceback)"
        print(f"error: {redact_text(message)}{hint}", file=sys.stderr)
        return status


def train_main(argv: Sequence[str] | None = None, prog: str = "train.py") -> int:
    """``python train.py ...`` (``prog``: the name argparse's errors give the command):
    the same as ``largebatch train ...``."""
    parser = ArgumentParser(prog=prog, description="Large-batch ViT pretraining (same as `largebatch train`).")
    add_train_arguments(parser)
    args = parser.parse_args(argv)
    return run(cmd_train, args)
