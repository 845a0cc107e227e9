"""One worker of a (re)started two-rank job: joins the process group through
``largebatch.dist``, all-reduces ``rank + 1`` and writes the sum to
``OUT/<attempt>-rank<rank>``, where the attempt is ``$ATTEMPT`` or
``restart<TORCHELASTIC_RESTART_COUNT>``.

Environment switches:
    RANK0_JOIN_DELAY: seconds rank 0 waits before joining in a restarted attempt
        (``TORCHELASTIC_RESTART_COUNT`` other than 0), so rank 1 reaches the store first.
    KILL_RANK1: in the first attempt, rank 1 ``kill -9``s itself after the all-reduce
        and rank 0 waits to be stopped: a lost process.
    ABRUPT_EXIT: end without ``destroy_process_group()``, leaving this attempt's keys in
        the store as a killed process does.
"""

import os
import pathlib
import signal
import sys
import time

import torch

from largebatch.dist import all_reduce_sum, destroy_process_group, discover, init_process_group


def main() -> None:
    out = pathlib.Path(sys.argv[1])
    restarts = os.environ["TORCHELASTIC_RESTART_COUNT"]
    attempt = os.environ.get("ATTEMPT", f"restart{restarts}")
    info = discover()
    if info.rank == 0 and restarts != "0":
        time.sleep(float(os.environ.get("RANK0_JOIN_DELAY", "0")))
    init_process_group(info, "gloo", timeout_minutes=0.5)
    total = all_reduce_sum(torch.tensor([info.rank + 1]))
    (out / f"{attempt}-rank{info.rank}").write_text(str(int(total.item())))
    if os.environ.get("KILL_RANK1") and restarts == "0":
        if info.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)
    if os.environ.get("ABRUPT_EXIT"):
        os._exit(0)  # no destroy_process_group(), as a killed process
    destroy_process_group()


if __name__ == "__main__":
    main()
