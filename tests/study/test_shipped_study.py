"""The shipped Fashion-MNIST study: `largebatch study run` on its study file, from the
repository root, finds every trial in its storage done and writes the published report
again, word for word."""

from __future__ import annotations

import pathlib
import shutil

import pytest

from largebatch.shards import FASHION_MNIST_DIR, convert
from tests.conftest import REPO
from tests.study.helpers import study_cli

SHIPPED = REPO / "studies" / "fashion-mnist"


@pytest.mark.slow
def test_the_shipped_study_reproduces_its_published_report_from_its_storage(tmp_path):
    if not (pathlib.Path(FASHION_MNIST_DIR) / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"Fashion-MNIST not installed at {FASHION_MNIST_DIR} (apt-get install dataset-fashion-mnist)")
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


def test_the_16k_studys_longest_budgets_are_at_least_twice_the_first_studys_fit_at_every_batch():
    """studies/fashion-mnist-16k scales its epoch range by the first study's fits (the
    pilot): at every batch its longest run, in steps, is at least twice the steps those fits
    predict to 78%, with 16 trials per cell (8 quasi-random), 3 seeds and 1 thread."""
    import json
    import math

    from largebatch.study.spec import load_study

    spec = load_study(REPO / "studies" / "fashion-mnist-16k" / "study.py")
    fits = {o["optimizer"]: o["fit"] for o in json.loads((SHIPPED / "report.json").read_text())["optimizers"]}
    train_images = 7 * 7500  # the 8 training shards of 7,500 images less the carved held-out one
    assert max(spec.batches) == 16384 and spec.trials >= 16 and spec.quasi_random < spec.trials and len(spec.seeds) >= 3
    assert spec.threads == 1 and [t.value for t in spec.targets] == [0.78, 0.80]
    for opt in spec.optimizers:
        fit, epochs = fits[opt.label], next(p for p in opt.space if p.name == "epochs")
        assert spec.pilot[opt.label].b_crit == pytest.approx(fit["b_crit"], rel=1e-3)
        for batch in spec.batches:
            longest = math.floor(epochs.bounds(batch, min(spec.batches))[1]) * (train_images // batch)
            assert longest >= 2 * fit["s_min"] * (1 + fit["b_crit"] / batch), (opt.label, batch, longest)


@pytest.mark.parametrize(
    ("name", "drawn"),
    [
        ("fashion-mnist-16k", ["noise_scale.png", "steps_vs_batch.png", "steps_vs_samples.png"]),
        ("fashion-mnist-cbs", ["critical_batch.png"]),
        ("fashion-mnist-adaptive", ["arms.png"]),
    ],
    ids=["cells", "branches", "arms"],
)
def test_a_shipped_study_reproduces_its_report_from_its_storage_alone(tmp_path, name, drawn):
    """studies/fashion-mnist-16k, -cbs and -adaptive: `study report` on a copy of the study
    file and storage, without the runs or the data (every trial's curve and crossings,
    every branch's and arm's result, the source's B_simple and the arms' logged batches are
    kept in the storage), writes the published report again, word for word (its bootstrap
    seeded), and draws its figures."""
    shipped = REPO / "studies" / name
    folder = tmp_path / "studies" / name
    folder.mkdir(parents=True)
    for file in ("study.py", "study.db"):
        shutil.copy(shipped / file, folder / file)
    (tmp_path / "configs").symlink_to(REPO / "configs")
    result = study_cli("report", f"studies/{name}/study.py", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for file in ("report.md", "report.json"):
        assert (folder / file).read_text() == (shipped / file).read_text(), file
    assert sorted(p.name for p in folder.glob("*.png")) == drawn
    assert set(drawn) <= {p.name for p in shipped.glob("*.png")}
