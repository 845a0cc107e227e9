"""Two ranks under torchrun with every metric hook: the values that are reduced over
ranks agree with their per-device parts, and every rank took the same collectives."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import PYTHON, REPO, clean_env, tiny_config, write_config


@pytest.mark.dist
@pytest.mark.slow
def test_two_ranks_log_job_totals_and_maxima(tmp_path):
    hooks = ["memory", "trust_ratio", "csv", {"type": "checkpoint", "interval_minutes": 1e-9}, {"type": "eval", "interval_steps": 2}]
    cfg = tiny_config(**{"optimizer.type": "lamb", "clip_grad_norm": 1.0, "log.interval": 2, "hooks": hooks})
    run_dir = tmp_path / "run"
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(REPO / "train.py")]
    cmd += ["--config", str(write_config(tmp_path, cfg)), "--run-dir", str(run_dir)]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=clean_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval/top1" in r]
    assert [r["step"] for r in train] == [2, 4] and [r["step"] for r in evals] == [2, 4]
    for record in train:
        # the job's rate is the sum of the two ranks' rates: twice their mean
        assert record["samples_per_sec"] == pytest.approx(2 * record["samples_per_sec_per_device"], rel=1e-5)
        assert record["memory/host_peak_gib"] > 0
        assert {"grad_norm", "grad_norm_clipped", "trust_ratio/decay/median", "trust_ratio/lowest"} <= record.keys()
    steps = sorted(int(p.stem.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*.pt"))
    assert steps == [2, 3, 4]  # every step by the clock, the last 3 kept
