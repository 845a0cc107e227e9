"""The critical-batch study's bookkeeping: evaluation steps, the tuning rule, the
choice of learning rate on the held-out split, scaling efficiency and the knee, the
data split; and a smoke run of the whole study through ``largebatch train``."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from bench import critical_batch as cb
from largebatch.config.typed import section
from largebatch.data import count_samples
from tests.bench.test_bench_scripts import run_script
from tests.conftest import REPO, load_and_validate

FMNIST = REPO / "data" / "fashion-mnist"


def study_args(**overrides) -> argparse.Namespace:
    args = cb.parse_args([])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def trial(optimizer="lamb", batch=256, lr=0.01, heldout_steps=None, test_steps=None, final=0.8, curve=None, noise=(), steps=3000):
    return {
        "optimizer": optimizer,
        "batch": batch,
        "lr": lr,
        "steps": steps,
        "curve": curve or [],
        "noise_scale": [{"step": s, "b_simple": v} for s, v in noise],
        "final_heldout": final,
        "final_test": final - 0.01,
        "steps_to_target_heldout": heldout_steps,
        "steps_to_target_test": test_steps,
        "diverged": False,
    }


def test_eval_schedule_is_geometric_distinct_and_ends_at_the_last_step():
    steps = cb.eval_schedule(100, 1.5, first=2)
    assert steps == [2, 3, 5, 7, 11, 16, 23, 35, 52, 77, 100]
    assert cb.eval_schedule(5, 1.2) == [1, 2, 3, 4, 5]  # ceil(1.2)=2, ceil(1.44)=2 only once
    assert cb.eval_schedule(1, 2.0) == [1]


def test_steps_to_target_is_the_first_evaluation_at_or_above_it():
    curve = [{"step": 10, "heldout": 0.5}, {"step": 20, "heldout": 0.85}, {"step": 30, "heldout": 0.84}, {"step": 40, "heldout": 0.9}]
    assert cb.steps_to(curve, "heldout", 0.85) == 20
    assert cb.steps_to(curve, "heldout", 0.95) is None


def test_grid_centres_on_each_optimizers_scaling_rule():
    args = study_args(initial=3, grid_factor=2.0)
    assert cb.initial_grid("lamb", 256, args) == [0.005, 0.01, 0.02]
    assert cb.initial_grid("lamb", 4096, args) == pytest.approx([0.02, 0.04, 0.08])  # sqrt(16) = 4
    assert cb.initial_grid("sgd", 4096, args) == pytest.approx([0.8, 1.6, 3.2])  # linear: 16
    assert cb.initial_grid("lars", 1024, args) == pytest.approx([2.0, 4.0, 8.0])


def test_tuning_extends_the_grid_only_while_the_best_is_at_an_edge():
    args = study_args(initial=3, max_trials=5, grid_factor=2.0)
    assert cb.next_lrs([], "lamb", 256, args) == [0.005, 0.01, 0.02]
    interior = [trial(lr=0.005, heldout_steps=900), trial(lr=0.01, heldout_steps=500, final=0.9), trial(lr=0.02, heldout_steps=700)]
    assert cb.next_lrs(interior, "lamb", 256, args) == []
    upper = [trial(lr=0.005, heldout_steps=900), trial(lr=0.01, heldout_steps=700), trial(lr=0.02, heldout_steps=500, final=0.9)]
    assert cb.next_lrs(upper, "lamb", 256, args) == [0.04]
    # steps favour the top, final accuracy the bottom: both edges, within the budget
    split = [trial(lr=0.005, final=0.9), trial(lr=0.01, final=0.85), trial(lr=0.02, heldout_steps=400, final=0.86)]
    assert cb.next_lrs(split, "lamb", 256, args) == [0.04, 0.0025]
    full = upper + [trial(lr=0.04, heldout_steps=450, final=0.9), trial(lr=0.08, heldout_steps=300, final=0.9)]
    assert cb.next_lrs(full, "lamb", 256, args) == []  # budget spent, even at an edge


def test_a_cell_where_nothing_learned_extends_below_its_smallest_rate():
    args = study_args(initial=3, max_trials=5, grid_factor=2.0)
    # the middle point is "best" by a hair, but all three sit near chance (10%)
    stuck = [trial(optimizer="sgd", batch=16384, lr=lr, final=f) for lr, f in ((3.2, 0.11), (6.4, 0.13), (12.8, 0.09))]
    assert cb.next_lrs(stuck, "sgd", 16384, args) == [1.6]
    assert cb.next_lrs(stuck + [trial(optimizer="sgd", batch=16384, lr=1.6, final=0.15)], "sgd", 16384, args) == [0.8]
    # once one trial learns, the usual edge rule takes over: 0.8 is best and at the edge
    learning = stuck + [trial(optimizer="sgd", batch=16384, lr=1.6, final=0.15), trial(optimizer="sgd", batch=16384, lr=0.8, final=0.6)]
    assert cb.next_lrs(learning, "sgd", 16384, args) == []  # five trials: the budget is spent
    diverged = [dict(trial(optimizer="sgd", batch=16384, lr=lr), diverged=True, final_heldout=None) for lr in (3.2, 6.4, 12.8)]
    assert cb.next_lrs(diverged, "sgd", 16384, args) == [1.6]


def test_learning_rate_is_chosen_on_held_out_and_efficiency_against_batch_256():
    trials = [
        # batch 256: the held-out split prefers 0.01 (it reaches the target first there),
        # although 0.02 reaches it first on the test set; the test number is only reported
        trial(batch=256, lr=0.01, heldout_steps=800, test_steps=800),
        trial(batch=256, lr=0.02, heldout_steps=900, test_steps=600),
        trial(batch=1024, lr=0.02, heldout_steps=200, test_steps=200),
        trial(batch=4096, lr=0.04, heldout_steps=100, test_steps=100),
        trial(batch=16384, lr=0.08, heldout_steps=90, test_steps=90),
        trial(optimizer="sgd", batch=256, lr=0.1, heldout_steps=None, test_steps=1000, final=0.7),
        trial(optimizer="sgd", batch=1024, lr=0.4, heldout_steps=300, test_steps=300),
    ]
    s = cb.summarise({"trials": trials})
    lamb = {b: s["cells"][("lamb", b)] for b in (256, 1024, 4096, 16384)}
    assert lamb[256]["lr_steps"] == 0.01 and lamb[256]["steps_to_target"] == 800
    assert lamb[1024]["efficiency"] == pytest.approx((800 / 200) / 4)
    assert lamb[4096]["efficiency"] == pytest.approx(0.5)  # not below 0.5
    assert lamb[16384]["efficiency"] == pytest.approx((800 / 90) / 64)
    assert lamb[16384]["samples_to_target"] == 90 * 16384
    assert s["per_optimizer"]["lamb"]["knee"] == 16384
    # a cell whose chosen trial never reaches the held-out target has no steps, so no knee
    assert s["cells"][("sgd", 256)]["steps_to_target"] is None
    assert s["per_optimizer"]["sgd"]["knee"] is None


def test_a_cell_short_of_the_target_bounds_the_efficiency_and_the_knee_says_when_it_is_undecided():
    # steps at 256: 2000. Batch 1024 stops at 600 steps short of the target: its efficiency
    # is below (2000 / 600) / 4 = 0.83, which may or may not be under 0.5. Batch 4096
    # stops at 150 steps: below (2000 / 150) / 16 = 0.83 again, still undecided. Batch
    # 16384 stops at 40 steps: below (2000 / 40) / 64 = 0.78. Nothing decides the knee.
    short = [
        trial(optimizer="sgd", batch=256, lr=0.1, heldout_steps=2000, test_steps=2000, steps=3000),
        trial(optimizer="sgd", batch=1024, lr=0.4, steps=600),
        trial(optimizer="sgd", batch=4096, lr=1.6, steps=150),
        trial(optimizer="sgd", batch=16384, lr=6.4, steps=40),
    ]
    s = cb.summarise({"trials": short})
    assert s["cells"][("sgd", 1024)]["efficiency"] is None
    assert s["cells"][("sgd", 1024)]["efficiency_below"] == pytest.approx(2000 / 600 / 4)
    assert s["per_optimizer"]["sgd"]["knee"] is None
    assert s["per_optimizer"]["sgd"]["knee_undecided"] == [1024, 4096, 16384]
    assert cb.knee_text(s["per_optimizer"]["sgd"], 16384).startswith("1,024 or later (undecided")
    # a budget short enough to prove the efficiency is below 0.5 decides the knee there,
    # and a batch before it that stayed undecided makes the knee a range
    proved = short[:3] + [trial(optimizer="sgd", batch=16384, lr=6.4, steps=60)]
    proved[2] = trial(optimizer="sgd", batch=4096, lr=1.6, steps=300)  # below 2000 / 300 / 16 = 0.42
    s = cb.summarise({"trials": proved})
    assert s["cells"][("sgd", 4096)]["efficiency_below"] == pytest.approx(2000 / 300 / 16)
    assert s["per_optimizer"]["sgd"]["knee"] == 4096
    assert s["per_optimizer"]["sgd"]["knee_undecided"] == [1024]
    assert cb.knee_text(s["per_optimizer"]["sgd"], 16384).startswith("1,024 to 4,096")
    # a reached cell decides as before; the table shows the bound of a cell short of the target
    reached = short[:2] + [trial(optimizer="sgd", batch=4096, lr=1.6, heldout_steps=140, test_steps=140, steps=300)]
    s = cb.summarise({"trials": reached})
    assert s["per_optimizer"]["sgd"]["knee"] is None and s["per_optimizer"]["sgd"]["knee_undecided"] == [1024]
    assert s["cells"][("sgd", 4096)]["efficiency"] == pytest.approx(2000 / 140 / 16)  # 0.89: not below 0.5


def test_b_simple_is_read_near_the_target_of_the_chosen_small_batch_trial():
    noise = [(100, 50.0), (200, 60.0), (400, 100.0), (500, 120.0), (700, 140.0), (800, 160.0), (1000, 400.0)]
    trials = [trial(lr=0.01, heldout_steps=800, test_steps=800, noise=noise), trial(lr=0.02, heldout_steps=900, noise=[(100, 1e9)])]
    b = cb.summarise({"trials": trials})["per_optimizer"]["lamb"]["b_simple"]
    assert b["near_target"] == pytest.approx(130.0)  # median of steps 400..800: 100, 120, 140, 160
    assert b["whole_run"] == pytest.approx(120.0)


def test_report_renders_from_results(tmp_path):
    trials = [
        trial(batch=256, lr=0.01, heldout_steps=800, test_steps=800, noise=[(400, 300.0)]),
        trial(batch=1024, lr=0.02, heldout_steps=250, test_steps=240),
        {**trial(batch=1024, lr=0.04), "diverged": True, "final_heldout": None, "final_test": None},
    ]
    cb.render({"trials": trials, "settings": {"target": 0.85, "epochs": 15}}, tmp_path, "cb")
    report = (tmp_path / "cb.md").read_text()
    assert "| lamb | 800 (1.00) | 240 (0.83)* |" in report  # 0.02 of {0.02, 0.04}: at the grid's edge
    assert "| lamb | none up to 1,024 | 300 | 300 |" in report
    assert (tmp_path / "cb.png").stat().st_size > 0


def test_a_follow_up_study_measures_efficiency_against_its_references_base_and_centres_on_its_rates(tmp_path):
    # the reference: 20 epochs, batch 4096 short of the target in its 240 steps (efficiency
    # below 2000 / 240 / 16 = 0.52: undecided); the follow-up gives batch 4096 a longer budget
    first = [
        trial(batch=256, lr=0.01, heldout_steps=2000, test_steps=2000, steps=4100, noise=[(1500, 300.0)]),
        trial(batch=256, lr=0.02, heldout_steps=2100, test_steps=2100, steps=4100),
        trial(batch=4096, lr=0.04, steps=240, final=0.83),
        trial(batch=4096, lr=0.08, steps=240, final=0.82),
    ]
    path = tmp_path / "critical_batch.json"
    cb.save_results({"trials": first, "settings": {"target": 0.85, "epochs": 20}}, path)
    reference = cb.reference_of(path)
    assert reference["base"] == 256 and reference["base_steps"] == {"lamb": 2000}
    assert reference["chosen"] == {"lamb/256": 0.01, "lamb/4096": 0.04}
    assert cb.summarise(cb.load_results(path))["per_optimizer"]["lamb"]["knee_undecided"] == [4096]

    args = study_args(initial=3, grid_factor=2.0, reference=reference)
    assert cb.initial_grid("lamb", 4096, args) == [0.02, 0.04, 0.08]  # its choice (the rule also gives 0.04 here)
    assert cb.initial_grid("lamb", 1024, args) == [0.01, 0.02, 0.04]  # a cell it lacks: the rule
    reference["chosen"]["lamb/4096"] = 0.1
    assert cb.initial_grid("lamb", 4096, args) == [0.05, 0.1, 0.2]

    # 300 steps to target at 4096: (2000 / 300) / 16 = 0.42, below 0.5: the knee is 4096
    follow = {"trials": [trial(batch=4096, lr=0.1, heldout_steps=300, test_steps=300, steps=480)], "reference": reference}
    s = cb.summarise(follow)
    assert s["base"] == 256 and s["cells"][("lamb", 4096)]["efficiency"] == pytest.approx(2000 / 300 / 16)
    assert s["per_optimizer"]["lamb"]["knee"] == 4096 and s["per_optimizer"]["lamb"]["b_simple"]["near_target"] == 300.0
    # 200 steps: 0.63, perfect scaling goes on past 4096
    follow["trials"][0].update(steps_to_target_heldout=200, steps_to_target_test=200)
    assert cb.summarise(follow)["per_optimizer"]["lamb"]["knee"] is None
    cb.render({**follow, "settings": {"target": 0.85, "epochs": 40}}, tmp_path, "follow")
    report = (tmp_path / "follow.md").read_text()
    assert "A follow-up of `critical_batch.json` (20 epochs at every batch)" in report
    assert "| lamb | 200 (0.62) |" in report and "| lamb | none up to 4,096 | 300 |" in report
    # the reference's own report, rendered beside the follow-up's results, names its cells
    cb.save_results({**follow, "settings": {"target": 0.85, "epochs": 40}}, tmp_path / "follow.json")
    cb.render(cb.load_results(path), tmp_path, "critical_batch")
    assert "Follow-up [`follow.md`](follow.md), 40 epochs: lamb at 4,096: 200 (0.62)." in (tmp_path / "critical_batch.md").read_text()


def test_trial_config_validates_with_the_warmup_grown_with_the_batch():
    args = study_args(train_samples=52500, study_data=FMNIST)
    # 32768: 6.4 epochs, capped at a fifth of the 20-epoch budget
    for batch, warmup in [(256, 0.05), (4096, 0.8), (16384, 3.2), (32768, 4.0)]:
        text = cb.trial_config("lamb", batch, 0.01, args)
        path = (REPO / "bench" / ".cache").joinpath(f"trial-{batch}.py")
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        cfg = load_and_validate(str(path), [])
        assert cfg["lr_schedule"]["warmup_epochs"] == pytest.approx(warmup)
        assert cfg["global_batch_size"] == batch and cfg["micro_batch_size"] == 128
        assert cfg["optimizer"]["lr"] == 0.01 and cfg["lr_schedule"]["scaling"] == "none"
        assert cfg["data"]["eval_split"] == "heldout" and cfg["partial_window"] == "drop"
        assert cfg["eval"]["cache"] is True  # held-out and test sets decoded once per trial
        assert [h["type"] for h in cfg["hooks"]][0] == "noise_scale"


@pytest.mark.skipif(not (FMNIST / "dataset.json").exists(), reason="needs data/fashion-mnist (python data/prepare_fmnist.py)")
def test_study_data_holds_out_the_last_training_shard(tmp_path):
    counts = cb.prepare_study_data(FMNIST, tmp_path / "study")
    assert counts == {"train": 52500, "heldout": 7500, "validation": 10000}
    meta = json.loads((tmp_path / "study" / "dataset.json").read_text())
    assert meta["splits"]["heldout"] == {"records": 7500, "shards": 1}
    data_cfg = section("data", {"loader": "native", "root": str(tmp_path / "study"), "train_split": "train", "eval_split": "heldout"})
    assert count_samples(data_cfg, "train") == 52500 and count_samples(data_cfg, "eval") == 7500
    held = (tmp_path / "study" / "heldout-00000-of-00001").resolve()
    assert held == sorted(p for p in FMNIST.glob("train-*") if p.suffix != ".idx")[-1].resolve()
    assert held not in {p.resolve() for p in (tmp_path / "study").glob("train-*")}
    assert cb.prepare_study_data(FMNIST, tmp_path / "study") == counts  # again: the same links


def test_load_results_turns_an_old_files_nan_into_none(tmp_path):
    path = tmp_path / "old.json"
    path.write_text('{"trials": [{"noise_scale": [{"step": 1, "b_simple": NaN}, {"step": 2, "b_simple": 3.5}]}]}')
    assert cb.load_results(path)["trials"][0]["noise_scale"] == [{"step": 1, "b_simple": None}, {"step": 2, "b_simple": 3.5}]


@pytest.mark.slow
def test_quick_study_runs_every_optimizer(tmp_path):
    run_script("bench/critical_batch.py", "--quick", "--jobs", "2", "--out", str(tmp_path), "--study-data", str(tmp_path / "data"))
    text = (tmp_path / "critical_batch.json").read_text()
    assert "NaN" not in text  # an unavailable estimate is null: the file is standard JSON
    results = json.loads(text)
    cells = {(t["optimizer"], t["batch"]) for t in results["trials"]}
    assert cells == {(o, b) for o in cb.RECIPES for b in (64, 128)}
    for t in results["trials"]:
        assert not t["diverged"]
        assert [p["step"] for p in t["curve"]] == [1, 2, 3]  # spaced evaluations, the last one at the end
        assert all(0 <= p["heldout"] <= 1 and 0 <= p["test"] <= 1 for p in t["curve"])
        assert t["noise_scale"] and all(p["b_simple"] is None or math.isfinite(p["b_simple"]) for p in t["noise_scale"])
    assert (tmp_path / "critical_batch.md").exists() and (tmp_path / "critical_batch.png").exists()
