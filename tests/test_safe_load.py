"""Checkpoints read as data (``largebatch/safe_load.py``): what ``not_plain`` accepts is what
``torch.load(weights_only=True)`` accepts, a pickled callable in a checkpoint file or in a
sharded checkpoint's pickles is refused without running, and a trusted file loads."""

from __future__ import annotations

import collections
import datetime
import enum
import io
import os
import pathlib
import pickle
import random
import warnings

import numpy as np
import pytest
import torch

from largebatch import safe_load
from largebatch.errors import UserError


class Colour(enum.IntEnum):
    RED = 1


# values a hook's state may hold: each must come back from a weights-only load unchanged
PLAIN = {
    "none": None,
    "numbers": [True, 3, 2.5, float("inf"), 1 + 2j],
    "text": ("a", b"b", bytearray(b"c")),
    "nested": {"a": {"b": [1, (2, 3)], 4: {5, 6}}},
    "ordered": collections.OrderedDict(a=1),
    "tensors": {"t": torch.arange(3.0), "half": torch.zeros(2, dtype=torch.bfloat16), "p": torch.nn.Parameter(torch.ones(2))},
    "torch": [torch.float16, torch.device("cpu"), torch.Size([2, 3])],
    "python-random-state": random.getstate(),
    "generator-state": torch.Generator().manual_seed(1).get_state(),
    "numpy-bit-generator-state": np.random.default_rng(0).bit_generator.state,
}

# values a weights-only load refuses: each must be named by not_plain, with its type
NOT_PLAIN = {
    "numpy-scalar": (np.float64(1.0), "['state'][0]: numpy.float64"),
    "numpy-array": (np.zeros(2), "['state'][0]: numpy.ndarray"),
    "numpy-random-state": (np.random.get_state(), "['state'][0][1]: numpy.ndarray"),  # ('MT19937', keys, ...)
    "int-enum": (Colour.RED, "['state'][0]: tests.test_safe_load.Colour"),
    "path": (pathlib.Path("/x"), "['state'][0]: pathlib.PosixPath"),
    "datetime": (datetime.datetime(2026, 1, 1), "['state'][0]: datetime.datetime"),
    "defaultdict": (collections.defaultdict(int), "['state'][0]: collections.defaultdict"),
    "deque": (collections.deque([1]), "['state'][0]: collections.deque"),
    "frozenset": (frozenset({1}), "['state'][0]: builtins.frozenset"),
}


def weights_only_round_trip(value):
    buffer = io.BytesIO()
    torch.save({"v": value}, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)["v"]


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return type(a) is type(b) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b and type(a) is type(b)


@pytest.mark.parametrize("name", PLAIN)
def test_what_not_plain_accepts_loads_back_unchanged(name):
    value = PLAIN[name]
    assert safe_load.not_plain(value) is None
    assert same(weights_only_round_trip(value), value)


@pytest.mark.parametrize("name", NOT_PLAIN)
def test_what_not_plain_names_a_weights_only_load_refuses(name):
    value, where = NOT_PLAIN[name]
    assert safe_load.not_plain({"state": [value]}) == where
    with pytest.raises(pickle.UnpicklingError):
        weights_only_round_trip(value)


class RunsCode:
    """Pickles as a call of ``os.system``: loading it unrestricted runs the command."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("zipfile", [True, False], ids=["zip", "legacy"])
def test_a_pickled_callable_is_refused_without_running(tmp_path, zipfile):
    marker = tmp_path / "ran"
    path = tmp_path / "step-00000004.pt"
    torch.save({"format": 1, "model": {}, "hooks": {"Mine": {"x": RunsCode(marker)}}}, path, _use_new_zipfile_serialization=zipfile)
    with pytest.raises(safe_load.UntrustedCheckpoint) as error:
        safe_load.load_file(path)
    message = str(error.value)
    assert message.startswith(f"{path}: refusing to load this checkpoint") and "posix.system" in message
    assert "--trust-checkpoint" in message
    assert not marker.exists()


def test_a_trusted_file_loads_what_a_weights_only_load_refuses(tmp_path):
    path = tmp_path / "old.pt"
    torch.save({"format": 1, "hooks": {"Mine": {"recent": collections.deque([1, 2])}}}, path)
    with pytest.raises(safe_load.UntrustedCheckpoint, match="collections.deque"):
        safe_load.load_file(path)
    assert safe_load.load_file(path, trust=True)["hooks"]["Mine"]["recent"] == collections.deque([1, 2])


def test_files_that_are_not_checkpoints_are_unreadable_not_untrusted(tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint at all" * 10)
    good = tmp_path / "good.pt"
    torch.save({"w": torch.zeros(1000)}, good)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[:600])
    for path in (garbage, truncated):
        with pytest.raises(UserError, match="cannot read checkpoint") as error:
            safe_load.load_file(path)
        assert not isinstance(error.value, safe_load.UntrustedCheckpoint)
        assert "weights_only" not in str(error.value)  # torch's advice to turn the check off is not repeated


def test_hook_states_are_checked_by_name():
    safe_load.check_hook_states({"LossSpikeHook": {"mean": 0.5}, "Other": {"seen": [1, 2]}})
    with pytest.raises(UserError) as error:
        safe_load.check_hook_states({"LossSpikeHook": {"mean": 0.5}, "Mine": {"rng": np.random.get_state()}})
    message = str(error.value)
    assert message.startswith("hook Mine's state_dict() holds ['rng'][1]: numpy.ndarray")
    assert ".tolist()" in message


def test_a_written_file_holding_more_than_data_is_removed(tmp_path):
    path = tmp_path / ".step-00000001.pt.tmp"
    torch.save({"ok": 1, "bad": collections.deque()}, path)
    with pytest.raises(UserError, match="refusing to save the checkpoint of step 1: it would hold collections.deque"):
        safe_load.refuse_unsafe_file(path, "the checkpoint of step 1")
    assert not path.exists()
    torch.save({"ok": torch.zeros(2)}, path)
    safe_load.refuse_unsafe_file(path, "the checkpoint of step 1")
    assert path.exists()


# --------------------------------------------------------------------------- sharded (DCP)


def dcp_checkpoint(folder: pathlib.Path, extra: dict) -> None:
    import torch.distributed.checkpoint as dcp

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": model_state, "optimizer": optimizer_state, **extra}, checkpoint_id=str(folder), no_dist=True)


def test_dcp_metadata_and_values_read_as_data_as_dcp_reads_them(tmp_path):
    from torch.distributed.checkpoint import FileSystemReader

    dcp_checkpoint(tmp_path / "ck", {})
    ours = safe_load.storage_reader(tmp_path / "ck").read_metadata()
    theirs = FileSystemReader(str(tmp_path / "ck")).read_metadata()
    assert ours.state_dict_metadata == theirs.state_dict_metadata and ours.storage_data == theirs.storage_data
    loaded = {"model": {"weight": torch.empty(2, 3), "bias": torch.empty(2)}, "optimizer": {"param_groups": [{"lr": None}]}}
    safe_load.load_dcp(loaded, tmp_path / "ck", no_dist=True)
    assert loaded["optimizer"]["param_groups"][0]["lr"] == 0.1  # a non-tensor value, read with weights_only=True


def test_a_callable_in_dcp_values_or_metadata_is_refused_without_running(tmp_path):
    marker = tmp_path / "ran"
    dcp_checkpoint(tmp_path / "ck", {"note": RunsCode(marker)})
    with pytest.raises(safe_load.UntrustedCheckpoint, match="posix.system"):
        safe_load.load_dcp({"note": None}, tmp_path / "ck", no_dist=True)
    (tmp_path / "ck" / ".metadata").write_bytes(pickle.dumps(RunsCode(marker)))
    with pytest.raises(safe_load.UntrustedCheckpoint, match="posix.system"):
        safe_load.storage_reader(tmp_path / "ck").read_metadata()
    assert not marker.exists()


def rewrite_metadata(folder: pathlib.Path, change) -> None:
    metadata = pickle.loads((folder / ".metadata").read_bytes())  # our own test file: a plain load is fine here
    change(metadata)
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))


def test_dcp_metadata_never_reads_outside_its_folder(tmp_path):
    """``relative_path`` pointing out of the folder (to a copy of the real data file there, so
    that reading it would succeed), or through a link in it: one line naming the folder,
    trusted or not."""
    from largebatch.checkpoint import read_model_weights

    dcp_checkpoint(tmp_path / "ck", {})
    (data,) = {info.relative_path for info in safe_load.storage_reader(tmp_path / "ck").read_metadata().storage_data.values()}
    (tmp_path / "outside.distcp").write_bytes((tmp_path / "ck" / data).read_bytes())
    for name in ("../outside.distcp", str(tmp_path / "outside.distcp"), "link.distcp"):
        rewrite_metadata(tmp_path / "ck", lambda m, name=name: [setattr(info, "relative_path", name) for info in m.storage_data.values()])
        (tmp_path / "ck/link.distcp").unlink(missing_ok=True)
        (tmp_path / "ck/link.distcp").symlink_to(tmp_path / "outside.distcp")
        for trust in (False, True):
            with pytest.raises(UserError) as error:
                safe_load.load_dcp(
                    {"model": {"weight": torch.empty(2, 3), "bias": torch.empty(2)}}, tmp_path / "ck", trust=trust, no_dist=True
                )
            assert str(error.value) == (
                f"{tmp_path / 'ck'}: the checkpoint's .metadata names the data file {name!r}, which is not a file of its folder; "
                "it is damaged or was made to read other files; resume from another checkpoint"
            )
        with pytest.raises(UserError, match="not a file of its folder"):
            read_model_weights(tmp_path / "ck")


def test_dcp_metadata_claiming_more_than_its_files_hold_is_refused_before_allocating(tmp_path):
    from largebatch.checkpoint import read_model_weights

    dcp_checkpoint(tmp_path / "ck", {})
    assert read_model_weights(tmp_path / "ck")["weight"].shape == (2, 3)
    rewrite_metadata(tmp_path / "ck", lambda m: setattr(m.state_dict_metadata["model.weight"], "size", torch.Size([2**20, 2**20])))
    with pytest.raises(
        UserError, match=r"gives model.weight the size \[1048576, 1048576\] \(4398046511104 bytes\), more than its data files"
    ):
        read_model_weights(tmp_path / "ck")  # init_from: allocates the tensors the metadata names
    rewrite_metadata(tmp_path / "ck", lambda m: [setattr(info, "length", 2**40) for info in m.storage_data.values()])
    with pytest.raises(UserError, match=r"places a value at bytes \d+\.\.\+1099511627776 of"):
        read_model_weights(tmp_path / "ck")
