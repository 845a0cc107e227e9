"""Checkpoints are data: read without running code, written only with what reads back so.

``torch.load`` unpickles, and a pickle can call any function while it loads, so a
checkpoint from someone else could run code on ``--resume``. Every checkpoint file is
therefore read with ``weights_only=True``: tensors and plain values only (None, bool, int,
float, complex, str, bytes, bytearray; dicts, lists, tuples and sets of them; torch dtypes,
devices and sizes). What a largebatch checkpoint holds (weights, optimizer state,
counters, the non-finite check's counts, each hook's state, the config) is all of that
kind; no random generator state is saved (``largebatch.randomness``). A checkpoint that
needs more is refused with ``UntrustedCheckpoint``, one line naming the file, what it
holds and the flag that trusts it (``--trust-checkpoint``, off by default).

A sharded (DCP) checkpoint has two more pickles: DCP's ``.metadata`` (a ``Metadata``
dataclass), read here with an unpickler that resolves only the classes in
``DCP_METADATA_GLOBALS``, the one allow-list of this project, and the small non-tensor
values of the optimizer's state (learning rates, betas), each read with
``weights_only=True`` (``storage_reader``, ``load_dcp``).

Saving checks the other way round: ``check_hook_states`` names a hook whose
``state_dict()`` returns something a checkpoint read this way could not hold, at the save
and not at the resume, and ``refuse_unsafe_file`` checks the written file itself before it
gets its name.
"""

from __future__ import annotations

import collections
import io
import os
import pathlib
import pickle
import re
import warnings
from typing import IO, Any

import torch

from largebatch.errors import UserError

TRUST_FLAG = "--trust-checkpoint"

# Leaf values a weights_only load accepts as they are (exact types: a subclass such as
# numpy.float64 or an IntEnum is pickled under its own class and refused).
PLAIN_VALUES = (type(None), bool, int, float, complex, str, bytes, bytearray, torch.dtype, torch.device, torch.Size)
PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)

# The classes DCP's ``.metadata`` pickle names (torch 2.14): its metadata dataclasses,
# tensor sizes, dtypes and layouts, and the checkpoint's path.
DCP_METADATA_GLOBALS = frozenset(
    {
        ("torch.distributed.checkpoint.metadata", "Metadata"),
        ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "TensorProperties"),
        ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
        ("torch.distributed.checkpoint.metadata", "StorageMeta"),
        ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),
        ("torch", "Size"),
        ("pathlib", "PosixPath"),
        ("pathlib", "WindowsPath"),
    }
)

_UNSUPPORTED_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


class UntrustedCheckpoint(UserError):
    """A checkpoint holding more than tensors and plain values: refused unless trusted."""


def untrusted(path: str | os.PathLike[str], names: list[str]) -> UntrustedCheckpoint:
    shown = ", ".join(sorted(set(names))[:3]) or "objects other than tensors and plain values"
    return UntrustedCheckpoint(
        f"refusing to load this checkpoint: besides tensors and plain values it holds {shown}, which loading would run as "
        f"code; resume only from checkpoints you made, or, if you trust this file and where it came from, pass {TRUST_FLAG}",
        path=str(path),
    )


def _first_line(text: str, limit: int = 160) -> str:
    first = (text.strip().splitlines() or [""])[0]
    return first if len(first) <= limit else first[: limit - 3] + "..."


def load_file(path: pathlib.Path, *, trust: bool = False) -> Any:
    """``torch.load`` of a checkpoint file to the CPU, with ``weights_only=True`` unless
    ``trust``.

    Raises:
        UntrustedCheckpoint: the file names a class or function a weights-only load refuses.
        UserError: the file is not one ``torch.save`` wrote (garbage, truncated).
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=not trust)
    except pickle.UnpicklingError as exc:
        names = _UNSUPPORTED_GLOBAL.findall(str(exc))
        if names:
            raise untrusted(path, names) from exc
        detail = str(exc).split("WeightsUnpickler error:")[-1]  # after torch's advice, which does not apply here
        raise UserError(
            f"cannot read checkpoint ({type(exc).__name__}: {_first_line(detail)}); resume from an earlier one", path=str(path)
        ) from exc
    except Exception as exc:  # noqa: BLE001 - any unreadable file is reported the same way
        raise UserError(
            f"cannot read checkpoint ({type(exc).__name__}: {_first_line(str(exc))}); resume from an earlier one", path=str(path)
        ) from exc


def not_plain(value: Any, where: str = "") -> str | None:
    """Where ``value`` holds something a weights-only load refuses, and what:
    ``"['mean']: numpy.float64"``; None when it is all tensors and plain values."""
    kind = type(value)
    if kind in PLAIN_VALUES or kind in PLAIN_TENSORS:
        return None
    if kind in (dict, collections.OrderedDict):
        for key, item in value.items():
            found = not_plain(key, f"{where} (a key)") or not_plain(item, f"{where}[{key!r}]")
            if found:
                return found
        return None
    if kind in (list, tuple, set):
        for i, item in enumerate(value):
            found = not_plain(item, f"{where}[{i}]")
            if found:
                return found
        return None
    return f"{where or 'the value'}: {kind.__module__}.{kind.__qualname__}"


def check_hook_states(states: dict[str, Any]) -> None:
    """Every hook's state (``hook_states``) must read back with ``weights_only=True``.

    Raises:
        UserError: naming the first hook whose ``state_dict()`` holds something else, where
            and what it is, and what to return instead.
    """
    for name, state in states.items():
        found = not_plain(state)
        if found:
            raise UserError(
                f"hook {name}'s state_dict() holds {found}, which a checkpoint does not store (it is read back as data, "
                "without running code); return tensors and plain values: numbers, strings, lists and dicts of them "
                "(float(x), array.tolist(), torch.from_numpy(array))"
            )


def unsafe_globals(path: pathlib.Path) -> list[str]:
    """The classes and functions a written checkpoint file names beyond what a weights-only
    load accepts (empty when it reads back as data)."""
    return torch.serialization.get_unsafe_globals_in_checkpoint(path)


def refuse_unsafe_file(path: pathlib.Path, what: str) -> None:
    """Remove ``path`` and raise when it would not read back as data (the last check
    before a checkpoint gets its name: ``check_hook_states`` names hooks, this covers the
    rest of what is saved).

    Raises:
        UserError: naming what the file would hold.
    """
    names = unsafe_globals(path)
    if names:
        path.unlink(missing_ok=True)
        raise UserError(
            f"refusing to save {what}: it would hold {', '.join(names[:3])}, which a checkpoint does not store (it is read "
            "back as data, without running code); keep such objects out of hook and optimizer state"
        )


# --------------------------------------------------------------------------- safetensors files


def _safetensors_error(path: pathlib.Path, exc: Exception) -> UserError:
    return UserError(
        f"not a readable safetensors file ({_first_line(str(exc))}); point at the model.safetensors of a finished run "
        "or an export folder, or write the file again",
        path=str(path),
    )


def safetensors_dtypes(path: pathlib.Path) -> dict[str, str]:
    """Each tensor's dtype in a ``.safetensors`` file as the file names it (``F32``, ``I8``:
    ``SAFETENSORS_DTYPE_NAMES``), from its header alone (the safetensors library checks the
    header: its size, its JSON and that the offsets cover the file).

    Raises:
        UserError: the header is malformed, oversized, or does not fit the file.
    """
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {key: f.get_slice(key).get_dtype() for key in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError) as exc:
        raise _safetensors_error(path, exc) from exc


def read_safetensors(path: pathlib.Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file, on the CPU.

    Raises:
        UserError: the file is not a well-formed safetensors file.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise _safetensors_error(path, exc) from exc


# torch's dtypes by the names a safetensors header gives them
SAFETENSORS_DTYPE_NAMES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


# --------------------------------------------------------------------------- sharded (DCP) checkpoints


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only ``DCP_METADATA_GLOBALS`` and torch's dtypes: nothing else can be called."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in DCP_METADATA_GLOBALS or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"unsupported GLOBAL {module}.{name}")


def read_dcp_metadata(stream: IO[bytes], path: str | os.PathLike[str]) -> Any:
    """DCP's ``Metadata`` from an open ``.metadata`` file, as data.

    Raises:
        UntrustedCheckpoint: it names a class outside ``DCP_METADATA_GLOBALS``.
    """
    try:
        return _MetadataUnpickler(stream).load()
    except pickle.UnpicklingError as exc:
        raise untrusted(path, _UNSUPPORTED_GLOBAL.findall(str(exc))) from exc


def storage_reader(path: pathlib.Path, *, trust: bool = False) -> Any:
    """A DCP ``FileSystemReader`` of ``path`` whose metadata is read as data (unless
    ``trust``) and checked before anything else is read (``check_dcp_metadata``, trusted or not)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class CheckedMetadataReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            if trust:
                metadata = super().read_metadata(*args, **kwargs)
            else:
                rank = kwargs.get("rank")
                name = ".metadata" if rank is None else f"__{rank}.metadata"
                with open(pathlib.Path(self.path) / name, "rb") as stream:
                    metadata = read_dcp_metadata(stream, path)
                if getattr(metadata, "storage_meta", None) is None:
                    metadata.storage_meta = StorageMeta()
                metadata.storage_meta.load_id = self.load_id
            check_dcp_metadata(metadata, path)
            return metadata

    return CheckedMetadataReader(str(path))


def check_dcp_metadata(metadata: Any, folder: pathlib.Path) -> None:
    """DCP's metadata must describe the files of its own folder: each data file a plain name
    in it (DCP would open ``relative_path`` joined to the folder, so ``../../etc/hostname``
    reads outside), each stored slice within its file, and no tensor larger than the data
    files hold (a size claiming 2^40 elements would be allocated before anything is read).

    Raises:
        UserError: naming the folder and what the metadata claims.
    """
    root = pathlib.Path(folder).resolve()
    damaged = "it is damaged or was made to read other files; resume from another checkpoint"
    sizes: dict[str, int] = {}
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        name = getattr(info, "relative_path", None)
        plain = isinstance(name, str) and name not in ("", ".", "..") and pathlib.PurePath(name).name == name
        if not plain or name not in sizes:
            target = (root / name).resolve() if plain else root
            if target.parent != root or not target.is_file():
                raise UserError(
                    f"the checkpoint's .metadata names the data file {name!r}, which is not a file of its folder; {damaged}",
                    path=str(folder),
                )
            sizes[name] = target.stat().st_size
        offset, length = getattr(info, "offset", -1), getattr(info, "length", -1)
        if not (isinstance(offset, int) and isinstance(length, int) and 0 <= offset and 0 <= length and offset + length <= sizes[name]):
            raise UserError(
                f"the checkpoint's .metadata places a value at bytes {offset}..+{length} of {name}, which holds {sizes[name]}; {damaged}",
                path=str(folder),
            )
    stored = sum(sizes.values())
    for key, entry in (getattr(metadata, "state_dict_metadata", None) or {}).items():
        size = getattr(entry, "size", None)
        if size is None:
            continue  # a non-tensor value
        extents = list(size) if isinstance(size, (tuple, list)) else [-1]
        numel = 1
        for extent in extents:
            numel *= extent if isinstance(extent, int) and not isinstance(extent, bool) and extent >= 0 else -1
        dtype = getattr(getattr(entry, "properties", None), "dtype", None)
        itemsize = dtype.itemsize if isinstance(dtype, torch.dtype) else 1
        if numel < 0 or numel * itemsize > stored:
            raise UserError(
                f"the checkpoint's .metadata gives {key} the size {extents if isinstance(size, (tuple, list)) else size!r} ({max(numel, 0) * itemsize} bytes), more than "
                f"its data files hold ({stored} bytes); {damaged}",
                path=str(folder),
            )


def _load_planner(path: pathlib.Path, *, trust: bool = False) -> Any:
    """A DCP load planner whose non-tensor values are read with ``weights_only=True``
    (unless ``trust``)."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    if trust:
        return DefaultLoadPlanner()

    class PlainBytesPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            # DCP unpickles these values without restriction: they are checked first, and
            # the same in-memory bytes are then stored by DCP's own code.
            try:
                torch.load(value, weights_only=True)
            except pickle.UnpicklingError as exc:
                raise untrusted(path, _UNSUPPORTED_GLOBAL.findall(str(exc))) from exc
            value.seek(0)
            super().load_bytes(read_item, value)

    return PlainBytesPlanner()


def load_dcp(state_dict: dict[str, Any], path: pathlib.Path, *, trust: bool = False, no_dist: bool = False) -> None:
    """``torch.distributed.checkpoint.load`` of ``path`` into ``state_dict``, as data unless
    ``trust`` (``storage_reader``, ``_load_planner``).

    Raises:
        UserError: the metadata does not describe its folder (``check_dcp_metadata``), or
            the checkpoint holds more than data (DCP reports it from the rank that read it,
            to every rank).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    reader = storage_reader(path, trust=trust)
    reader.read_metadata()  # checked here first: inside dcp.load a refusal becomes part of another error
    try:
        with warnings.catch_warnings():
            if no_dist:  # asked for: DCP's warning that it assumes one process says nothing new
                warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
            dcp.load(state_dict, storage_reader=reader, planner=_load_planner(path, trust=trust), no_dist=no_dist)
    except CheckpointException as exc:  # a BaseException wrapping each rank's failure
        for failure, _ in exc.failures.values():
            if isinstance(failure, UserError):
                raise failure from exc
        raise
