"""``largebatch --help`` and ``largebatch config show`` import neither torch nor timm (seconds of start-up): read
from ``python -X importtime``, which names every module a process imports."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from tests.conftest import PYTHON, REPO, clean_env

HEAVY = ("torch", "timm")
SHIPPED = sorted(p.relative_to(REPO) for p in (REPO / "configs").rglob("*.py") if "_base_" not in p.parts)


def imported_modules(stderr: str) -> set[str]:
    """The modules ``-X importtime`` lists (``import time: self | cumulative | name``)."""
    return {line.rpartition("|")[2].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def config_show(*args: str) -> tuple[dict, set[str]]:
    """``python -X importtime -m largebatch config show ARGS``: the printed config and the imported modules."""
    result = subprocess.run(
        [PYTHON, "-X", "importtime", "-m", "largebatch", "config", "show", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return yaml.safe_load(result.stdout), imported_modules(result.stderr)


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY)


def test_config_show_imports_neither_torch_nor_timm():
    shown, modules = config_show("configs/vit-b16.py", "--world-size", "8")
    assert "largebatch.footprint" in modules and "yaml" in modules  # the listing is read
    assert heavy(modules) == []
    assert shown["derived"]["accumulation"] == 16
    assert shown["derived"]["memory_estimate"]["parameters"] == 86_567_656


def test_help_imports_neither_torch_nor_timm():
    result = subprocess.run(
        [PYTHON, "-X", "importtime", "-m", "largebatch", "--help"], cwd=REPO, capture_output=True, text=True, timeout=300, env=clean_env()
    )
    assert result.returncode == 0 and "config" in result.stdout, result.stderr[-3000:]
    modules = imported_modules(result.stderr)
    assert "largebatch.cli" in modules  # the listing is read
    assert heavy(modules) == []


@pytest.mark.slow
@pytest.mark.parametrize("path", SHIPPED, ids=str)
def test_config_show_of_every_shipped_config_imports_neither(path):
    shown, modules = config_show(str(path), "--world-size", "2" if "demo" in path.parts else "8")
    assert heavy(modules) == [], path
    assert shown["derived"]["memory_estimate"]["parameters"] > 0


@pytest.mark.slow
def test_a_model_the_count_does_not_cover_is_built_with_timm():
    shown, modules = config_show("configs/vit-b16.py", "--world-size", "8", "--set", "model.global_pool=map")
    assert "timm" in modules and "torch" in modules
    assert shown["derived"]["memory_estimate"]["parameters"] > 86_567_656  # the attention pool's own
