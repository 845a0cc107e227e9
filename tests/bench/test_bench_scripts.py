"""The benchmarks run, and the numbers they are built on are right.

Speed itself is never asserted here; the scripts run at smoke sizes and must print
their comparison as a finite positive ratio.
"""

from __future__ import annotations

import ast
import math
import re
import subprocess
import sys
import time

import pytest
import torch

from bench import common
from bench.engine_overhead import TakingTurns, Turns, bare_worker
from bench.mfu import training_flops_per_image
from tests.conftest import REPO, clean_env
from tests.test_layers import imported_modules

# What builds a config its own way (a YAML file written, a dict typed, a run started from
# it): bench/common.py alone does, from bench/base.yaml and --set overrides.
OWN_CONFIG = {"build_run", "TrainArgs", "resolve_config", "load_config", "typed", "section"}


def run_script(*args: str, timeout: float = 900) -> str:
    proc = subprocess.run([sys.executable, *args], cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def ratio(output: str, name: str) -> float:
    match = re.search(rf"{re.escape(name)} = ([0-9.]+)", output)
    assert match, output
    value = float(match.group(1))
    assert math.isfinite(value) and value > 0
    return value


def test_benchmarks_build_configs_in_one_place_and_leave_sys_path_alone():
    found = []
    for path in sorted((REPO / "bench").glob("*.py")):
        edits = [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call | ast.Assign | ast.AugAssign)]
        found += [f"{path.name}:{node.lineno}: {ast.unparse(node)}" for node in edits if re.match(r"sys\.path\b", ast.unparse(node))]
        if path.name != "common.py":
            imports = imported_modules(path, ["bench"])
            found += [f"{path.name}:{line}: {name}" for line, name in imports if name == "yaml" or name.rpartition(".")[2] in OWN_CONFIG]
    assert not found, "build configs with bench.common (config, build_engine); run benchmarks as modules:\n" + "\n".join(found)


def test_a_config_built_for_a_benchmark_is_the_one_a_users_set_options_give():
    overrides = {"model": {"name": "vit_tiny_patch16_224", "depth": 1}, "data.scale": [0.5, 1.0], "clip_grad_norm": None}
    by_hand = ["model={name: vit_tiny_patch16_224, depth: 1}", "data.scale=[0.5, 1.0]", "clip_grad_norm=null"]
    from largebatch.config import resolve_config

    assert common.config(overrides) == resolve_config(REPO / "bench" / "base.yaml", by_hand)
    assert common.config(overrides).model.extra == {"depth": 1} and common.config({}).model.extra == {"patch_size": 4}


def test_a_benchmark_run_as_a_file_starts_again_as_its_module(tmp_path):
    # `python bench/x.py`, as BENCHMARKS.md writes the commands, here from another folder
    # and without PYTHONPATH: it runs as `python -m bench.x`, importing bench.common.
    env = {key: value for key, value in clean_env().items() if key != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "startup.py"), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0 and proc.stdout.startswith("usage: ") and "--against" in proc.stdout, proc.stderr
    # and every benchmark with a main block does the same (the suite's own __main__ runs as `python -m bench`)
    scripts = [path.name for path in sorted((REPO / "bench").glob("*.py")) if 'if __name__ == "__main__":\n' in path.read_text()]
    unguarded = [name for name in scripts if "run_as_module(__file__)" not in (REPO / "bench" / name).read_text()]
    assert len(scripts) == 13 and unguarded == ["__main__.py"], unguarded


def test_the_sides_take_turns_and_ratios_are_read_per_round():
    calls = []
    times = common.time_blocks([lambda: calls.append("a"), lambda: calls.append("b"), lambda: calls.append("c")], 2, rounds=2)
    assert calls == [*"aaabbbccc", *"cccbbbaaa"]  # one untimed call and two timed ones a block, reversed every other round
    assert [len(side) for side in times] == [2, 2, 2] and all(len(block) == 2 for side in times for block in side)
    assert common.rotated("abc", 4) == ["b", "c", "a"] and common.in_turn("abc", 1) == ["c", "b", "a"]
    assert common.spread([1.0, 2.0, 3.0, 4.0, 5.0]) == (3.0, 2.0, 4.0)
    assert common.per_round_ratio([[2.0, 4.0], [3.0]], [[1.0, 2.0], [3.0]]) == (1.5, 1.25, 1.75)
    assert common.table("name | value:", ["| a | 1 |"]) == "| name | value |\n|---|---:|\n| a | 1 |"


def test_training_flops_count_forward_and_the_backward_that_runs():
    # A matmul's forward is 2 FLOPs per weight; backward is 2 more for the weight's
    # gradient and 2 for the input's, except on the first layer, whose input (the
    # images) needs no gradient.
    model = torch.nn.Sequential(torch.nn.Linear(24, 16, bias=False), torch.nn.Linear(16, 10, bias=False))
    images, labels = torch.randn(5, 24), torch.randint(10, (5,))
    assert training_flops_per_image(model, images, labels) == 4 * 24 * 16 + 6 * 16 * 10


@pytest.mark.parametrize("first", ["engine", "bare"])
def test_engine_overhead_loops_take_turns_step_by_step(first):
    # The engine side draws micro-batches from TakingTurns as the engine does (one window
    # of `accumulation` per optimizer step); the bare side takes and gives the turn around
    # each of its steps in the worker thread, as bare_steps does.
    steps, accumulation, order = 3, 2, []
    turns = Turns(first)
    loader = TakingTurns([(torch.zeros(1), torch.zeros(1))] * 2, 10, accumulation, turns)

    def bare():
        for step in range(steps):
            turns.take("bare")
            order.append(("bare", step))
            turns.give("bare", to="engine")

    done = bare_worker().submit(bare)
    turns.take("engine")
    batches = iter(loader)
    for step in range(steps):
        for _ in range(accumulation):
            next(batches)
        order.append(("engine", step))
    turns.give("engine", to="bare")
    done.result(timeout=30)
    sides = ["engine", "bare"] if first == "engine" else ["bare", "engine"]
    assert order == [(side, step) for step in range(steps) for side in sides]
    assert turns.seconds["engine"] >= 0 and turns.seconds["bare"] >= 0


@pytest.mark.slow
def test_engine_overhead_runs():
    out = run_script("bench/engine_overhead.py", "--rounds", "1", "--steps", "2", "--micro", "8", "--accumulation", "2", "--depth", "1")
    ratio(out, "engine / bare")


@pytest.mark.slow
def test_mfu_runs():
    out = run_script(
        "bench/mfu.py", "--rounds", "1", "--steps", "1", "--micro", "8", "--accumulation", "1", "--depth", "1", "--matmul", "256"
    )
    assert ratio(out, "MFU = training FLOP/s / matmul FLOP/s") < 1.5


@pytest.mark.slow
def test_timm_train_runs():
    out = run_script(
        "bench/timm_train.py", "--images", "32", "--batch", "8", "--epochs", "2", "--rounds", "1", "--depth", "1", "--image-size", "32"
    )
    ratio(out, "largebatch / timm")


def test_lars_step_matches_timms_lars_and_pairs_blocks_in_alternating_order():
    from bench import lamb_step, lars_step

    calls = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def step(self):
            calls.append(self.name)

    times = lamb_step.time_steps([lambda ps: Recorder("a"), lambda ps: Recorder("b")], [], steps=2, rounds=3)
    assert [len(side) for side in times] == [3, 3]
    blocks = [calls[i] for i in range(0, len(calls), 3)]  # one untimed + 2 timed steps a block
    assert blocks == ["a", "b", "b", "a", "a", "b"]  # the order alternates between rounds
    torch.manual_seed(0)
    params = [torch.randn(8, 4), torch.randn(8), torch.randn(3, 8)]
    grads = [[torch.randn_like(p) * 1e-2 for p in params] for _ in range(3)]
    ours = lamb_step.update_after(lars_step.ours, params, grads)
    timms = lamb_step.update_after(lars_step.timm_lars, params, grads)
    assert lamb_step.max_difference(ours, timms) < 1e-6 and max(u.abs().max().item() for u in ours) > 1e-4


@pytest.mark.slow
@pytest.mark.dist
def test_sharded_memory_runs_every_side():
    out = run_script("bench/sharded_memory.py", "--model", "vit_tiny_patch16_224", "--steps", "1")
    rows = [line for line in out.splitlines() if line.startswith("| ") and "MiB" not in line]
    assert [r.split(" | ")[0] for r in rows] == ["| ddp", "| ddp again (A/A control)", "| fsdp", "| fsdp, dist.reduce_every_micro_batch"]
    ratios = [float(r.split(" | ")[2]) for r in rows]
    assert ratios[0] == 1.0 and ratios[2] < 1.0  # sharding holds less per rank even for a small model


@pytest.mark.slow
@pytest.mark.dist
def test_async_checkpoint_runs_every_side():
    out = run_script("bench/async_checkpoint.py", "--model", "vit_tiny_patch16_224", "--rounds", "1", "--steps", "5")
    rows = [line.split(" | ")[1] for line in out.splitlines() if line.startswith("| 1 |")]
    assert rows == ["sync", "async", "sync again"], out
    for name in ("async / sync later saves", "A/A sync again / sync later saves", "async / sync step"):
        ratio(out, name)


@pytest.mark.slow
def test_startup_times_every_command_and_another_checkout():
    out = run_script("bench/startup.py", "--rounds", "1", "--against", str(REPO))
    for row in ("config show / import torch, timm", "A/A: config show again / config show", f"largebatch --help: {REPO.name} / this tree"):
        assert f"| {row} |" in out, out


def test_convert_bench_times_every_job_with_an_aa_control():
    out = run_script("bench/convert.py", "--images", "24", "--rounds", "1", "--workers", "2", "--jobs", "folder", "verify")
    for job in ("convert folder", "verify (decode)"):
        match = re.search(rf"{re.escape(job)}: 1 worker / 2 workers = ([0-9.]+) \(A/A 1 worker / 1 worker = ([0-9.]+)\)", out)
        assert match and all(float(value) > 0 for value in match.groups()), out
    assert "fashion-mnist" not in out


@pytest.mark.slow
def test_lars_step_runs():
    out = run_script("bench/lars_step.py", "--model", "vit_tiny_patch16_224", "--steps", "1", "--rounds", "2", "--compare-steps", "1")
    assert "A/A control: ours vs ours" in out and "Lars |" in out


def run_suite(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """``python -m bench ARGS`` from the repository root, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow
def test_the_whole_quick_suite_runs_every_benchmark(tmp_path):
    # make bench-quick; every section must run to its end (a section that fails makes the
    # suite end with status 1, naming it).
    from bench.__main__ import BENCHES

    out = tmp_path / "suite.md"
    proc = run_suite("--quick", "--out", str(out), timeout=3600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    report = out.read_text()
    rows = [line.split(" | ")[0].removeprefix("| ") for line in report.splitlines() if line.startswith("| ") and line.endswith(" |")]
    assert set(BENCHES) <= set(rows) and "failed" not in report, report
    assert "Machine:" in report and "engine / bare = " in report and "MFU = " in report and "native (TFRecord)" in report


def test_the_suite_fails_when_one_benchmark_fails(tmp_path):
    proc = run_suite("--quick", "--only", "startup", "--args", "startup=--no-such-flag", "--out", str(tmp_path / "suite.md"), timeout=300)
    assert proc.returncode == 1 and "bench: startup failed (status 2)" in proc.stdout
    assert proc.stdout.splitlines()[-1].endswith("; failed: startup")
    assert "| startup | failed, status 2 |" in (tmp_path / "suite.md").read_text()


class _Busy(torch.utils.data.Dataset):
    """Each item burns about 30 ms of CPU in whichever process loads it."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index):
        end = time.process_time() + 0.03
        while time.process_time() < end:
            pass
        return torch.zeros(1, 3), 0


def test_loader_bench_counts_worker_cpu_and_gives_the_main_process_apart():
    from bench import loaders

    loader = torch.utils.data.DataLoader(_Busy(), batch_size=None, num_workers=1)
    _, total_ms, main_ms = loaders.time_epoch(loader, 0)
    assert total_ms >= 25  # per image: the worker's busy loop is counted
    assert main_ms < total_ms / 3  # and it is not the main process's


def test_loader_bench_decode_share_of_all_host_side_and_workers():
    from bench import loaders

    rows = loaders.decode_share({loaders.DECODE_STEP: 0.6, loaders.DEVICE_STEP: 0.05}, total=1.0, in_main=0.1).splitlines()
    shares = [re.search(r"\| ([0-9.]+) \| (\d+)% \|$", row).groups() for row in rows if row.endswith("% |")]
    assert shares == [("1.00", "60"), ("0.95", "63"), ("0.90", "67")]
