"""The training entry point's error lines: a hook of the user's that raises ends a real
run with one ``error:`` line naming the hook's class, the event, the exception and the
line of the hook's file it came from (a name the state held before it was grouped by
lifetime: its new place); ``--debug`` adds the traceback."""

from __future__ import annotations

import json

import pytest

from largebatch.train_command import train_main
from tests.conftest import REPO

HOOKS = """
import json

from largebatch.engine.hook import Hook


class Broken(Hook):
    def after_step(self, state):
        if state.step == 1:
            return {}["missing"]  # raises


class ReadsBadJson(Hook):
    def before_run(self, state):
        self.settings = json.loads("not json")  # raises


class WrittenBeforeTheSplit(Hook):
    def after_step(self, state):
        (state.run_dir / "notes.txt").write_text("step")  # raises
"""

pytestmark = pytest.mark.usefixtures("preemption_handlers_restored")


def raising_line(name: str) -> int:
    """The line of ``HOOKS`` where hook ``name`` raises."""
    lines = HOOKS.splitlines()
    start = lines.index(f"class {name}(Hook):")
    return next(n for n, text in enumerate(lines, 1) if n > start and text.endswith("# raises"))


def train_with_hook(tmp_path, name: str, *flags: str) -> int:
    hook_file = tmp_path / "my_hooks.py"
    hook_file.write_text(HOOKS)
    argv = ["--config", str(REPO / "configs/demo/vit-tiny-synthetic.py"), "--run-dir", str(tmp_path / "run")]
    sets = ["hooks=" + json.dumps([{"type": f"{hook_file}:{name}"}]), "max_steps=2", "global_batch_size=64"]
    argv += [word for value in sets for word in ("--set", value)] + list(flags)
    return train_main(argv)


@pytest.mark.parametrize(
    ("name", "event", "exception"),
    [
        ("Broken", "after_step", "KeyError: 'missing'"),
        # raised inside json: the line named is the hook's call, not json's own
        ("ReadsBadJson", "before_run", "JSONDecodeError: Expecting value: line 1 column 1 (char 0)"),
        (
            "WrittenBeforeTheSplit",
            "after_step",
            "AttributeError: state.run_dir moved to state.run.run_dir: the state is grouped by lifetime (state.run, "
            "state.current, the counters); CHANGELOG.md lists every moved name",
        ),
    ],
)
def test_a_hook_that_raises_ends_the_run_with_one_line_naming_it_and_its_line(tmp_path, capsys, name, event, exception):
    assert train_with_hook(tmp_path, name) == 1
    where = f"{tmp_path / 'my_hooks.py'}:{raising_line(name)}"
    assert capsys.readouterr().err.splitlines() == [
        f"error: hook {name} failed in {event}: {exception} at {where} (--debug shows the traceback)"
    ]


def test_debug_adds_the_traceback_through_the_hooks_file(tmp_path, capsys):
    assert train_with_hook(tmp_path, "Broken", "--debug") == 1
    err, line = capsys.readouterr().err, raising_line("Broken")
    assert "Traceback" in err and f'File "{tmp_path / "my_hooks.py"}", line {line}, in after_step' in err
    assert err.splitlines()[-1] == f"error: hook Broken failed in after_step: KeyError: 'missing' at {tmp_path / 'my_hooks.py'}:{line}"
