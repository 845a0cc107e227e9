"""Run the benchmark suite: ``python -m bench`` (or ``make bench``).

What it compares and how it times: docs/benchmarks.md, "Running them".

    python -m bench [--quick] [--only mfu timm_train ...] [--args 'NAME=ARGS' ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import pathlib
import shlex
import sys

from bench.common import REPO, load, repo_env, run_child, table, write_report

# name (the module bench.NAME): "arguments for the full run | arguments for --quick"
BENCHES = {
    "engine_overhead": "--rounds 5 --steps 8 | --rounds 1 --steps 2 --micro 8 --accumulation 2 --depth 1",
    "timm_train": "--images 256 --batch 32 --epochs 3 --rounds 2 | --images 32 --batch 8 --epochs 2 --rounds 1 --depth 1 --image-size 32",
    "mfu": "--rounds 3 --steps 4 | --rounds 1 --steps 1 --micro 8 --accumulation 1 --depth 1 --matmul 256",
    "lamb_step": "--steps 5 --rounds 2 | --steps 1 --rounds 1 --compare-steps 1",
    "lars_step": "--steps 3 --rounds 8 | --steps 1 --rounds 2 --compare-steps 1",
    "loaders": "--images 512 | --images 32 --rounds 1 --batch 8",
    "startup": "--rounds 7 | --rounds 1",
    "convert": "--images 2000 --rounds 5 | --images 64 --rounds 1",
}


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
    example = "run NAME with ARGS instead (repeatable), e.g. --args 'mfu=--rounds 2 --depth 4'"
    parser.add_argument("--args", action="append", default=[], metavar="NAME=ARGS", help=example)
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.args:
        name, sep, value = item.partition("=")
        if not sep or name not in BENCHES:
            parser.error(f"--args {item!r}: expected NAME=ARGS with NAME one of {', '.join(BENCHES)}")
        overrides[name] = value
    site = REPO / ".bench-site"  # lamb_step.py's peers (bench/requirements.txt), when installed there
    env = repo_env(*([site] if site.is_dir() else []))
    env.setdefault("OMP_NUM_THREADS", "1")
    names = args.only or list(BENCHES)
    sections, summary, failed = [], [], []
    for name in names:
        before = load()
        print(f"bench: {name} ...", flush=True)
        chosen = overrides.get(name, BENCHES[name].split(" | ")[1 if args.quick else 0])
        command, status, output, seconds = run_child(["-m", f"bench.{name}", *shlex.split(chosen)], env)
        after = load()
        if status:
            failed.append(name)
            summary.append(f"| {name} | failed, status {status} |")
        else:
            ratios = [line for line in output.splitlines() if " = " in line and "/" in line]  # a / b = x, MFU = ...
            summary += [f"| {name} | {line.strip()} |" for line in ratios] or [f"| {name} | the table below |"]
        note = f"; **failed, status {status}**" if status else ""
        sections += [f"## {name}", "", f"`{command}` ({seconds:.0f} s; {before} before, {after} after){note}", "", output, ""]
        print(output if status == 0 else f"bench: {name} failed (status {status})\n{output}", flush=True)
    out = args.out or (REPO / "bench" / (".cache/suite-quick.md" if args.quick else "results/suite.md"))
    command = shlex.join(["python", "-m", "bench", *(["--quick"] if args.quick else []), *(["--only", *names] if args.only else [])])
    command += "".join(f" --args {shlex.quote(item)}" for item in args.args)
    title = "Benchmark suite" + (" (quick mode: smoke sizes, not for reading)" if args.quick else "")
    write_report(out, title, command, [], table("benchmark | comparison", summary), sections)
    print(f"bench: report written to {out}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
