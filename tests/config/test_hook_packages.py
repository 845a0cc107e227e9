"""Hooks from installed packages: a real package, pip-installed into a folder the runs import from."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.conftest import clean_env, run_cli, tiny_config, write_config

pytestmark = pytest.mark.slow  # a pip install and training runs

PYPROJECT = """
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "largebatch-marker-hooks"
version = "0.1"

[tool.setuptools]
py-modules = ["lbmarker"]

[project.entry-points."largebatch.hooks"]
marker = "lbmarker:MarkerHook"
broken = "lbmarker_gone:MarkerHook"
"""

MODULE = '''
import pathlib

from largebatch.engine.hook import Hook


class MarkerHook(Hook):
    """Writes the number of optimizer steps the run took to ``path``."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = pathlib.Path(path)

    def after_run(self, state) -> None:
        self.path.write_text(str(state.step))
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The package installed by pip into a target folder (its dist-info registers the names)."""
    work = tmp_path_factory.mktemp("hookpkg")
    (work / "src").mkdir()
    (work / "src" / "pyproject.toml").write_text(PYPROJECT)
    (work / "src" / "lbmarker.py").write_text(textwrap.dedent(MODULE))
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "--target",
        str(work / "site"),
        str(work / "src"),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (work / "site" / "largebatch_marker_hooks-0.1.dist-info" / "entry_points.txt").is_file()
    env = clean_env()
    env["PYTHONPATH"] = f"{work / 'site'}:{env['PYTHONPATH']}"
    return work, env


def train_with(work, env, hooks, run="run"):
    cfg = tiny_config(max_steps=3, hooks=hooks)
    return run_cli("train", "--config", str(write_config(work, cfg)), "--run-dir", str(work / run), env=env)


def test_a_registered_name_and_the_module_form_both_run(installed, tmp_path):
    work, env = installed
    for spec in ("marker", "lbmarker:MarkerHook"):
        mark = tmp_path / f"{spec.replace(':', '-')}.txt"
        result = train_with(tmp_path, env, [{"type": spec, "path": str(mark)}], run=f"run-{mark.stem}")  # a new run each
        assert result.returncode == 0, result.stderr
        assert mark.read_text() == "3"


def test_registered_names_fail_with_one_error_line(installed, tmp_path):
    work, env = installed
    broken = train_with(tmp_path, env, [{"type": "broken", "path": "x"}])
    assert broken.returncode == 2 and broken.stderr.count("\n") == 1, broken.stderr
    assert "hooks[0]" in broken.stderr and "lbmarker_gone" in broken.stderr and "largebatch-marker-hooks" in broken.stderr
    typo = train_with(tmp_path, env, [{"type": "markr", "path": "x"}])
    assert typo.returncode == 2 and "did you mean 'marker'?" in typo.stderr
    elsewhere = train_with(tmp_path, clean_env(), [{"type": "marker", "path": "x"}])  # not installed in this environment
    assert elsewhere.returncode == 2 and "unknown hook 'marker'" in elsewhere.stderr
