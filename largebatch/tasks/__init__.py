"""Tasks: what the model is trained for (``largebatch.tasks.base.Task``), chosen by the
config's ``task`` section::

    task = dict(type='classification')                          # the default
    task = dict(type='tasks/onehot_mse.py:OneHotMSE', scale=2.0)  # a file of yours, with arguments
    task = dict(type='mypackage.tasks:Distill')                 # a class in an importable module

Names are resolved like hooks' (``largebatch.config.classes``); ``docs/tasks.md`` shows
how to write one.
"""

from __future__ import annotations

import pathlib

from largebatch.config.classes import check_arguments, construct, load_class
from largebatch.config.frozen import thaw
from largebatch.config.sections import TaskConfig
from largebatch.tasks.base import Task
from largebatch.tasks.classification import ClassificationTask

__all__ = ["BUILTIN_TASKS", "ClassificationTask", "Task", "build_task"]

BUILTIN_TASKS = {"classification": "largebatch.tasks.classification:ClassificationTask"}


def build_task(section: TaskConfig, config_path: pathlib.Path | None = None) -> Task:
    """The task the ``task`` section names, built with its other keys.

    Args:
        section: the ``task`` section.
        config_path: the config file (a task file's path may be relative to its folders).

    Raises:
        ConfigError: an unknown name, a missing file, module or class, a class that is
            not a ``Task``, or arguments it does not take.
    """
    kwargs = thaw(section.extra)
    cls = load_class(section.type, key="task.type", kind="task", base=Task, builtins=BUILTIN_TASKS, config_path=config_path)
    check_arguments(cls, kwargs, "task")
    return construct(cls, kwargs, "task")
