"""Process-group setup across restarts: the ranks of a restarted job must not read the
addresses that the previous attempt's processes left in the elastic agent's store."""

import datetime
import subprocess

import pytest
import torch.distributed as torch_dist

from tests.conftest import PYTHON, REPO, TORCHRUN, clean_env

WORKER = str(REPO / "tests/support/restart_worker.py")


def _run_attempt(out, port, attempt, restart_counts, **extra):
    """Two workers that use the store at ``port`` as torchrun's agent store."""
    procs = []
    for rank, restarts in enumerate(restart_counts):
        env = clean_env(
            RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            TORCHELASTIC_USE_AGENT_STORE="True",
            TORCHELASTIC_RESTART_COUNT=restarts,
            ATTEMPT=attempt,
            **extra,
        )
        procs.append(
            subprocess.Popen([PYTHON, WORKER, str(out)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-2000:] for o in outputs)


@pytest.mark.dist
@pytest.mark.slow
def test_restarted_attempts_on_the_same_agent_store_ignore_earlier_attempts_keys(tmp_path):
    """The store outlives each attempt, as torchrun's does, and every attempt's processes
    end without cleaning up, as killed ones do. In each restarted attempt rank 0 joins 2 s
    late, so rank 1 finds rank 0's old address in the store (gloo then connects to it or
    waits for rank 0 to connect, depending on how the two addresses compare: three
    attempts, so that a wrong address is used in at least one), and the ranks disagree on
    the restart count, as on two nodes whose agents restarted for different reasons."""
    store = torch_dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60))
    attempts = ["first", "second", "third", "fourth"]
    for restarts, attempt in enumerate(attempts):
        _run_attempt(tmp_path, store.port, attempt, [str(restarts), "0"], ABRUPT_EXIT="1", RANK0_JOIN_DELAY="2")
    results = {path.name: path.read_text() for path in tmp_path.iterdir()}
    assert results == {f"{attempt}-rank{rank}": "3" for attempt in attempts for rank in (0, 1)}


@pytest.mark.dist
@pytest.mark.slow
def test_torchrun_restart_after_a_lost_rank_connects_when_rank_0_is_late(tmp_path):
    """``kill -9`` of rank 1; torchrun restarts both workers and the new rank 0 joins 3 s
    after the new rank 1 (which, reading the store first, used to connect to the killed
    attempt's rank 0 and fail with 'Connection refused')."""
    cmd = [TORCHRUN, "--standalone", "--nproc_per_node=2", "--max-restarts=1", WORKER, str(tmp_path)]
    env = clean_env(KILL_RANK1="1", RANK0_JOIN_DELAY="3")
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = {path.name: path.read_text() for path in tmp_path.iterdir()}
    assert results == {f"restart{attempt}-rank{rank}": "3" for attempt in (0, 1) for rank in (0, 1)}
