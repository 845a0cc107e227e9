"""The shipped Fashion-MNIST study: `largebatch study run` on its study file, from the
repository root, finds every trial in its storage done and writes the published report
again, word for word."""

from __future__ import annotations

import pathlib
import shutil

import pytest

from largebatch.data import convert
from tests.conftest import REPO
from tests.study.helpers import study_cli

SHIPPED = REPO / "studies" / "fashion-mnist"


@pytest.mark.slow
def test_the_shipped_study_reproduces_its_published_report_from_its_storage(tmp_path):
    if not (pathlib.Path(convert.FASHION_MNIST_DIR) / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"Fashion-MNIST not installed at {convert.FASHION_MNIST_DIR} (apt-get install dataset-fashion-mnist)")
    # A copy of the repository's layout: the study folder without its report, the configs,
    # and data/fashion-mnist in the demo's 8 + 2 shards (enough records for the largest batch; no trial runs).
    folder = tmp_path / "studies" / "fashion-mnist"
    shutil.copytree(SHIPPED, folder, ignore=shutil.ignore_patterns("report.*", "*.png", "data"))
    (tmp_path / "configs").symlink_to(REPO / "configs")
    convert.convert_fashion_mnist(tmp_path / "data" / "fashion-mnist", limit=9600, progress=False)
    stored = (folder / "study.db").read_bytes()
    result = study_cli("run", "studies/fashion-mnist/study.py", "--jobs", "2", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (folder / "study.db").read_bytes() == stored  # no trial ran: every one is in the storage
    for name in ("report.md", "report.json"):
        assert (folder / name).read_text() == (SHIPPED / name).read_text(), name
    assert sorted(p.name for p in folder.glob("*.png")) == sorted(p.name for p in SHIPPED.glob("*.png"))
