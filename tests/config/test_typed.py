"""The typed config: frozen dataclasses generated from the schema, their defaults, their
round trip to the validated dict, no consumer re-defaulting a schema key, and no module
outside the config package turning a dict into a config."""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import pickle

import pytest
import torch

import largebatch
from largebatch import data as data_mod
from largebatch.batching import BatchPlan
from largebatch.checkpoint import config_hash
from largebatch.config import frozen, generate, validate
from largebatch.config.frozen import field_meta, schema_section
from largebatch.config.schema import REQUIRED, SCHEMA, Section
from largebatch.config.typed import FrozenDict, freeze, section, typed
from largebatch.errors import ConfigError
from tests.conftest import REPO, load_and_validate, tiny_config
from tests.data.conftest import unique_shards  # noqa: F401 (a fixture)
from tests.test_layers import imported_modules

PACKAGE = pathlib.Path(largebatch.__file__).parent
CONFIGS = sorted(p for p in (REPO / "configs").rglob("*.py") if "_base_" not in p.parts)


def schema_fields(spec: Section = SCHEMA, prefix: tuple[str, ...] = ()):
    """``(path, Field)`` of every key the schema names, subsections walked."""
    for name, child in spec.fields.items():
        if isinstance(child, Section):
            yield from schema_fields(child, (*prefix, name))
        else:
            yield (*prefix, name), child


def lookup(obj, path: tuple[str, ...]):
    for part in path:
        obj = getattr(obj, part)
    return obj


def given(config: dict, path: tuple[str, ...]):
    for part in path:
        config = config[part]
    return config


def test_every_schema_key_is_a_typed_attribute_with_the_schemas_default():
    raw = tiny_config()
    cfg = typed(validate(raw))
    for path, spec in schema_fields():
        value = lookup(cfg, path)
        if spec.default is REQUIRED:
            assert value == freeze(given(raw, path)), path
            continue
        try:
            expected = freeze(given(raw, path))  # a key the tiny config sets
        except KeyError:
            expected = freeze(spec.default)
        assert value == expected, path
        if value is not None and spec.kind is not list:
            assert isinstance(value, spec.kind), (path, value)


def test_each_section_is_a_frozen_dataclass_with_the_schemas_defaults_and_docs():
    cfg = typed(validate(tiny_config()))
    for name, spec in SCHEMA.fields.items():
        if not isinstance(spec, Section):
            continue
        part = getattr(cfg, name)
        assert dataclasses.is_dataclass(part) and type(part).__dataclass_params__.frozen, name
        fields = {f.name: f for f in dataclasses.fields(part)}
        assert set(fields) == set(spec.fields) | ({"extra"} if spec.open else set()), name
        for key, field_spec in spec.fields.items():
            field = fields[key]
            assert field.metadata["doc"] == field_spec.doc
            if field_spec.default is not REQUIRED:
                assert field.default == freeze(field_spec.default), f"{name}.{key}"
    assert type(cfg.data)() == section("data", {})  # a section without required keys builds from its defaults


def test_the_objects_are_frozen():
    cfg = typed(validate(tiny_config(hooks=[{"type": "csv", "filename": "a.csv"}], **{"optimizer.betas": [0.9, 0.99]})))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.data.num_workers = 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.optimizer.lr = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.epochs = 3
    with pytest.raises(TypeError):
        cfg.optimizer.extra["betas"] = (0.5, 0.5)
    with pytest.raises(TypeError):
        cfg.hooks[0]["filename"] = "b.csv"
    assert isinstance(cfg.data.mean, tuple) and isinstance(cfg.hooks[0], FrozenDict)
    assert cfg.optimizer.extra == {"betas": (0.9, 0.99)} and cfg.model.extra["embed_dim"] == 32


@pytest.mark.parametrize("path", CONFIGS, ids=[str(p.relative_to(REPO / "configs")) for p in CONFIGS])
def test_to_dict_round_trips_to_exactly_the_validated_dict(path):
    validated = load_and_validate(path)
    cfg = typed(validated)
    back = cfg.to_dict()
    assert back == validated
    assert repr(back) == repr(validated)  # the same key order and the same types (lists, not tuples)
    assert config_hash(back) == config_hash(validated)
    assert pickle.loads(pickle.dumps(cfg)) == cfg  # loader workers receive it
    assert typed(cfg) is cfg and typed(back) == cfg


def test_round_trip_keeps_open_sections_and_hooks():
    validated = validate(
        tiny_config(hooks=["csv", {"type": "stop", "max_minutes": 1.0}], task={"type": "classification"}, **{"optimizer.eps": 1e-6})
    )
    assert repr(typed(validated).to_dict()) == repr(validated)


def test_train_state_holds_the_typed_config_and_its_dict_view():
    from tests.engine.helpers import make_engine

    engine = make_engine(torch.nn.Linear(2, 2), [], global_batch_size=32, micro_batch_size=8, num_samples=128)
    config = engine.state.run.config
    validated = validate(tiny_config(**{"global_batch_size": 32, "micro_batch_size": 8, "lr_schedule.warmup_steps": 0}))
    assert config.to_dict()["eval"]["at_end"] is config.eval.at_end is False
    assert config == typed(config.to_dict()) and set(config.to_dict()) == set(validated)


def test_a_partial_data_section_takes_the_schemas_defaults():
    data = section("data", {"loader": "native", "root": "shards", "scale": (0.5, 1.0)})
    assert data.num_workers == 2 and data.prefetch == 2 and data.scale == (0.5, 1.0)


def test_the_native_loader_uses_the_schemas_num_workers(unique_shards):  # noqa: F811 (the fixture)
    cfg = section("data", {"loader": "native", "root": str(unique_shards), "num_classes": 48, "label_offset": 1, "image_size": 32})
    plan = BatchPlan.create(global_batch_size=16, micro_batch_size=4, world_size=1, num_samples=48)
    loader = data_mod.build_train_loader(cfg, plan, rank=0, seed=0, device=torch.device("cpu"))
    try:
        assert loader._loader.num_workers == SCHEMA.fields["data"].fields["num_workers"].default == 2
        assert loader._loader.prefetch_factor == SCHEMA.fields["data"].fields["prefetch"].default
    finally:
        loader.close()


def _schema_key_names() -> set[str]:
    return {path[-1] for path, _ in schema_fields()} | {name for name, spec in SCHEMA.fields.items() if isinstance(spec, Section)}


CONFIG_RECEIVERS = ("cfg", "config", "section", "options", "data", "dist", "model", "optimizer", "schedule", "mix")
# The one place a section is read as a dict: the optimizer's signature check, which
# ``validate`` calls on the dict before there is a typed config.
ALLOWED = {("optim/__init__.py", "optimizer_kwargs")}


def _receiver_name(node: ast.expr) -> str:
    while isinstance(node, (ast.Subscript, ast.Call)):
        node = node.value if isinstance(node, ast.Subscript) else node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _config_lookups(path: pathlib.Path, keys: set[str], root: pathlib.Path = PACKAGE):
    """``(line, text)`` of each ``X.get("<schema key>", ...)`` or ``X["<schema key>"]``
    whose receiver looks like a config (its name mentions one of CONFIG_RECEIVERS)."""
    tree = ast.parse(path.read_text())
    functions = {n: f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) for n in ast.walk(f)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
            key, receiver = node.args[0], node.func.value
        elif isinstance(node, ast.Subscript):
            key, receiver = node.slice, node.value
        else:
            continue
        if not (isinstance(key, ast.Constant) and key.value in keys):
            continue
        name = _receiver_name(receiver).lower()
        if not any(word in name for word in CONFIG_RECEIVERS):
            continue
        where = (str(path.relative_to(root)), functions.get(node, ""))
        if where not in ALLOWED:
            yield f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}"


def test_no_consumer_looks_up_or_re_defaults_a_schema_key():
    keys = _schema_key_names()
    found = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        # importers read another framework's config (a Colossal-AI dict), not a largebatch one
        if path.relative_to(PACKAGE).parts[0] not in ("config", "importers")
        for hit in _config_lookups(path, keys)
    ]
    assert not found, "read these from the typed config (cfg.section.key); the schema fills every default:\n" + "\n".join(found)


def test_the_scan_sees_re_defaults_and_lookups(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(
        "def f(data_cfg, cfg, group):\n"
        "    a = data_cfg.get('num_workers', 0)\n"
        "    b = cfg['optimizer']['lr']\n"
        "    c = group.get('name', 'group0')\n"  # not a config: left alone
        "    return a, b, c\n"
    )
    hits = list(_config_lookups(path, _schema_key_names(), root=tmp_path))
    assert len(hits) == 3 and "num_workers" in hits[0], hits  # cfg['optimizer'] and cfg[...]['lr']


def test_a_stale_sections_file_imports_but_types_no_config(monkeypatch):
    # A sections.py generated from an older schema must import (the generator imports this
    # package to replace it), and must not type a config with its outdated classes.
    monkeypatch.setattr(frozen, "STALE", [])
    assert schema_section("optimizer") is SCHEMA.fields["optimizer"] and not frozen.STALE
    assert schema_section("removed_section").fields == {} and field_meta("optimizer.removed_key") == {}
    with pytest.raises(
        ConfigError,
        match=r"sections.py is stale: the schema has no removed_section, optimizer.removed_key; run `python -m largebatch.config.generate`",
    ):
        typed(tiny_config())


def test_the_section_classes_are_the_ones_the_schema_generates():
    written = (PACKAGE / "config" / "sections.py").read_text()
    assert written == generate.render_sections(), f"largebatch/config/sections.py is stale; run `{generate.REGENERATE}`"


# What turns a dict into a typed config (or checks one): the config package's own.
TYPING_FUNCTIONS = {"typed", "section", "validate", "validate_section", "from_dict", "load_config", "_check_section"}


def _typing_calls(path: pathlib.Path, root: pathlib.Path = PACKAGE):
    """``file:line: what`` for each import of a typing function from the config package
    (``imported_modules``: every import statement, relative ones too), and each call of
    ``X.from_dict(...)`` on a config class, in one module."""
    where = path.relative_to(root)
    for line, name in imported_modules(path):
        module, _, function = name.rpartition(".")
        if module.startswith("largebatch.config") and function in TYPING_FUNCTIONS:
            yield f"{where}:{line}: imports {function} from {module}"
    for node in ast.walk(ast.parse(path.read_text())):
        call = node.func if isinstance(node, ast.Call) else None
        if isinstance(call, ast.Attribute) and call.attr == "from_dict" and getattr(call.value, "id", "").endswith("Config"):
            yield f"{where}:{node.lineno}: {ast.unparse(node)}"


def test_no_module_outside_the_config_package_types_or_validates_a_dict():
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) if path.relative_to(PACKAGE).parts[0] != "config" for hit in _typing_calls(path)]
    found += [hit for path in sorted((REPO / "bench").glob("*.py")) for hit in _typing_calls(path, root=REPO)]  # as users build theirs
    assert not found, "take the typed section as an argument (largebatch.config.resolve_config types it once):\n" + "\n".join(found)


PROBE = """
from largebatch.config.typed import section, typed
from largebatch.config.schema import validate
from largebatch.config.sections import DataConfig, OptimizerConfig
data = DataConfig.from_dict({'loader': 'native'})
lr = OptimizerConfig(lr=0.1).lr  # built from typed values: not a dict turned into a config
"""


def test_the_typing_scan_sees_imports_and_from_dict(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    hits = list(_typing_calls(tmp_path / "probe.py", root=tmp_path))
    assert len(hits) == 4 and "section" in hits[0] and "validate" in hits[2] and "from_dict" in hits[3], hits
