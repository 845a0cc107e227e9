"""The media-pipeline loader where it cannot run: one warning line, then the native loader.

The pipeline itself needs a Gaudi and Habana's native media modules; nothing here runs it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from largebatch.batching import BatchPlan
from largebatch.config.sections import DataConfig
from largebatch.data import build_eval_loader, build_train_loader, count_samples
from largebatch.data import mediapipe as mediapipe_loader
from largebatch.data.native import NativeLoader
from tests.data.conftest import data_cfg, write_unique_label_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("mediapipe")
    return write_unique_label_shards(root, {"train": 24, "validation": 10}, {"train": 3, "validation": 2})


@pytest.fixture(autouse=True)
def warn_again(monkeypatch):
    monkeypatch.setattr(mediapipe_loader, "_warned", False)


def plan_for(num_samples: int) -> BatchPlan:
    return BatchPlan.create(global_batch_size=8, micro_batch_size=4, world_size=1, num_samples=num_samples)


def test_on_a_cpu_the_native_loader_runs_after_one_warning_line(shards, capsys):
    cfg = data_cfg(shards, 24, loader="mediapipe")
    num = count_samples(cfg, "train")
    assert num == 24
    plan = plan_for(num)
    loader = build_train_loader(cfg, plan, rank=0, seed=3, device=torch.device("cpu"))
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("largebatch: warning: data.loader 'mediapipe' uses the native loader instead: ")
    assert "the device is cpu" in err
    assert isinstance(loader, NativeLoader)
    # The loader contract, and the native loader's very samples.
    reference = build_train_loader(data_cfg(shards, 24), plan, rank=0, seed=3, device=torch.device("cpu"))
    assert len(loader) == plan.micro_batches_per_epoch == len(reference)
    loader.set_epoch(0)
    reference.set_epoch(0)
    for (images, labels), (ref_images, ref_labels) in zip(loader, reference):
        assert images.dtype == torch.float32 and images.shape == (4, 3, 32, 32)
        assert labels.dtype == torch.int64
        assert torch.equal(labels, ref_labels) and torch.equal(images, ref_images)
    assert loader.state_dict() == {"epoch": 0, "micro_batch": len(loader)}


def test_the_warning_is_printed_once_per_process(shards, capsys):
    cfg = data_cfg(shards, 24, loader="mediapipe")
    build_train_loader(cfg, plan_for(24), rank=0, seed=0, device=torch.device("cpu"))
    evaluation = build_eval_loader(cfg, batch_size=4, rank=0, world_size=1, device=torch.device("cpu"))
    assert capsys.readouterr().err.count("warning") == 1
    labels = np.concatenate([batch[1].numpy() for batch in evaluation])
    assert labels.tolist() == list(range(10))  # every evaluation record once, in order


def test_on_an_hpu_without_habanas_media_modules_the_reason_names_them():
    try:
        import habana_frameworks.mediapipe  # noqa: F401
    except (ImportError, OSError):
        pass
    else:
        pytest.skip("Habana's media pipeline loads here")
    reason = mediapipe_loader.unavailable_reason(DataConfig(channels=3), torch.device("hpu"))
    assert reason.startswith("habana_frameworks.mediapipe does not load (")
    assert "decoder writes RGB" in mediapipe_loader.unavailable_reason(DataConfig(channels=1), torch.device("hpu"))
