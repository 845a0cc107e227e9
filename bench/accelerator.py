"""The suite for a machine with a GPU or a Gaudi: ``python -m bench --device cuda|hpu``.

What it compares and how it times: docs/benchmarks.md, "On a GPU or a Gaudi" (the sections a to h, --budget, --log).

    python -m bench --device cuda [--quick] [--only train lamb] [--budget S] [--log FILE] [--out FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import re
import shlex
import subprocess
import sys
import time

from bench.common import REPO, TIMED_OUT, repo_env, run_child, table, write_report

# In order of importance, so a --budget that runs out drops the least important last
# (each runs as ``section_<name>`` in bench/accelerator_sections.py).
TITLES = {
    "tests": "a. Tests marked for the device",
    "lamb": "b. LAMB step time",
    "train": "c. Training throughput: engine precisions and timm's train.py loop",
    "loader_alone": "d. The loaders onto the device, alone",
    "loader_train": "e. Training from TFRecord shards through the loaders",
    "distributed": "f. ddp against fsdp",
    "accuracy": "g. Accuracy smoke: the Fashion-MNIST demo",
    "profile": "h. Where the step time goes: the engine and timm's loop under torch.profiler",
}
SECTIONS = list(TITLES)
SECTION_TIMEOUT_S = 3600


def habana_probe() -> tuple[bool, str]:
    """(Gaudi present, device name or why not), asked through the backend in a child process:
    the bridge takes the Gaudi for the process that opens it, and the sections need it."""
    code = (
        "from largebatch.backends import hpu\n"
        "ok = hpu.is_available('lazy')  # PT_HPU_LAZY_MODE=1 set before the bridge loads, as the sections run\n"
        "import habana_frameworks.torch.hpu as h\n"
        "print(ok, h.get_device_name() if ok else 'habana_frameworks.torch.hpu.is_available() is False')"
    )
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=repo_env(), timeout=600)
    except subprocess.TimeoutExpired:
        return False, "habana_frameworks.torch.hpu did not answer within 600 s"
    if proc.returncode != 0:
        return False, f"habana_frameworks.torch.hpu does not load: {(proc.stderr.strip().splitlines() or ['no output'])[-1]}"
    ok, _, detail = proc.stdout.strip().partition(" ")
    return ok == "True", detail


def device_check(device: str) -> tuple[str | None, str]:
    """(the error line's text or None, the device's name)."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        cuda = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        return f"no GPU found: torch.cuda.is_available() is False (torch {torch.__version__}, {cuda})", ""
    if device == "hpu" and importlib.util.find_spec("habana_frameworks") is None:
        return "no Gaudi found: habana_frameworks is not installed", ""
    if device == "hpu":
        ok, detail = habana_probe()
        return (None, detail) if ok else (f"no Gaudi found: {detail}", "")
    return None, torch.cuda.get_device_name(0) if device == "cuda" else "CPU (stand-in)"


def report_path(device: str, name: str) -> pathlib.Path:
    if device == "cpu":
        return REPO / "bench" / ".cache" / "accelerator-cpu.md"
    slug = re.sub(r"[^a-z0-9.-]+", "-", name.lower().replace(" ", "-")).strip("-")
    return REPO / "bench" / "results" / f"{'gpu' if device == 'cuda' else 'hpu'}-{slug}.md"


NOT_RUN = -1  # a section the budget left no time for


def run_section(
    name: str, device: str, quick: bool, timeout: float = SECTION_TIMEOUT_S, log: pathlib.Path | None = None
) -> tuple[str, int, str, float]:
    """(the command, its exit status, its output, seconds); a section stopped at ``timeout``
    has status 124 and keeps what it printed."""
    args = ["-m", "bench.accelerator_sections", name, "--device", device, *(["--quick"] if quick else [])]
    env = repo_env() | ({"PT_HPU_LAZY_MODE": "1"} if device == "hpu" else {})  # lazy mode: set before the bridge loads
    return run_child(args, env, timeout, log, label=name)


def section_status(status: int, output: str) -> str:
    if status == NOT_RUN:
        return "not run: the --budget was spent"
    if status == TIMED_OUT:
        return "stopped at the --budget"
    if status:
        return f"failed, status {status}"
    skipped = [line for line in output.splitlines() if line.startswith("skipped:")]
    return "skipped" if skipped and len(skipped) == len([line for line in output.splitlines() if line.strip()]) else "ran"


def write(out: pathlib.Path, args: argparse.Namespace, name: str, results: list[tuple[str, str, int, str, float]]) -> None:
    command = shlex.join(["python", "-m", "bench", "--device", args.device, *(["--quick"] if args.quick else [])])
    command += (" --only " + " ".join(args.only) if args.only else "") + (f" --budget {args.budget:g}" if args.budget is not None else "")
    summary = [f"| {TITLES[section]} | {section_status(status, output)} |" for section, _, status, output, _ in results]
    sections = []
    for section, cmd, status, output, seconds in results:
        note = f"; **{section_status(status, output)}**" if status else ""
        sections += [f"## {TITLES[section]}", "", *([] if status == NOT_RUN else [f"`{cmd}` ({seconds:.0f} s){note}", ""]), output, ""]
    title = f"Accelerator suite: {args.device}" + (" (quick: smoke sizes, not for reading)" if args.quick else "")
    write_report(out, title, command, [f"Device: {name}.", ""], table("section | status", summary), sections)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description="Run the accelerator suite.")
    parser.add_argument("--device", required=True, choices=["cuda", "hpu", "cpu"], help="cpu: the small stand-in")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks that every section runs")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these sections")
    parser.add_argument("--out", type=pathlib.Path, help="the Markdown report (default: bench/results/<gpu|hpu>-<device>.md)")
    parser.add_argument("--budget", type=float, metavar="SECONDS", help="start no section after this many seconds, stop one at it")
    parser.add_argument("--log", type=pathlib.Path, help="append every section's whole output to this file")
    args = parser.parse_args(argv)
    if args.budget is not None and args.budget <= 0:
        parser.error(f"--budget {args.budget:g}: give a number of seconds above 0")
    error, name = device_check(args.device)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.device == "cpu":
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # as the sections run, so the report's machine line says so
    out = args.out or report_path(args.device, name)
    if args.log is not None:
        args.log.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget if args.budget is not None else None
    results = []
    for section in args.only or SECTIONS:
        left = SECTION_TIMEOUT_S if deadline is None else min(SECTION_TIMEOUT_S, deadline - time.monotonic())
        if left < 1:
            print(f"bench: {section} not run: the budget of {args.budget:g} s is spent", flush=True)
            result = "", NOT_RUN, f"not run: the budget of {args.budget:g} s was spent before it", 0.0
        else:
            print(f"bench: {section} ...", flush=True)
            result = run_section(section, args.device, args.quick, timeout=left, log=args.log)
            print(result[2] if result[1] == 0 else f"bench: {section} failed (status {result[1]})\n{result[2]}", flush=True)
        results.append((section, *result))
        write(out, args, name, results)  # after each section: a crash later keeps what ran
    failed = [section for section, _, status, _, _ in results if status not in (0, NOT_RUN)]
    not_run = [section for section, _, status, _, _ in results if status == NOT_RUN]
    print(
        f"bench: report written to {out}"
        + (f"; failed: {', '.join(failed)}" if failed else "")
        + (f"; not run (budget): {', '.join(not_run)}" if not_run else "")
    )
    return 1 if failed else 0
