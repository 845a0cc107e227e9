"""Start-up of the commands that do not train, against importing torch and timm.

What it compares and how it times: BENCHMARKS.md, "Start-up of the commands that do not train".

    python bench/startup.py [--rounds 7] [--against ../other-checkout]
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: start again as the module (bench/common.py)
    __import__("common").run_as_module(__file__)

import os
import pathlib
import statistics
import subprocess
import sys
import time

from bench.common import REPO, in_turn, load, machine_description, options, spread_text, table

SHOW = "largebatch config show configs/vit-b16.py --world-size 8"
COMMANDS = {
    "largebatch --help": ["-m", "largebatch", "--help"],
    SHOW: ["-m", *SHOW.split()],
    "import torch, timm": ["-c", "import torch, timm"],
}
AA = "A/A: config show again"


def timed(tree: pathlib.Path, args: list[str]) -> float:
    """Seconds from the start of ``python ARGS`` in ``tree`` to its exit; fails loudly."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    start = time.perf_counter()
    result = subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"`{' '.join(args)}` in {tree} failed ({result.returncode}): {result.stderr[-2000:]}")
    return seconds


def rotation(against: pathlib.Path | None) -> list[tuple[str, pathlib.Path, list[str]]]:
    """(label, tree, arguments) of every timed slot of a round."""
    slots = [(name, REPO, args) for name, args in COMMANDS.items()]
    slots.append((AA, REPO, COMMANDS[SHOW]))
    if against is not None:
        slots += [(f"{name} [{against.name}]", against, args) for name, args in COMMANDS.items() if name.startswith("largebatch")]
    return slots


def ratio(times: dict[str, list[float]], a: str, b: str) -> str:
    return spread_text([x / y for x, y in zip(times[a], times[b])])


def main() -> None:
    parser = options(__doc__, rounds=7)
    parser.add_argument("--against", type=pathlib.Path, default=None, help="another checkout to time the same commands from")
    args = parser.parse_args()
    against = args.against.resolve() if args.against else None
    slots = rotation(against)
    for _, tree, argv in slots:  # warm the file cache: the first run of each reads everything from disk
        timed(tree, argv)
    times: dict[str, list[float]] = {label: [] for label, _, _ in slots}
    before = load()
    for round_ in range(args.rounds):
        for label, tree, argv in in_turn(slots, round_):
            times[label].append(timed(tree, argv))
    print(f"Machine: {machine_description()}.")  # imports torch: only once the timing is done
    print(f"{before} before, {load()} after; {args.rounds} rounds.\n")
    print(table("command | s (median): | s (min):"))
    for label, values in times.items():
        print(f"| {label} | {statistics.median(values):.3f} | {min(values):.3f} |")
    print("\n" + table("ratio, per round | median (quartiles):"))
    print(f"| --help / import torch, timm | {ratio(times, 'largebatch --help', 'import torch, timm')} |")
    print(f"| config show / import torch, timm | {ratio(times, SHOW, 'import torch, timm')} |")
    print(f"| {AA} / config show | {ratio(times, AA, SHOW)} |")
    if against is not None:
        for name in (n for n in COMMANDS if n.startswith("largebatch")):
            print(f"| {name}: {against.name} / this tree | {ratio(times, f'{name} [{against.name}]', name)} |")


if __name__ == "__main__":
    main()
