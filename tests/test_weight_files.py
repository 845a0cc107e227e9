"""Starting weights (``model.init_from``) and exported weights read from a ``.safetensors``
file: another dtype, or a header that is malformed or claims too much, is one error line."""

from __future__ import annotations

import struct

import pytest
import torch
from safetensors.torch import save_file

from largebatch.errors import ConfigError, UserError
from tests.conftest import load_and_validate, model_of, tiny_config, write_config


def config_from(tmp_path, weights):
    return load_and_validate(str(write_config(tmp_path, tiny_config(**{"model.init_from": str(weights)}))), [])


def saved_weights(tmp_path, dtype=None) -> tuple:
    """A tiny model's weights saved as a file (cast to ``dtype`` when given): the reference."""
    state = {k: v.contiguous() for k, v in model_of(config_from(tmp_path, tmp_path / "unused")).state_dict().items()}
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    path = tmp_path / "weights.safetensors"
    save_file(state, str(path))
    return path, state


def test_weights_in_the_models_dtype_start_the_model(tmp_path):
    path, state = saved_weights(tmp_path)
    model = model_of(config_from(tmp_path, path), initial_weights=True)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())


@pytest.mark.parametrize(("dtype", "name"), [(torch.int8, "I8"), (torch.float16, "F16"), (torch.float64, "F64")])
def test_weights_of_another_dtype_are_refused_not_cast(tmp_path, dtype, name):
    """timm's loader would cast an int8 file silently: the run would start from rounded weights."""
    path, _ = saved_weights(tmp_path, dtype)
    with pytest.raises(ConfigError) as refused:
        model_of(config_from(tmp_path, path), initial_weights=True)
    assert refused.value.key == "model.init_from"
    assert f"holds cls_token as {name}, the model's is F32 (torch.float32)" in refused.value.message


HEADERS = {
    "oversized": struct.pack("<Q", 1 << 40) + b"{}",
    "not-json": struct.pack("<Q", 10) + b"{not json}",
    "offsets-beyond-the-file": struct.pack("<Q", 60) + b'{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}'[:60],
    "empty": b"",
}


@pytest.mark.parametrize("content", HEADERS.values(), ids=HEADERS)
def test_a_malformed_safetensors_header_is_one_error_line(tmp_path, content):
    path = tmp_path / "weights.safetensors"
    path.write_bytes(content)
    with pytest.raises(UserError) as refused:
        model_of(config_from(tmp_path, path), initial_weights=True)
    assert refused.value.render().startswith(f"{path}: not a readable safetensors file (")
    assert "\n" not in refused.value.render()
