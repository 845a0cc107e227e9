"""Run the benchmark suite: ``python -m bench`` (or ``make bench``).

Each benchmark compares two things side by side in one process and prints a ratio:

=================  ==============================================================
engine_overhead    the largebatch engine against a hand-written PyTorch loop
timm_train         end-to-end CPU training images/s against timm's train.py path
mfu                training FLOP/s against a large fp32 matmul's FLOP/s
lamb_step          our LAMB's step time against timm's, torch-optimizer's and
                   Colossal-AI's
lars_step          our LARS's step time against timm's Lars, with an A/A control
loaders            the native TFRecord loader against DALI (CPU) and ImageFolder
startup            the commands that do not train against ``import torch, timm``
convert            ``largebatch data convert | verify`` with several workers against one
=================  ==============================================================

The benchmarks run one after another as subprocesses (``OMP_NUM_THREADS=1`` unless
set), and their tables go into one Markdown file with the machine's description, the
load before and after each, and each command: ``bench/results/suite.md``, or with
``--quick`` (small sizes, a smoke run of minutes) ``bench/.cache/suite-quick.md``.
The critical-batch study, ``largebatch study run studies/fashion-mnist/study.py``, trains
for hours and is not part of the suite.

    python -m bench [--quick] [--only mfu timm_train ...] [--args 'NAME=ARGS' ...] [--out FILE]

With ``--device cuda``, ``--device hpu`` (or the stand-in ``--device cpu``) it runs the
accelerator suite instead (``bench/accelerator.py``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import shlex
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.machine import machine_description  # noqa: E402

# name: (script, arguments for the full run, arguments for --quick)
BENCHES: dict[str, tuple[str, list[str], list[str]]] = {
    "engine_overhead": (
        "bench/engine_overhead.py",
        ["--rounds", "5", "--steps", "8"],
        ["--rounds", "1", "--steps", "2", "--micro", "8", "--accumulation", "2", "--depth", "1"],
    ),
    "timm_train": (
        "bench/timm_train.py",
        ["--images", "256", "--batch", "32", "--epochs", "3", "--rounds", "2"],
        ["--images", "32", "--batch", "8", "--epochs", "2", "--rounds", "1", "--depth", "1", "--image-size", "32"],
    ),
    "mfu": (
        "bench/mfu.py",
        ["--rounds", "3", "--steps", "4"],
        ["--rounds", "1", "--steps", "1", "--micro", "8", "--accumulation", "1", "--depth", "1", "--matmul", "256"],
    ),
    "lamb_step": ("bench/lamb_step.py", ["--steps", "5", "--rounds", "2"], ["--steps", "1", "--rounds", "1", "--compare-steps", "1"]),
    "lars_step": ("bench/lars_step.py", ["--steps", "3", "--rounds", "8"], ["--steps", "1", "--rounds", "2", "--compare-steps", "1"]),
    "loaders": ("bench/loaders.py", ["--images", "512"], ["--images", "32", "--rounds", "1", "--batch", "8"]),
    "startup": ("bench/startup.py", ["--rounds", "7"], ["--rounds", "1"]),
    "convert": ("bench/convert.py", ["--images", "2000", "--rounds", "5"], ["--images", "64", "--rounds", "1"]),
}


def load() -> str:
    try:
        return "load average " + " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "load average unknown"


def run_bench(name: str, quick: bool, env: dict[str, str], override: str | None = None) -> tuple[str, int, str, float]:
    script, full, small = BENCHES[name]
    chosen = shlex.split(override) if override is not None else small if quick else full
    cmd = [sys.executable, script, *chosen]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    # the engine's own end-of-run line ("done: N steps in ...") is not part of a table
    stdout = "\n".join(line for line in proc.stdout.splitlines() if not line.startswith("done: "))
    output = stdout if proc.returncode == 0 else stdout + "\n" + proc.stderr[-4000:]
    return shlex.join(["python", *cmd[1:]]), proc.returncode, output.strip(), time.perf_counter() - start


def ratio_lines(output: str) -> list[str]:
    """The lines that state a comparison (``a / b = x``, ``MFU = ...``)."""
    return [line for line in output.splitlines() if " = " in line and "/" in line]


def report_lines(args: argparse.Namespace, names: list[str], summary: list[str], sections: list[str]) -> list[str]:
    """The CPU suite's Markdown report."""
    return [
        "# Benchmark suite" + (" (quick mode: smoke sizes, not for reading)" if args.quick else ""),
        "",
        f"Run {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC with `python -m bench"
        + (" --quick" if args.quick else "")
        + (f" --only {' '.join(names)}" if args.only else "")
        + "".join(f" --args {shlex.quote(item)}" for item in args.args)
        + "`.",
        "",
        f"Machine: {machine_description()}.",
        "",
        "| benchmark | comparison |",
        "|---|---|",
        *summary,
        "",
        *sections,
    ]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(arg == "--device" or arg.startswith("--device=") for arg in argv):
        from bench import accelerator

        return accelerator.main(argv)
    return cpu_suite(argv)


def cpu_suite(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Run the side-by-side benchmarks (with --device cuda, hpu or cpu: the accelerator suite; see --device cuda --help).",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: checks that every benchmark runs")
    parser.add_argument("--only", nargs="+", choices=list(BENCHES), help="run only these")
    parser.add_argument("--out", type=pathlib.Path, help="the Markdown report (default: bench/results/suite.md)")
    parser.add_argument(
        "--args",
        action="append",
        default=[],
        metavar="NAME=ARGS",
        help="run benchmark NAME with these arguments instead, e.g. --args 'mfu=--rounds 2 --depth 4' (repeatable)",
    )
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.args:
        name, sep, value = item.partition("=")
        if not sep or name not in BENCHES:
            parser.error(f"--args {item!r}: expected NAME=ARGS with NAME one of {', '.join(BENCHES)}")
        overrides[name] = value
    out = args.out or (REPO / "bench" / (".cache/suite-quick.md" if args.quick else "results/suite.md"))
    out.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    site = REPO / ".bench-site"  # lamb_step.py's peers (bench/requirements.txt), when installed there
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(site) if site.is_dir() else "", env.get("PYTHONPATH")]))
    names = args.only or list(BENCHES)
    sections, summary, failed = [], [], []
    for name in names:
        before = load()
        print(f"bench: {name} ...", flush=True)
        command, status, output, seconds = run_bench(name, args.quick, env, overrides.get(name))
        after = load()
        if status != 0:
            failed.append(name)
        found = ratio_lines(output)
        if status:
            summary.append(f"| {name} | failed, status {status} |")
        else:
            summary += [f"| {name} | {line.strip()} |" for line in found] or [f"| {name} | the table below |"]
        sections += [
            f"## {name}",
            "",
            f"`{command}` ({seconds:.0f} s; {before} before, {after} after)" + (f"; **failed, status {status}**" if status else ""),
            "",
            output if status == 0 else "```\n" + output + "\n```",
            "",
        ]
        print(output if status == 0 else f"bench: {name} failed (status {status})\n{output}", flush=True)
    out.write_text("\n".join(report_lines(args, names, summary, sections)))
    print(f"bench: report written to {out}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
