"""One job per shard, in this process or in a pool of worker processes.

``largebatch data convert | index | verify`` work shard by shard, and shards are
independent, so ``--workers N`` runs N shards at once. What they leave behind does not
depend on N: each shard's bytes are a function of its samples alone, and a problem is
reported exactly as one worker would report it. Jobs start in order, so when one fails,
every earlier job has started; the pool lets the running ones finish, cancels the rest
and raises the error of the earliest job that failed: the first problem in shard order,
as a serial run finds it.

Workers are started by a fork server (not forked from a process that may hold threads)
and report progress through a shared counter, which the parent shows on its bar.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from tqdm import tqdm

from largebatch.errors import UserError

MAX_DEFAULT_WORKERS = 8

Tick = Callable[[int], None]

_counter: Any = None  # a worker's shared progress counter (set by _start_worker)


def default_workers() -> int:
    """The CPUs this process may use, at most 8: the commands' default ``--workers``."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count() or 1
    return max(1, min(MAX_DEFAULT_WORKERS, usable))


def _start_worker(counter: Any) -> None:
    global _counter
    _counter = counter


def _shared_tick(count: int) -> None:
    with _counter.get_lock():
        _counter.value += count


def run_jobs(
    job: Callable[..., Any],
    jobs: Sequence[tuple],
    *,
    workers: int = 1,
    bar: tqdm | None = None,
) -> list[Any]:
    """``job(*args, tick)`` for each ``args`` in ``jobs``; their results, in ``jobs``' order.

    ``tick(n)`` moves ``bar`` on by ``n``. With ``workers`` above 1 (and more than one
    job) the jobs run in that many processes: ``job`` and its arguments must then be
    picklable (a module-level function, no closures).

    Raises:
        The exception of the earliest job (in ``jobs``' order) that raised one; jobs after
        it may or may not have run.
        UserError: a worker process died (killed, out of memory) before its job ended.
    """
    tick: Tick = bar.update if bar is not None else _no_tick
    workers = min(workers, len(jobs))
    if workers <= 1:
        return [job(*args, tick) for args in jobs]
    context = multiprocessing.get_context("forkserver")
    counter = context.Value("q", 0)
    shown = 0
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker, initargs=(counter,))
    try:
        futures = [pool.submit(job, *args, _shared_tick) for args in jobs]
        pending: set[Future] = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
            shown = _show(counter, shown, tick)
            if any(f.exception() is not None for f in done):
                for future in pending:
                    future.cancel()  # not started yet: never will; running ones finish
                wait(pending)
                break
        _show(counter, shown, tick)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    for future in futures:
        if future.done() and not future.cancelled() and future.exception() is not None:
            error = future.exception()
            if isinstance(error, BrokenProcessPool):
                raise UserError(
                    f"a worker process died before its job ended ({error}); what was finished is kept: "
                    "run the command again, with fewer --workers if memory ran out"
                ) from error
            raise error  # type: ignore[misc]
    return [future.result() for future in futures]


def _show(counter: Any, shown: int, tick: Tick) -> int:
    value = counter.value
    if value > shown:
        tick(value - shown)
    return value


def _no_tick(count: int) -> None:
    pass
