"""The accelerator suite (``python -m bench --device cuda|hpu``): on a machine without the
device it refuses in one line; its CPU stand-in runs every section that applies.

Nothing here runs on a GPU or a Gaudi: the cuda and hpu paths of each section are
exercised only where the suite itself is run on one.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from bench import accelerator
from bench.accelerator_sections import pytest_counts
from tests.conftest import REPO, clean_env

HAS_HABANA = importlib.util.find_spec("habana_frameworks") is not None
HAS_DALI = importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None


def run_bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_without_a_gpu_is_one_error_line_and_status_2(tmp_path):
    proc = run_bench("--device", "cuda", "--out", str(tmp_path / "r.md"))
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no GPU found: torch.cuda.is_available() is False (torch ")
    assert not (tmp_path / "r.md").exists()


@pytest.mark.skipif(HAS_HABANA, reason="habana_frameworks is importable here")
def test_hpu_without_habana_is_one_error_line_and_status_2(tmp_path):
    proc = run_bench("--device", "hpu", "--out", str(tmp_path / "r.md"))
    assert proc.returncode == 2
    assert proc.stdout == "" and proc.stderr.strip() == "error: no Gaudi found: habana_frameworks is not installed"
    assert not (tmp_path / "r.md").exists()


def test_report_paths():
    assert accelerator.report_path("cuda", "NVIDIA H100 80GB HBM3") == REPO / "bench/results/gpu-nvidia-h100-80gb-hbm3.md"
    assert accelerator.report_path("hpu", "GAUDI2") == REPO / "bench/results/hpu-gaudi2.md"
    assert accelerator.report_path("cpu", "anything").parent == REPO / "bench/.cache"


def test_pytest_counts_from_the_summary_line():
    assert pytest_counts("....\n3 passed, 1 failed, 2 skipped, 40 deselected, 1 error in 2.10s") == {
        "passed": 3,
        "failed": 1,
        "skipped": 2,
        "deselected": 40,
        "errors": 1,
    }
    assert pytest_counts("no tests ran in 0.01s")["passed"] == 0


def test_a_failing_section_is_reported_and_the_others_still_run(monkeypatch, tmp_path):
    ran = []

    def fake_section(name, device, quick):
        ran.append(name)
        if name == "train":
            return "python bench/accelerator_sections.py train", 1, "boom", 0.5
        if name == "distributed":
            return "python bench/accelerator_sections.py distributed", 0, "skipped: one device", 0.1
        return f"python bench/accelerator_sections.py {name}", 0, "| a | b |\n|---|---|\n| 1 | 2 |", 0.1

    monkeypatch.setattr(accelerator, "run_section", fake_section)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "report.md"
    assert accelerator.main(["--device", "cpu", "--quick", "--out", str(out)]) == 1
    assert ran == accelerator.SECTIONS
    report = out.read_text()
    assert f"| {accelerator.TITLES['train']} | failed, status 1 |" in report
    assert f"| {accelerator.TITLES['distributed']} | skipped |" in report
    assert f"| {accelerator.TITLES['lamb']} | ran |" in report
    assert "Machine: " in report and "`python bench/accelerator_sections.py lamb`" in report


@pytest.mark.slow
@pytest.mark.dali
@pytest.mark.skipif(not HAS_DALI, reason="NVIDIA DALI not importable (pip install -e .[dali])")
def test_cpu_stand_in_runs_every_section_that_applies(tmp_path):
    out = tmp_path / "report.md"
    proc = run_bench("--device", "cpu", "--quick", "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = out.read_text()
    for section in accelerator.SECTIONS:
        assert f"## {accelerator.TITLES[section]}" in report
    assert "| passed | failed | skipped | deselected | errors |" in report  # a
    assert "| largebatch engine, fp32, TF32 off |" in report and "| timm train.py loop, bf16 autocast |" in report  # b
    assert "largebatch / timm (bf16) = " in report and "A/A control: engine bf16 second run / first = " in report
    assert "bf16 + compile=True: skipped: " in report and "fp32 with TF32: skipped: " in report
    assert "| DALI CPU pipeline from TFRecord shards |" in report and "loader / synthetic = " in report  # c
    assert "| DALI CPU pipeline |" in report  # d
    assert "largebatch Lamb / floor = " in report and "| floor: torch.optim.AdamW(fused=True) |" in report  # e
    assert "skipped: the CPU stand-in has no devices to spread over" in report  # f
    assert "| Fashion-MNIST demo on one cpu device |" in report or "skipped: data/fashion-mnist is absent" in report  # g
    assert "failed, status" not in report


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_distributed_worker_runs_under_torchrun_on_cpu_ranks(strategy, tmp_path):
    # Section f's worker, which the suite starts only with two or more accelerators: here
    # two CPU ranks (gloo) under torchrun, at the stand-in's sizes.
    cmd = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "bench/accelerator_sections.py", "distributed-worker"]
    cmd += ["--device", "cpu", "--strategy", strategy, "--out", str(tmp_path), "--quick"]
    proc = subprocess.run([sys.executable, *cmd], cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads((tmp_path / f"{strategy}-rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["rank"] for r in records] == [0, 1]
    assert all(r["images_per_s"] > 0 and r["peak_bytes"] is None for r in records)  # no device memory on the CPU
