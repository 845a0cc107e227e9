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
import time

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

    def fake_section(name, device, quick, **_):
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


def test_a_spent_budget_leaves_the_remaining_sections_not_run(monkeypatch, tmp_path):
    ran, timeouts = [], []

    def slow_section(name, device, quick, timeout, log=None):
        ran.append(name)
        timeouts.append(timeout)
        time.sleep(1.2)
        return f"python bench/accelerator_sections.py {name}", 0, "| a |\n|---|\n| 1 |", 1.2

    monkeypatch.setattr(accelerator, "run_section", slow_section)
    out = tmp_path / "report.md"
    assert accelerator.main(["--device", "cpu", "--quick", "--budget", "3", "--out", str(out)]) == 0
    assert ran == accelerator.SECTIONS[:2] and 2.5 < timeouts[0] <= 3 and timeouts[1] <= 1.8
    report = out.read_text()
    assert "`python -m bench --device cpu --quick --budget 3`" in report
    assert f"| {accelerator.TITLES['tests']} | ran |" in report
    for section in accelerator.SECTIONS[2:]:
        assert f"| {accelerator.TITLES[section]} | not run: the --budget was spent |" in report
    assert "not run: the budget of 3 s was spent before it" in report


def test_a_section_past_its_time_is_stopped_and_logged(tmp_path):
    log = tmp_path / "sections.log"
    cmd, status, output, seconds = accelerator.run_section("lamb", "cpu", True, timeout=0.3, log=log)
    assert status == accelerator.TIMED_OUT and seconds < 30
    assert accelerator.section_status(status, output) == "stopped at the --budget"
    assert "stopped after 0 s (the section's share of --budget)" in output
    logged = log.read_text()
    assert logged.startswith("===== lamb: `") and "status 124" in logged and "--- stderr" in logged


def test_budget_must_be_positive(capsys):
    with pytest.raises(SystemExit) as exc:
        accelerator.main(["--device", "cpu", "--budget", "0"])
    assert exc.value.code == 2 and "--budget 0: give a number of seconds above 0" in capsys.readouterr().err


def gpu_check(out, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    """``bash scripts/gpu-check.sh OUT ARGS`` with this Python, its wheels into a scratch site."""
    extra = {"PYTHON": sys.executable, "GPU_CHECK_SITE": str(out.parent / "site"), **env}
    return subprocess.run(
        ["bash", "scripts/gpu-check.sh", str(out), *args], cwd=REPO, env=clean_env(**extra), capture_output=True, text=True, timeout=timeout
    )


def probe_wheel(folder) -> None:
    """A pure-Python wheel made by hand (no network, no build): module ``lbprobe``."""
    import zipfile

    folder.mkdir(parents=True)
    files = {
        "lbprobe/__init__.py": "VALUE = 42\n",
        "lbprobe-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: lbprobe\nVersion: 0.1\n",
        "lbprobe-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + "lbprobe-0.1.dist-info/RECORD,,\n"
    with zipfile.ZipFile(folder / "lbprobe-0.1-py3-none-any.whl", "w") as wheel:
        for name, text in {**files, "lbprobe-0.1.dist-info/RECORD": record}.items():
            wheel.writestr(name, text)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_gpu_check_installs_the_carried_wheels_then_stops_with_the_suites_refusal_without_a_gpu(tmp_path):
    probe_wheel(tmp_path / "carry" / "wheels")
    proc = gpu_check(tmp_path / "out", GPU_CARRY_DIR=str(tmp_path / "carry"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: no GPU found: torch.cuda.is_available() is False")
    assert (tmp_path / "site" / "lbprobe" / "__init__.py").read_text() == "VALUE = 42\n"
    env = (tmp_path / "out" / "env.txt").read_text()
    assert f"torch: {torch.__version__}" in env and "largebatch: " in env and "nvidia-smi: " in env
    assert not (tmp_path / "out" / "report.md").exists()


def test_gpu_check_names_wheels_that_do_not_install(tmp_path):
    (tmp_path / "carry" / "wheels").mkdir(parents=True)
    (tmp_path / "carry" / "wheels" / "broken-0.1-py3-none-any.whl").write_bytes(b"not a zip")
    proc = gpu_check(tmp_path / "out", GPU_CARRY_DIR=str(tmp_path / "carry"))
    assert proc.returncode == 2
    assert f"error: the wheels in {tmp_path / 'carry'}/wheels do not install into {tmp_path / 'site'} with {sys.executable}" in proc.stderr


@pytest.mark.slow
@pytest.mark.dali
@pytest.mark.skipif(not HAS_DALI, reason="NVIDIA DALI not importable (pip install -e .[dali])")
def test_gpu_pack_then_check_rehearse_every_section_on_the_cpu(tmp_path):
    # The GPU machine's visit rehearsed here: wheels for this Python downloaded from PyPI
    # (as CI's install does) and Debian's Fashion-MNIST, then the check with the suite's
    # CPU stand-in (`python -m bench --device cpu --quick`), wheels installed into a target.
    carry = tmp_path / "carry"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    pack = subprocess.run(
        ["bash", "scripts/gpu-pack.sh"],
        cwd=REPO,
        env=clean_env(GPU_CARRY_DIR=str(carry), GPU_PYTHON_VERSION=version, PIP=f"{sys.executable} -m pip"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert pack.returncode == 0, pack.stdout + pack.stderr
    wheels = sorted(p.name.split("-")[0] for p in (carry / "wheels").glob("*.whl"))
    assert wheels == ["crc32c", "simplejpeg", "timm"]
    assert len(list((carry / "fashion-mnist").glob("*-ubyte.gz"))) == 4
    out = tmp_path / "out"
    proc = gpu_check(out, "900", timeout=900, GPU_CARRY_DIR=str(carry), GPU_CHECK_DEVICE="cpu")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "timm: 1.0.31" in (out / "env.txt").read_text()
    assert (tmp_path / "site" / "simplejpeg").is_dir()
    assert "===== lamb: `" in (out / "sections.log").read_text()
    report = (out / "report.md").read_text()
    assert "with `python -m bench --device cpu --quick --budget 900`" in report
    for section in accelerator.SECTIONS:
        assert f"## {accelerator.TITLES[section]}" in report
    assert "| passed | failed | skipped | deselected | errors |" in report  # a
    assert "largebatch Lamb / floor = " in report and "| floor: torch.optim.AdamW(fused=True) |" in report  # b
    assert "| largebatch engine, fp32, TF32 off |" in report and "| timm train.py loop, bf16 autocast |" in report  # c
    assert "largebatch / timm (bf16) = " in report and "A/A control: engine bf16 second run / first = " in report
    assert "bf16 + compile, mode max-autotune: skipped: " in report and "fp32 with TF32: skipped: " in report
    assert "| largebatch engine, bf16, fused AdamW (nan_guard read a step late) |" in report
    assert "fused AdamW: nan_guard on / off = " in report and "flash attention: yes (1 attention modules" in report
    assert "| largebatch engine, bf16, LAMB (nan_guard read a step late) |" in report and "LAMB: nan_guard on / off = " in report
    assert "| DALI CPU pipeline |" in report and "| native loader (worker processes decode" in report  # d
    assert "| DALI CPU pipeline from TFRecord shards |" in report and "loader / synthetic = " in report  # e
    assert "| native loader (worker processes decode; normalised in the main process), data.decode='cpu' from TFRecord shards |" in report
    assert "| native loader, data.decode='device' (workers read; the device decodes" in report
    assert "pixels, device against cpu decode: max " in report and "| data.decode | images/s (median epoch) | / first cpu run |" in report
    assert "skipped: the CPU stand-in has no devices to spread over" in report  # f
    assert "| Fashion-MNIST demo on one cpu device |" in report  # g
    assert "| largebatch engine, bf16, nan_guard off |" in report and "the ops that took the most CPU time" in report  # h
    assert "failed, status" not in report and "not run" not in report


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
