"""Preemption: finish the optimizer step, checkpoint, exit with ``EXIT_REQUEUE``.

Clusters warn a job before they stop it. Slurm sends the signal named by
``sbatch --signal=USR1@120`` that many seconds before the time limit (and SIGTERM when it
preempts or cancels a job, ``KillWait`` seconds before SIGKILL); ``scancel --signal=USR1``
sends it by hand; submitit asks for SIGUSR2 by default. On SIGUSR1, SIGUSR2 or SIGTERM a
run:

1. notes the signal (the handler only sets a flag, so the micro-step in flight finishes);
2. at the next optimizer-step boundary stops there (one process), or all-reduces the flag
   with the other ranks and reads it on the host a step later
   (``largebatch.hooks.preemption``), so every rank stops after the same step, the one
   after the signal, even when only some of them received it;
3. writes a checkpoint of that step, skips the end-of-run evaluation and final weights;
4. on rank 0, with ``slurm.requeue = True`` inside a Slurm job, runs
   ``scontrol requeue $SLURM_JOB_ID`` (the job keeps its id, so a run directory named
   after it is found again, and ``--resume auto`` continues from the checkpoint);
5. exits with ``EXIT_REQUEUE`` (75, ``EX_TEMPFAIL`` of ``sysexits.h``: "try again
   later"), which a batch script can test to requeue the job itself.

This module imports nothing heavy: ``train.py`` and the ``largebatch`` command install the
handlers before torch and timm are imported, because a signal that arrives before Python
has a handler for it kills the process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading

EXIT_REQUEUE = 75
"""Exit status of a run that stopped on a preemption signal after checkpointing: requeue it."""

PREEMPTION_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)

_received: list[str] = []


def _on_signal(signum: int, frame: object) -> None:
    name = signal.Signals(signum).name
    if not _received:
        # os.write, not print: a handler may interrupt a print of the main thread.
        os.write(2, f"largebatch: received {name}; stopping at an optimizer-step boundary to checkpoint\n".encode())
    _received.append(name)


def install_signal_handlers() -> bool:
    """Handle SIGUSR1, SIGUSR2 and SIGTERM by requesting a stop (call first thing in the process).

    Returns:
        Whether the handlers were installed (only the main thread can install them).
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    for sig in PREEMPTION_SIGNALS:
        signal.signal(sig, _on_signal)
    return True


def received_signal() -> str | None:
    """The name of the first preemption signal this process received, or None."""
    return _received[0] if _received else None


def clear() -> None:
    """Forget received signals (for runs started again in the same process)."""
    _received.clear()


def requeue_slurm_job(env: dict[str, str] | None = None) -> bool:
    """Run ``scontrol requeue $SLURM_JOB_ID``; print why when it cannot.

    Returns:
        Whether Slurm accepted the requeue.
    """
    env = dict(os.environ if env is None else env)
    job = env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID") and f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    job = job or env.get("SLURM_JOB_ID")
    if not job:
        print("largebatch: slurm.requeue is set but SLURM_JOB_ID is not: not inside a Slurm job, nothing to requeue", flush=True)
        return False
    try:
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"largebatch: scontrol requeue {job} failed ({exc}); requeue the job by hand", flush=True)
        return False
    if result.returncode != 0:
        print(f"largebatch: scontrol requeue {job} failed: {result.stderr.strip()}; requeue the job by hand", flush=True)
        return False
    print(f"largebatch: requeued Slurm job {job}", flush=True)
    return True
