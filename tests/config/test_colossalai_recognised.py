"""A Colossal-AI config given where a largebatch config is expected is one error that
names the file and the import command; largebatch configs with upper-case constants load."""

from __future__ import annotations

import pytest

from largebatch import train_command
from largebatch.config import load_config, resolve_config
from largebatch.errors import ConfigError
from tests.conftest import tiny_config
from tests.importers.colossalai import shapes

pytestmark = pytest.mark.usefixtures("preemption_handlers_restored")


def python_config(tmp_path, text: str, name: str = "config.py"):
    path = tmp_path / name
    path.write_text(text)
    return path


def tiny_python_config(**overrides) -> str:
    """The tiny test config as a Python config file's lower-case names."""
    return "".join(f"{key} = {value!r}\n" for key, value in tiny_config(**overrides).items())


def test_train_py_on_a_colossalai_config_is_one_line_naming_the_file_and_the_import(tmp_path, capsys):
    config, _ = shapes.data_parallel(tmp_path)
    assert train_command.train_main(["--config", str(config), "--run-dir", str(tmp_path / "run")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {config}: ")
    assert "imports colossalai at line 1" in lines[0]
    assert f"largebatch config import colossalai {config} --out {tmp_path / 'config-largebatch.py'}" in lines[0]
    assert not (tmp_path / "run").exists()


def test_colossalai_keys_and_constants_without_the_import_are_named_at_once(tmp_path):
    text = "BATCH_SIZE = 256\nNUM_EPOCHS = 300\nfp16 = dict(mode='torch')\ngradient_accumulation = 16\nclip_grad_norm = 1.0\n"
    with pytest.raises(ConfigError) as info:
        load_config(python_config(tmp_path, text))
    message = str(info.value)
    assert "looks like a Colossal-AI config" in message and "fp16, gradient_accumulation" in message
    assert "BATCH_SIZE, NUM_EPOCHS" in message and "largebatch config import colossalai" in message


@pytest.mark.parametrize(("constant", "key"), [("NUM_EPOCHS = 300", "epochs"), ("BATCH_SIZE = 256", "micro_batch_size")])
def test_an_upper_case_name_standing_for_a_missing_key_is_not_silently_ignored(tmp_path, constant, key):
    cfg = tiny_config()
    del cfg[key]
    path = python_config(tmp_path, constant + "\n" + "".join(f"{k} = {v!r}\n" for k, v in cfg.items()))
    with pytest.raises(ConfigError) as info:
        resolve_config(path)
    name = constant.split(" = ")[0]
    assert f"{name} is upper-case, so the config does not read it" in str(info.value)
    assert f"{name} -> {key}" in str(info.value)


def test_the_upper_case_name_is_fine_once_its_key_is_set(tmp_path):
    path = python_config(tmp_path, "NUM_EPOCHS = 300\n" + tiny_python_config())
    assert resolve_config(path).epochs == 1
    cfg = tiny_config()
    del cfg["epochs"]
    path = python_config(tmp_path, "NUM_EPOCHS = 300\n" + "".join(f"{k} = {v!r}\n" for k, v in cfg.items()))
    assert resolve_config(path, ["epochs=2"]).epochs == 2  # --set gives the key


def test_largebatch_configs_with_their_own_constants_load(tmp_path):
    cfg = tiny_config()
    del cfg["micro_batch_size"], cfg["epochs"]
    text = "BATCH_SIZE = 8\nNUM_EPOCHS = 2\nmicro_batch_size = BATCH_SIZE\nepochs = NUM_EPOCHS\n"
    path = python_config(tmp_path, text + "".join(f"{k} = {v!r}\n" for k, v in cfg.items()))
    resolved = resolve_config(path)
    assert (resolved.micro_batch_size, resolved.epochs) == (8, 2)


def test_a_single_colossalai_key_keeps_its_own_fix(tmp_path):
    path = python_config(tmp_path, "gradient_accumulation = 4\n" + tiny_python_config())
    with pytest.raises(ConfigError, match="accumulation is derived") as info:
        resolve_config(path)
    assert "Colossal-AI" not in str(info.value)


def test_a_base_file_importing_colossalai_is_named(tmp_path):
    config, _ = shapes.data_parallel(tmp_path)
    path = python_config(tmp_path, f"_base_ = [{config.name!r}]\n" + tiny_python_config(), "child.py")
    with pytest.raises(ConfigError, match="imports colossalai") as info:
        load_config(path)
    assert str(config) in str(info.value)
