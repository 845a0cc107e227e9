"""The test Slurm cluster's shared use of munged (``tests/support/slurm_cluster.MungeUse``):
two clusters at once, as two test sessions would have, with a real process in munged's
place and real file locks."""

from __future__ import annotations

import os
import subprocess

from tests.support.slurm_cluster import MungeUse


class Daemon:
    """A process that stands where munged would: started, asked whether it answers, stopped."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def works(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> int:
        self.starts += 1
        self.process = subprocess.Popen(["sleep", "600"])
        return self.process.pid

    def stop(self, pid: int) -> None:
        assert self.process is not None and pid == self.process.pid
        self.process.terminate()
        self.process.wait(timeout=10)

    def users(self, lock) -> tuple[MungeUse, MungeUse]:
        return MungeUse(lock, self.works, self.start, self.stop), MungeUse(lock, self.works, self.start, self.stop)


def test_the_daemon_started_by_one_cluster_outlives_it_while_another_uses_it(tmp_path):
    daemon = Daemon()
    first, second = daemon.users(tmp_path / "munge.lock")
    first.acquire()
    second.acquire()
    assert daemon.starts == 1 and daemon.works()  # the second found it answering
    first.release()
    assert daemon.works()  # the starter is done, the other still uses it
    second.release()
    assert not daemon.works() and not (tmp_path / "munge.started").exists()  # the last user stopped it


def test_a_daemon_these_tests_did_not_start_is_left_running(tmp_path):
    daemon = Daemon()
    daemon.start()  # running before any cluster: the machine's own
    first, second = daemon.users(tmp_path / "munge.lock")
    first.acquire()
    second.acquire()
    second.release()
    first.release()
    assert daemon.starts == 1 and daemon.works()
    daemon.stop(daemon.process.pid)


def test_one_cluster_alone_starts_and_stops_it(tmp_path):
    daemon = Daemon()
    (only, _) = daemon.users(tmp_path / "munge.lock")
    only.acquire()
    pid = daemon.process.pid
    assert daemon.works() and (tmp_path / "munge.started").read_text() == str(pid)
    only.release()
    assert not daemon.works()
    assert not os.path.exists(f"/proc/{pid}/status") or "Z" in open(f"/proc/{pid}/status").read()
