"""The per-shard job runner behind ``--workers``: results in order, the earliest error."""

from __future__ import annotations

import os
import signal
import time

import pytest

from largebatch.errors import DataError, UserError
from largebatch.shards.pool import default_workers, run_jobs


def square(number: int, delay: float, tick) -> tuple[int, int]:
    time.sleep(delay)
    tick(number)
    return number * number, os.getpid()


def fail_some(number: int, tick) -> int:
    if number == 1:
        time.sleep(1.0)  # the earlier failure is the later to happen
        raise DataError(f"record {number} is bad", path=f"shard-{number}")
    if number == 3:
        raise DataError(f"record {number} is bad", path=f"shard-{number}")
    tick(1)
    return number


def test_results_come_back_in_job_order_from_several_processes():
    ticks = []
    jobs = [(n, 0.3 if n == 0 else 0.0) for n in range(5)]
    serial = run_jobs(square, jobs, workers=1)
    parallel = run_jobs(square, jobs, workers=3)
    assert [r for r, _ in parallel] == [r for r, _ in serial] == [0, 1, 4, 9, 16]
    assert {pid for _, pid in serial} == {os.getpid()}
    assert os.getpid() not in {pid for _, pid in parallel} and len({pid for _, pid in parallel}) > 1

    class Bar:
        def update(self, count):
            ticks.append(count)

    run_jobs(square, jobs, workers=2, bar=Bar())  # type: ignore[arg-type]
    assert sum(ticks) == 0 + 1 + 2 + 3 + 4


@pytest.mark.parametrize("workers", [1, 4])
def test_the_earliest_jobs_error_is_raised_not_the_first_to_happen(workers):
    with pytest.raises(DataError) as error:
        run_jobs(fail_some, [(n,) for n in range(6)], workers=workers)
    assert str(error.value) == "shard-1: record 1 is bad"


def die(number: int, tick) -> int:
    if number == 2:
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer does
    return number


def test_a_worker_killed_mid_job_is_one_user_error():
    with pytest.raises(UserError, match=r"^a worker process died before its job ended .*run the command again"):
        run_jobs(die, [(n,) for n in range(4)], workers=2)


def test_default_workers_is_the_usable_cpus_at_most_eight():
    assert default_workers() == min(8, len(os.sched_getaffinity(0)))
