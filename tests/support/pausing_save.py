"""Run ``train.py`` with checkpoint writes paused halfway, for crash-during-save tests.

``torch.save`` is wrapped so that, when the checkpoint of step ``PAUSE_AT_STEP`` (from the
environment) is written, it writes the first half of the bytes to the temporary file,
fsyncs them, writes ``save-paused`` next to the checkpoints and sleeps, so the test can
``kill -9`` the process in the middle of a real checkpoint write. A sharded checkpoint
pauses after the ranks have written their slices, before ``meta.pt`` and the rename.

The pause lasts ``PAUSE_SECONDS`` (default 600: until the test kills the process); a
shorter one then finishes the write, which makes a write slow enough for a test to see
who waits for it. With ``checkpoint.async_save`` the pause happens on the writing thread
while training goes on.
"""

import io
import os
import pathlib
import sys
import time

import torch

PAUSE_AT = f"step-{int(os.environ['PAUSE_AT_STEP']):08d}.pt"
PAUSE_SECONDS = float(os.environ.get("PAUSE_SECONDS", "600"))
_save = torch.save


def pause(folder: pathlib.Path) -> None:
    (folder / "save-paused").write_text(str(os.getpid()))
    time.sleep(PAUSE_SECONDS)
    if PAUSE_SECONDS >= 600:
        raise AssertionError("the test should have killed this process")


def pausing_save(obj, f, *args, **kwargs):
    name = getattr(f, "name", "")
    if not isinstance(name, str) or not name.endswith(f".{PAUSE_AT}.tmp"):
        return _save(obj, f, *args, **kwargs)
    buffer = io.BytesIO()
    _save(obj, buffer, *args, **kwargs)
    data = buffer.getvalue()
    f.write(data[: len(data) // 2])
    f.flush()
    os.fsync(f.fileno())
    pause(pathlib.Path(name).parent)
    f.write(data[len(data) // 2 :])
    return None


torch.save = pausing_save

# Sharded checkpoints (dist.strategy fsdp/hsdp): every rank writes its slices into the
# temporary folder through torch.distributed.checkpoint.save; rank 0 then pauses before
# meta.pt and the rename, the other ranks wait for it, and the test kills them all.
import torch.distributed.checkpoint as dcp  # noqa: E402

_dcp_save = dcp.save
PAUSE_AT_FOLDER = f".{PAUSE_AT.removesuffix('.pt')}.tmp"


def pausing_dcp_save(state_dict, *args, checkpoint_id=None, **kwargs):
    result = _dcp_save(state_dict, *args, checkpoint_id=checkpoint_id, **kwargs)
    folder = pathlib.Path(str(checkpoint_id))
    if folder.name == PAUSE_AT_FOLDER and int(os.environ.get("RANK", "0")) == 0:
        pause(folder.parent)
    return result


dcp.save = pausing_dcp_save

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from largebatch.train_command import train_main  # noqa: E402

sys.exit(train_main())
