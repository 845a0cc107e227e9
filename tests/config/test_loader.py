import pytest

from largebatch.config import load_config
from largebatch.errors import ConfigError


def test_python_config_keeps_lowercase_plain_names(tmp_path):
    (tmp_path / "c.py").write_text(
        "import math\nGLOBAL = 64\n_private = 1\nglobal_batch_size = GLOBAL\nmodel = dict(name='x', sizes=(1, 2))\ndef helper():\n    pass\n"
    )
    assert load_config(tmp_path / "c.py") == {"global_batch_size": 64, "model": {"name": "x", "sizes": [1, 2]}}


def test_base_merging_is_deep_and_ordered(tmp_path):
    (tmp_path / "_base_").mkdir()
    (tmp_path / "_base_/a.py").write_text("optimizer = dict(type='lamb', lr=1.0, weight_decay=0.1)\nepochs = 3\n")
    (tmp_path / "_base_/b.yaml").write_text("epochs: 5\nlog: {interval: 7}\n")
    (tmp_path / "c.py").write_text("_base_ = ['_base_/a.py', '_base_/b.yaml']\noptimizer = dict(lr=2.0)\n")
    cfg = load_config(tmp_path / "c.py")
    assert cfg == {"optimizer": {"type": "lamb", "lr": 2.0, "weight_decay": 0.1}, "epochs": 5, "log": {"interval": 7}}


def test_delete_replaces_a_base_dict(tmp_path):
    (tmp_path / "base.py").write_text("optimizer = dict(type='lamb', lr=1.0, weight_decay=0.1)\n")
    (tmp_path / "c.py").write_text("_base_ = 'base.py'\noptimizer = dict(_delete_=True, type='sgd', lr=0.1)\n")
    assert load_config(tmp_path / "c.py")["optimizer"] == {"type": "sgd", "lr": 0.1}


def test_base_cycle_is_an_error(tmp_path):
    (tmp_path / "a.py").write_text("_base_ = 'b.py'\n")
    (tmp_path / "b.py").write_text("_base_ = 'a.py'\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "a.py")


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("optimizer.lr=0.02", 0.02),
        ("optimizer.lr=2e-3", 2e-3),
        ("epochs=7", 7),
        ("compile=true", True),
        ("optimizer.betas=[0.9, 0.99]", [0.9, 0.99]),
        ("max_steps=null", None),
        ("model.name=vit_small_patch16_224", "vit_small_patch16_224"),
    ],
)
def test_set_parses_to_the_right_type(tmp_path, override, expected):
    (tmp_path / "c.yaml").write_text("optimizer: {lr: 1.0}\nmodel: {name: x}\n")
    cfg = load_config(tmp_path / "c.yaml", [override])
    node = cfg
    key = override.split("=")[0].split(".")
    for part in key[:-1]:
        node = node[part]
    assert node[key[-1]] == expected
    assert type(node[key[-1]]) is type(expected)


def test_set_without_equals_is_an_error(tmp_path):
    (tmp_path / "c.yaml").write_text("epochs: 1\n")
    with pytest.raises(ConfigError, match="key.path=value"):
        load_config(tmp_path / "c.yaml", ["epochs"])


def test_non_plain_value_names_the_key(tmp_path):
    (tmp_path / "c.py").write_text("class X: pass\nmodel = dict(norm=X())\n")
    with pytest.raises(ConfigError, match=r"model\.norm"):
        load_config(tmp_path / "c.py")


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.py")
