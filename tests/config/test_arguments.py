"""Values handed to a constructor are checked against its signature before any work."""

from __future__ import annotations

import pytest

from largebatch.config.arguments import check_call
from largebatch.config.schema import REQUIRED, SCHEMA, describe_keys
from largebatch.errors import ConfigError


class Annotated:
    def __init__(
        self,
        lr: float = 1e-3,
        steps: int = 10,
        flag: bool = False,
        name: str = "x",
        betas: tuple[float, float] = (0.9, 0.999),
        tags: list[str] | None = None,
        limit: int | None = None,
        anything=None,
    ) -> None:
        pass


def plain(lr=0.1, momentum=0, nesterov=False, betas=(0.9, 0.999), mode="a"):  # no annotations: the defaults speak
    pass


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lr": 1},  # an int where a float is expected
        {"lr": 0.5, "steps": 3, "flag": True, "name": "y"},
        {"betas": [0.8, 0.9]},  # YAML gives lists: a list fits a tuple
        {"tags": ["a", "b"]},
        {"tags": None, "limit": None, "anything": object()},
        {"limit": 4},
        {"not_a_parameter": "left to the caller's own key check"},
    ],
)
def test_values_that_fit_pass(kwargs):
    check_call(Annotated, kwargs, "section")


@pytest.mark.parametrize(
    ("kwargs", "key", "expected"),
    [
        ({"lr": "tiny"}, "section.lr", "expected a number, got 'tiny' (str)"),
        ({"lr": True}, "section.lr", "expected a number"),  # a bool is not a number here
        ({"steps": 2.5}, "section.steps", "expected an integer"),
        ({"flag": "maybe"}, "section.flag", "expected a boolean"),
        ({"flag": 1}, "section.flag", "expected a boolean"),
        ({"name": 3}, "section.name", "expected a string"),
        ({"betas": 0.9}, "section.betas", "expected a list of 2 (number, number)"),
        ({"betas": [0.9, 0.99, 0.999]}, "section.betas", "a list of 2"),
        ({"betas": [0.9, "x"]}, "section.betas", "a list of 2"),
        ({"tags": "a"}, "section.tags", "a list of strings"),
        ({"limit": "all"}, "section.limit", "an integer (or null)"),
    ],
)
def test_values_that_do_not_fit_name_the_key_and_the_default(kwargs, key, expected):
    with pytest.raises(ConfigError) as info:
        check_call(Annotated, kwargs, "section")
    assert info.value.key == key
    assert expected in str(info.value) and "by default" in str(info.value)


def test_without_annotations_the_default_gives_the_type():
    check_call(plain, {"lr": 1, "momentum": 0.9, "nesterov": True, "betas": [0.5, 0.6], "mode": "b"}, "optimizer")
    for kwargs, fragment in (
        ({"momentum": "high"}, "expected a number"),  # default 0: an int default accepts any number
        ({"nesterov": "yes"}, "expected a boolean"),
        ({"betas": 0.9}, "expected a list of numbers"),
        ({"mode": 2}, "expected a string"),
    ):
        with pytest.raises(ConfigError, match=fragment):
            check_call(plain, kwargs, "optimizer")


def test_describe_keys_covers_every_schema_field_with_its_default():
    rows = {key: (kind, default, doc) for key, kind, default, doc in describe_keys(SCHEMA)}

    def walk(section, prefix=""):
        for name, spec in section.fields.items():
            yield prefix + name, spec
            if hasattr(spec, "fields"):
                yield from walk(spec, f"{prefix}{name}.")

    for key, spec in walk(SCHEMA):
        assert key in rows, key
        if hasattr(spec, "fields"):
            assert rows[key][0] == "section"
        else:
            assert rows[key][1] == ("required" if spec.default is REQUIRED else repr(spec.default)), key
    assert rows["optimizer.lr"][:2] == ("float", "required")
    assert "lars" in rows["optimizer.type"][2]
