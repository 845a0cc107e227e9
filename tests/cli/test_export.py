"""Run outputs timm loads: the run directory and ``largebatch export``, against the run's own model."""

from __future__ import annotations

import json

import pytest
import timm
import torch
import yaml
from safetensors.torch import load_file

from tests.conftest import model_of, run_cli, tiny_config, write_config
from tests.data.conftest import fmnist_shards  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow  # one real training run on Fashion-MNIST shards

FMNIST_DATA = {
    "loader": "native",
    "image_size": 28,
    "channels": 1,
    "num_classes": 10,
    "mean": [0.286],
    "std": [0.353],
    "scale": [0.5, 1.0],
    "eval_crop_ratio": 0.875,
    "num_workers": 0,
}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, fmnist_shards):  # noqa: F811 - the fixture
    work = tmp_path_factory.mktemp("export")
    cfg = tiny_config(data={**FMNIST_DATA, "root": str(fmnist_shards)})
    cfg["model"].update(patch_size=7)
    cfg["eval"] = {"interval_epochs": 0, "at_end": True}
    result = run_cli("train", "--config", str(write_config(work, cfg)), "--run-dir", str(work / "run"))
    assert result.returncode == 0, result.stderr
    return work / "run"


def reference_model(run_dir):
    """The model as largebatch builds it, with the run's final weights."""
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    model = model_of(cfg)
    model.load_state_dict(load_file(str(run_dir / "model.safetensors")))
    return model.eval()


def assert_loads_as_the_run(folder, run_dir):
    loaded = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    x = torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(x), reference_model(run_dir)(x))
    assert timm.data.resolve_data_config({}, model=loaded) == {
        "input_size": (1, 28, 28),
        "interpolation": "bilinear",
        "mean": [0.286],
        "std": [0.353],
        "crop_pct": 0.875,
        "crop_mode": "center",
    }


def test_run_directory_loads_in_timm(finished_run):
    assert_loads_as_the_run(finished_run, finished_run)
    hub = json.loads((finished_run / "config.json").read_text())
    assert hub["architecture"] == "vit_tiny_patch16_224" and hub["num_classes"] == 10
    assert hub["label_names"][:2] == ["T-shirt/top", "Trouser"]  # from the shards' dataset.json
    assert not {"tag", "license", "hf_hub_id"} & set(hub["pretrained_cfg"])  # timm's published weights' fields


def test_export_writes_a_folder_timm_loads(finished_run, tmp_path):
    result = run_cli("export", str(finished_run), "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert_loads_as_the_run(tmp_path / "out", finished_run)


def test_config_json_alone_rebuilds_the_trained_model(finished_run):
    # Only config.json: its architecture and model_args, through timm's public create_model,
    # give the trained shapes (patch 7 on 28 px, 1 channel, width 32), not the registered
    # vit_tiny_patch16_224's; with the weights loaded, the run's outputs.
    hub = json.loads((finished_run / "config.json").read_text())
    rebuilt = timm.create_model(hub["architecture"], pretrained=False, **hub["model_args"]).eval()
    reference = reference_model(finished_run)
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {k: v.shape for k, v in reference.state_dict().items()}
    assert rebuilt.patch_embed.proj.weight.shape == (32, 1, 7, 7)
    rebuilt.load_state_dict(load_file(str(finished_run / "model.safetensors")))
    x = torch.randn(2, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(rebuilt(x), reference(x))


def test_the_model_card_holds_the_hubs_front_matter_and_the_runs_summary(finished_run, tmp_path):
    run_cli("export", str(finished_run), "--out", str(tmp_path / "out"))
    card = (tmp_path / "out" / "README.md").read_text()
    _, front, body = card.split("---\n", 2)
    meta = yaml.safe_load(front)
    assert meta["library_name"] == "timm" and meta["pipeline_tag"] == "image-classification"
    assert "timm" in meta["tags"] and meta["datasets"] == ["fashion-mnist"]  # the shards' dataset.json source
    last_eval = [r for r in map(json.loads, (finished_run / "metrics.jsonl").read_text().splitlines()) if "eval/top1" in r][-1]
    (result,) = meta["model-index"][0]["results"]
    top1 = next(m for m in result["metrics"] if m["name"] == "top-1 accuracy")
    assert top1["value"] == round(100 * last_eval["eval/top1"], 2) and result["dataset"]["split"] == "validation"
    derived = yaml.safe_load((finished_run / "config.yaml").read_text())["derived"]
    assert f"| steps | {derived['total_steps']} (1 epochs) |" in body
    assert "`vit_tiny_patch16_224` with `patch_size=7, embed_dim=32, depth=1" in body
    assert 'timm.create_model("local-dir:' in body


def test_export_of_an_unfinished_run_is_one_error_line(finished_run, tmp_path):
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.yaml").write_text((finished_run / "config.yaml").read_text())
    result = run_cli("export", str(unfinished), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "has no model.safetensors" in result.stderr and "--resume auto" in result.stderr
    assert not (tmp_path / "out").exists()
    result = run_cli("export", str(tmp_path), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "not a run directory" in result.stderr


def test_export_replaces_files_only_with_force(finished_run, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("my own notes")
    (out / "config.json").write_text("{}")
    result = run_cli("export", str(finished_run), "--out", str(out))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "already holds config.json, README.md" in result.stderr and "--force" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json"]
    assert (out / "README.md").read_text() == "my own notes" and (out / "config.json").read_text() == "{}"
    target = tmp_path / "elsewhere.safetensors"
    target.write_text("not to be written through")
    (out / "model.safetensors").symlink_to(target)
    result = run_cli("export", str(finished_run), "--out", str(out), "--force")
    assert result.returncode == 0, result.stderr
    assert_loads_as_the_run(out, finished_run)
    assert not (out / "model.safetensors").is_symlink() and target.read_text() == "not to be written through"


def copy_of(run_dir, to):
    import shutil

    shutil.copytree(run_dir, to, ignore=shutil.ignore_patterns("checkpoints"))
    return to


def test_export_goes_on_past_a_cut_last_metrics_line(finished_run, tmp_path):
    run = copy_of(finished_run, tmp_path / "run")
    with open(run / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 9, "eval/to')  # killed mid-write
    result = run_cli("export", str(run), "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert "the last, was cut short" in result.stderr
    assert "top-1 accuracy" in (tmp_path / "out" / "README.md").read_text()
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines.insert(1, "not json")
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    result = run_cli("export", str(run), "--out", str(tmp_path / "out2"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "metrics.jsonl: line 2 is not JSON" in result.stderr


@pytest.mark.parametrize("header", [(1 << 40).to_bytes(8, "little") + b"{}", (12).to_bytes(8, "little") + b"{not json}  "])
def test_export_of_a_malformed_weights_header_is_one_error_line(finished_run, tmp_path, header):
    run = copy_of(finished_run, tmp_path / "run")
    (run / "model.safetensors").write_bytes(header)
    result = run_cli("export", str(run), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "model.safetensors: not a readable safetensors file" in result.stderr and "Traceback" not in result.stderr
