"""Fine-tuning: model.init_from and model.pretrained, against the weights that were saved."""

from __future__ import annotations

import re
import subprocess

import pytest
import torch
from safetensors.torch import load_file

from largebatch import checkpoint as ckpt
from largebatch.errors import ConfigError
from largebatch.export import export_run
from tests.conftest import PYTHON, REPO, clean_env, load_and_validate, model_of, run_cli, tiny_config, write_config
from tests.data.conftest import fmnist_shards  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow  # training runs through the CLI


@pytest.fixture(scope="module")
def pretrained_run(tmp_path_factory):
    """A finished 4-class run with a checkpoint and its final weights."""
    work = tmp_path_factory.mktemp("pretrain")
    cfg = tiny_config(checkpoint={"interval_epochs": 1, "at_end": True})
    result = run_cli("train", "--config", str(write_config(work, cfg)), "--run-dir", str(work / "run-1"))
    assert result.returncode == 0, result.stderr
    return work / "run-1"


def fine_tune_config(tmp_path, init_from, **overrides):
    cfg = tiny_config(**{"model.init_from": str(init_from), **overrides})
    return load_and_validate(str(write_config(tmp_path, cfg)), [])


def assert_starts_from(model, saved, *, except_prefixes=()):
    state = model.state_dict()
    assert state.keys() == saved.keys()
    for key, value in saved.items():
        if key.startswith(except_prefixes):
            continue
        assert torch.equal(state[key], value), key


def test_each_kind_of_source_gives_the_saved_weights(pretrained_run, tmp_path):
    saved = load_file(str(pretrained_run / "model.safetensors"))
    export = export_run(pretrained_run, tmp_path / "export")
    sources = [
        pretrained_run,  # a run directory
        export,  # an export folder
        pretrained_run / "model.safetensors",
        str(pretrained_run.parent / "run-*"),  # a glob: the newest finished run
    ]
    for source in sources:
        assert_starts_from(model_of(fine_tune_config(tmp_path, source), initial_weights=True), saved)
    checkpoint = ckpt.list_checkpoints(pretrained_run)[-1]  # a checkpoint's model weights
    assert_starts_from(model_of(fine_tune_config(tmp_path, checkpoint), initial_weights=True), ckpt.read_checkpoint(checkpoint)["model"])
    # without initial_weights (the meta-device and export builds) nothing is loaded
    fresh = model_of(fine_tune_config(tmp_path, pretrained_run))
    assert not torch.equal(fresh.state_dict()["blocks.0.attn.qkv.weight"], saved["blocks.0.attn.qkv.weight"])


def test_a_sharded_checkpoint_folder_gives_its_full_weights(pretrained_run, tmp_path):
    import torch.distributed.checkpoint as dcp

    saved = load_file(str(pretrained_run / "model.safetensors"))
    folder = tmp_path / "step-4"
    with pytest.warns(UserWarning, match="single process"):  # one process, no group: what DCP says
        dcp.save({"model": dict(saved), "optimizer": {}}, checkpoint_id=str(folder))
    assert (folder / ".metadata").is_file()
    assert_starts_from(model_of(fine_tune_config(tmp_path, folder), initial_weights=True), saved)


def test_other_classes_reinitialise_the_head_and_another_size_resamples_positions(pretrained_run, tmp_path):
    saved = load_file(str(pretrained_run / "model.safetensors"))
    model = model_of(fine_tune_config(tmp_path, pretrained_run, **{"data.num_classes": 3}), initial_weights=True)
    assert model.head.weight.shape == (3, 32)
    assert_starts_from(model, {k: v for k, v in saved.items() if not k.startswith("head.")} | {
        "head.weight": model.head.weight, "head.bias": model.head.bias})  # fmt: skip
    bigger = model_of(fine_tune_config(tmp_path, pretrained_run, **{"data.image_size": 24}), initial_weights=True)
    assert bigger.pos_embed.shape == (1, 1 + 36, 32) and saved["pos_embed"].shape == (1, 1 + 16, 32)
    assert torch.equal(bigger.pos_embed[0, 0], saved["pos_embed"][0, 0])  # the class token's position is kept
    assert_starts_from(bigger, saved, except_prefixes=("pos_embed",))


def test_fine_tuning_runs_end_to_end_from_the_cli(pretrained_run, tmp_path):
    cfg = tiny_config(**{"model.init_from": str(pretrained_run), "optimizer.layer_decay": 0.75, "data.num_classes": 3})
    result = run_cli("train", "--config", str(write_config(tmp_path, cfg)), "--run-dir", str(tmp_path / "fine"))
    assert result.returncode == 0, result.stderr
    assert load_file(str(tmp_path / "fine" / "model.safetensors"))["head.weight"].shape == (3, 32)


def test_bad_sources_name_the_key(pretrained_run, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="neither a run directory") as missing:
        model_of(fine_tune_config(tmp_path, tmp_path / "nowhere"), initial_weights=True)
    assert missing.value.key == "model.init_from"
    with pytest.raises(ConfigError, match="no finished run"):
        model_of(fine_tune_config(tmp_path, tmp_path / "runs-*"), initial_weights=True)
    wider = fine_tune_config(tmp_path, pretrained_run, **{"model.embed_dim": 48})
    with pytest.raises(ConfigError, match="do not fit") as misfit:
        model_of(wider, initial_weights=True)
    assert misfit.value.key == "model.init_from"
    # timm's published weights, with the Hub unreachable and an empty cache: one clear error
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ConfigError, match="published weights") as offline:
        model_of(load_and_validate(str(write_config(tmp_path, tiny_config(**{"model.pretrained": True}))), []), initial_weights=True)
    assert offline.value.key == "model.pretrained"


def test_the_shipped_fine_tune_config_starts_from_the_run_the_readmes_first_command_writes(tmp_path, fmnist_shards):  # noqa: F811
    """scripts/setup.sh's demo command, then the shipped fine-tune config, from one folder
    (shortened to two steps on a small shard set): it finds the demo's run, trains without
    timm's channel warning; with no run there, the error names ``--set model.init_from``."""
    demo_config, demo_dir = re.search(r"train\.py --config (\S+) --run-dir (\S+)", (REPO / "scripts/setup.sh").read_text()).groups()
    small = [f"data.root={fmnist_shards}", "global_batch_size=32", "micro_batch_size=16", "max_steps=2", "eval.at_end=false"]
    small += ["eval.interval_epochs=0", "checkpoint.interval_epochs=0", "data.num_workers=0"]
    sets = [arg for value in small for arg in ("--set", value)]

    def train(config: str, run_dir: str) -> subprocess.CompletedProcess:
        cmd = [PYTHON, str(REPO / "train.py"), "--config", str(REPO / config), "--run-dir", run_dir, *sets]
        return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=clean_env())

    assert train(demo_config, demo_dir).returncode == 0
    fine = train("configs/demo/finetune-vit-tiny-fmnist.py", "runs/fine")
    assert fine.returncode == 0, fine.stderr
    assert "channel" not in fine.stdout + fine.stderr  # timm adapts no 3-channel weights
    cfg = load_and_validate(str(REPO / "configs/demo/finetune-vit-tiny-fmnist.py"))
    assert cfg["model"]["init_from"] == demo_dir

    (tmp_path / demo_dir / "model.safetensors").unlink()  # no finished demo run any more
    missing = train("configs/demo/finetune-vit-tiny-fmnist.py", "runs/fine-2")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "model.init_from" in missing.stderr and "--set model.init_from=RUN (finished runs here: runs/fine)" in missing.stderr
