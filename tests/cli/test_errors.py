"""Each user mistake prints one ``error:`` line naming the key or file, and exits 2."""

import pytest
import torch

from largebatch.errors import UserError
from tests.conftest import run_cli, tiny_config, write_config


def assert_one_error_line(result, *fragments):
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


# The first case runs in the everyday tier (pytest -m "not slow"), the rest with the full suite.
@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        ({"optimizer.weight_decy": 0.1}, ["optimizer.weight_decy", "did you mean 'optimizer.weight_decay'"]),
        pytest.param({"epochs": "three"}, ["epochs", "expected an integer"], marks=pytest.mark.slow),
        pytest.param({"mixup.mixup_alpha": -1.0}, ["mixup.mixup_alpha", "must be >= 0"], marks=pytest.mark.slow),
        pytest.param(
            {"global_batch_size": 30},
            ["global_batch_size 30", "micro_batch_size 8", "world_size 1", "set global_batch_size to 24 or 32"],
            marks=pytest.mark.slow,
        ),
        pytest.param(
            {"lr_schedule.warmup_steps": 50},
            ["lr_schedule.warmup_steps", "warmup is 50 steps but training is 4 steps"],
            marks=pytest.mark.slow,
        ),
        pytest.param({"model.name": "vit_tiny_patch16_22"}, ["model.name", "did you mean"], marks=pytest.mark.slow),
        pytest.param({"model.drop_rte": 0.1}, ["model.drop_rte", "did you mean 'model.drop_rate'"], marks=pytest.mark.slow),
    ],
)
def test_bad_config_gives_one_error_line(tmp_path, overrides, fragments):
    path = write_config(tmp_path, tiny_config(**overrides))
    for command in (("train.py", "--config", str(path), "--run-dir", str(tmp_path / "run")), ("config", "show", str(path))):
        assert_one_error_line(run_cli(*command), *fragments)


def test_bad_override_gives_one_error_line(tmp_path):
    path = write_config(tmp_path, tiny_config())
    result = run_cli("train.py", "--config", str(path), "--set", "optimizer.lr=-1", "--run-dir", str(tmp_path / "run"))
    assert_one_error_line(result, "optimizer.lr", "must be > 0")


def test_missing_config_file(tmp_path):
    result = run_cli("train.py", "--config", str(tmp_path / "nope.py"))
    assert_one_error_line(result, "nope.py", "config file not found")


def test_debug_shows_the_traceback(tmp_path):
    result = run_cli("train.py", "--config", str(tmp_path / "nope.py"), "--debug")
    assert result.returncode == 2
    assert "Traceback" in result.stderr and "error: " in result.stderr


def test_world_size_that_does_not_divide(tmp_path):
    path = write_config(tmp_path, tiny_config())
    result = run_cli("config", "show", str(path), "--world-size", "3")
    assert_one_error_line(result, "global_batch_size 32", "world_size 3", "set global_batch_size to 24 or 48")


@pytest.mark.parametrize(
    ("hook", "fragments"),
    [
        ("loggr", ["hooks[0]", "did you mean 'logger'"]),
        ({"type": "hooks/nowhere.py:Thing"}, ["hooks[0]", "hook file 'hooks/nowhere.py' not found"]),
        ({"type": "tests/support/rank_weights.py:SaveRankWeight"}, ["hooks[0]", "did you mean 'SaveRankWeights'"]),
        ({"type": "tests/support/rank_weights.py:Hook"}, ["hooks[0]"]),
        ({"type": "tests/support/rank_weights.py:save_file"}, ["hooks[0]", "not a subclass"]),
        ({"type": "tests/support/rank_weights.py:SaveRankWeights", "colour": "red"}, ["hooks[0]", "colour"]),
        ({"type": "logger", "priority": 500}, ["hooks[0].priority", "outside 0..100"]),
    ],
)
@pytest.mark.slow
def test_bad_hook_specs(tmp_path, hook, fragments):
    path = write_config(tmp_path, tiny_config(hooks=[hook]))
    assert_one_error_line(run_cli("train.py", "--config", str(path), "--run-dir", str(tmp_path / "run")), *fragments)


def test_config_keys_lists_the_schema(tmp_path):
    result = run_cli("config", "keys", "optimizer")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("optimizer ") and "section" in lines[0]
    assert any(line.split()[:3] == ["optimizer.lr", "float", "required"] for line in lines)
    assert all(line.startswith("optimizer") for line in lines)
    everything = run_cli("config", "keys").stdout.splitlines()
    assert len(everything) > len(lines) and any(line.startswith("data.root ") for line in everything)


def test_fp16_is_refused_under_fsdp():
    from largebatch.backends.cpu import CpuBackend

    backend = CpuBackend("fp32")
    assert backend.fsdp_mixed_precision() is None
    backend.precision = "fp16"
    with pytest.raises(UserError, match="use precision 'bf16'") as err:
        backend.fsdp_mixed_precision()
    assert err.value.key == "precision"
    backend.precision = "bf16"
    policy = backend.fsdp_mixed_precision()
    assert policy.param_dtype == torch.bfloat16 and policy.reduce_dtype == torch.float32


@pytest.mark.slow
def test_a_ddp_checkpoint_is_refused_by_a_sharded_run_with_the_fix(tmp_path):
    path = write_config(tmp_path, tiny_config(**{"checkpoint.at_end": True}))
    run_dir = tmp_path / "run"
    assert run_cli("train.py", "--config", str(path), "--run-dir", str(run_dir), "--set", "max_steps=2").returncode == 0
    command = ("train.py", "--config", str(path), "--run-dir", str(run_dir), "--resume", "auto")
    # a different strategy is a config change like any other ...
    assert_one_error_line(run_cli(*command, "--set", "dist.strategy=fsdp"), "dist.strategy ('ddp' -> 'fsdp')", "--resume-ignore-config")
    # ... and accepting it still cannot turn one checkpoint format into the other
    result = run_cli(*command, "--set", "dist.strategy=fsdp", "--resume-ignore-config")
    assert_one_error_line(result, "step-00000002.pt", "this is a ddp checkpoint", "resume with the strategy it was made with")


def test_a_timm_too_old_for_config_json_is_refused_before_anything_trains(tmp_path, monkeypatch):
    # timm 1.0.29's save_config_for_hf has no data_config: a run would train, then fail
    # at the end writing config.json (seen on a GPU machine's preinstalled timm).
    import timm

    from largebatch.launch import TrainArgs, build_run

    monkeypatch.setattr(timm, "__version__", "1.0.29")
    path = write_config(tmp_path, tiny_config())
    with pytest.raises(UserError, match=r"timm 1\.0\.29 is installed; largebatch needs timm>=1\.0\.31 .*pip install 'timm>=1\.0\.31'"):
        build_run(TrainArgs(str(path), run_dir=str(tmp_path / "run")))
    assert not (tmp_path / "run").exists()


def test_the_timm_floor_is_the_one_setup_cfg_declares_and_the_installed_timm_meets_it():
    import timm

    from largebatch.export import TIMM_MINIMUM, version_tuple
    from tests.conftest import REPO

    assert f"timm>={TIMM_MINIMUM}\n" in (REPO / "setup.cfg").read_text()
    assert version_tuple(timm.__version__) >= version_tuple(TIMM_MINIMUM)
    assert version_tuple("1.0.31") == (1, 0, 31) > version_tuple("1.0.29") == (1, 0, 29)
    assert version_tuple("1.0.32.dev0") == (1, 0, 32) and version_tuple("2.1rc1+cu") == (2, 1)
