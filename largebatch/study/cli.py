"""``largebatch study run | status | report``: the commands, registered by ``largebatch.cli``.

Nothing heavy is imported here: Optuna, torch and the rest load inside the commands, so
``largebatch --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

EXIT_UNFINISHED = 1  # trials failed and wait for --retry-failed or --skip-failed, or the run was stopped


def register(commands: Any) -> None:
    """Add ``study`` and its subcommands to the top-level subparsers."""
    study = commands.add_parser("study", help="large-batch studies on Optuna: steps to a target across optimizers and batch sizes")
    sub = study.add_subparsers(dest="study_command", required=True)

    run = sub.add_parser("run", help="run a study's trials (resumes a stopped study), then write its report")
    run.add_argument("study", help="the study file (.py or .yaml)")
    run.add_argument("--jobs", type=int, default=1, help="trials run side by side by this command (default 1)")
    failed = run.add_mutually_exclusive_group()
    failed.add_argument("--retry-failed", action="store_true", help="run trials whose training failed again")
    failed.add_argument("--skip-failed", action="store_true", help="go on without trials whose training failed")
    run.add_argument("--max-trials", type=int, help="stop after this many trials (run a study in parts)")
    run.add_argument(
        "--threads", type=int, help="OMP threads per trial (default: the study file's threads, else this machine's cores / --jobs)"
    )
    run.add_argument("--storage", help="an Optuna storage URL or journal:PATH (default: the study file's, else sqlite in its folder)")
    run.add_argument("--no-report", action="store_true", help="do not write report.md, report.json and the plots")
    run.add_argument("--debug", action="store_true", help="show tracebacks for user errors")
    run.set_defaults(func=cmd_run)

    status = sub.add_parser("status", help="trials done, running, failed, per cell")
    status.add_argument("study", help="the study file")
    status.add_argument("--storage", help="an Optuna storage URL or journal:PATH")
    status.add_argument("--debug", action="store_true")
    status.set_defaults(func=cmd_status)

    report = sub.add_parser("report", help="write report.md, report.json and the plots from the storage")
    report.add_argument("study", help="the study file")
    report.add_argument("--storage", help="an Optuna storage URL or journal:PATH")
    report.add_argument("--out", help="the folder to write (default: the study file's folder)")
    report.add_argument("--debug", action="store_true")
    report.set_defaults(func=cmd_report)


def _needs_study_packages() -> None:
    """Optuna (its QMC sampler needs SciPy) and matplotlib are the ``study`` extra."""
    import importlib.util

    from largebatch.errors import UserError

    missing = [name for name in ("optuna", "scipy", "matplotlib") if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(f"studies need {', '.join(missing)}, not installed; pip install 'largebatch[study]'")


def _url(args: argparse.Namespace, spec: Any) -> str:
    from largebatch.study.storage import default_url

    return args.storage or spec.storage or default_url(spec.folder)


def _shown(url: str) -> str:
    """The storage URL as printed and reported: credentials redacted (``largebatch.config.redact``)."""
    from largebatch.config.redact import redact_text

    return redact_text(url)


def cmd_run(args: argparse.Namespace) -> int:
    from largebatch.errors import UserError
    from largebatch.study import checks, report, storage, worker
    from largebatch.study.spec import load_study

    if args.jobs < 1 or (args.max_trials is not None and args.max_trials < 1) or (args.threads is not None and args.threads < 1):
        raise UserError("--jobs, --max-trials and --threads take positive numbers")
    _needs_study_packages()
    spec = load_study(args.study)
    base = checks.prepare(spec)
    url = _url(args, spec)
    study = storage.create_or_load(storage.open_storage(url), spec.name)
    options = worker.Options(args.jobs, args.retry_failed, args.skip_failed, args.max_trials, args.threads)
    checks.bind(spec, study, _shown(url), worker.threads_per_trial(spec, options))
    for line in checks.budget_warnings(spec, base, study.get_trials(deepcopy=False)):
        print(line, file=sys.stderr)
    outcome = worker.Workers(spec, base, study, options).run()
    if not args.no_report:
        for path in report.write(spec, study, _shown(url), spec.folder):
            print(path)
    for key, error in outcome.blocked:
        last = error.strip().splitlines()[-1] if error.strip() else "failed"
        print(f"failed: {key}: {last}", file=sys.stderr)
    if outcome.blocked:
        print(
            f"{len(outcome.blocked)} trial(s) failed and hold their cells back; run again with --retry-failed to rerun them "
            "or --skip-failed to go on without them (`largebatch study status` lists them)",
            file=sys.stderr,
        )
    return EXIT_UNFINISHED if outcome.blocked or outcome.stopped else 0


def cmd_status(args: argparse.Namespace) -> int:
    from largebatch.study import report, storage
    from largebatch.study.spec import load_study

    _needs_study_packages()
    spec = load_study(args.study)
    url = _url(args, spec)
    study = storage.load_existing(storage.open_storage(url), spec.name, url)
    sys.stdout.write(report.status_text(spec, study, _shown(url)))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    import pathlib

    from largebatch.study import report, storage
    from largebatch.study.spec import load_study

    _needs_study_packages()
    spec = load_study(args.study)
    url = _url(args, spec)
    study = storage.load_existing(storage.open_storage(url), spec.name, url)
    out = pathlib.Path(args.out) if args.out else spec.folder
    out.mkdir(parents=True, exist_ok=True)
    for path in report.write(spec, study, _shown(url), out):
        print(path)
    return 0
