"""A real Slurm cluster for tests: munged, slurmctld and one slurmd per node as root, their
configuration and state in a temporary folder, on free ports.

One node is this machine under its own name. Several nodes are several slurmd daemons on
this machine (``slurmd -N NODE``), each with its own port, spool folder, pid file and log
(``%n`` in ``slurm.conf``), named ``lbn1``, ``lbn2``, ...; jobs then see a multi-host
``SLURM_JOB_NODELIST`` and real ``SLURM_NODEID`` values. The node names must resolve
inside the jobs (``MASTER_ADDR`` is the first node's name): the daemons run in a private
mount namespace (``unshare --mount``) in which ``/etc/hosts`` is this machine's file plus
``127.0.0.1 lbn1 lbn2 ...``, bind-mounted from the cluster's folder. Their tasks inherit
the namespace; the machine's own ``/etc/hosts`` is never changed, and the namespace ends
with the daemons.

Debian's ``slurmctld slurmd slurm-client munge`` are installed when missing (as root).
Only the daemons started here are stopped afterwards: ``scontrol shutdown`` for Slurm,
and munged only when a cluster of these tests started it and no other cluster, in this
or another test session, still uses it (``MungeUse``).
"""

from __future__ import annotations

import fcntl
import os
import pathlib
import shutil
import socket
import subprocess
import time
from collections.abc import Callable

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
BINARIES = ("slurmctld", "slurmd", "srun", "sbatch", "scontrol", "munged")


def _which(name: str) -> str | None:
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.path.exists(p)), None)


def ensure_installed(packages: tuple[str, ...], binaries: tuple[str, ...]) -> str | None:
    """Install missing Debian packages as root; the reason they cannot be had, or None."""
    if all(_which(b) for b in binaries):
        return None
    if os.geteuid() != 0:
        return f"{', '.join(b for b in binaries if not _which(b))} missing and not root to apt-get install {' '.join(packages)}"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *packages]):
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        if result.returncode != 0:
            return f"{' '.join(cmd)} failed: {result.stderr.strip()[-500:]}"
    missing = [b for b in binaries if not _which(b)]
    return f"installed {' '.join(packages)} but {missing} still missing" if missing else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _munge_works() -> bool:
    try:
        encoded = subprocess.run(["munge", "-n"], capture_output=True, timeout=10)
        if encoded.returncode != 0:
            return False
        return subprocess.run(["unmunge"], input=encoded.stdout, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _start_munged() -> int:
    """Start the machine's munged (a key made first if there is none); its pid once it answers."""
    key = pathlib.Path("/etc/munge/munge.key")
    if not key.exists():
        subprocess.run(["mungekey", "--create"], check=True, timeout=30)
        shutil.chown(key, "munge", "munge")
    run = pathlib.Path("/run/munge")
    run.mkdir(exist_ok=True)
    shutil.chown(run, "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", _which("munged")], check=True, timeout=30)
    pid = int((run / "munged.pid").read_text())
    for _ in range(50):
        if _munge_works():
            return pid
        time.sleep(0.1)
    raise RuntimeError("munged started but munge -n | unmunge fails")


def _stop_munged(pid: int) -> None:
    """Stop munged by its pid, unless that pid is no longer munged (gone, or reused)."""
    try:
        if pathlib.Path(f"/proc/{pid}/comm").read_text().strip() == "munged":
            os.kill(pid, 15)
    except (FileNotFoundError, ProcessLookupError):
        pass


def private_hosts_reason() -> str | None:
    """Why node names cannot be given their own ``/etc/hosts`` (a mount namespace), or None."""
    probe = ["unshare", "--mount", "--propagation", "private", "--", "mount", "--bind", "/etc/hosts", "/etc/hosts"]
    try:
        result = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unshare --mount cannot run: {exc}"
    return None if result.returncode == 0 else f"unshare --mount fails: {result.stderr.strip()[-300:]}"


class MungeUse:
    """One cluster's use of the machine's munged, shared with every other cluster of these
    tests (two test sessions at once, say) through two lock files: each cluster holds a
    shared lock on ``lock`` while it uses munged; starting munged (when none answers) and
    deciding to stop it happen under an exclusive lock on ``lock`` + ``.start``, so the two
    never interleave. munged is stopped only by its last user, and only when these tests
    started it (its pid in the ``.started`` marker). Without it, one session stopping the
    munged it started broke the other's jobs.

    Args:
        lock: the lock file; the start lock and the marker go beside it.
        works: whether munged answers; start: starts it, returning its pid; stop: stops a pid.
    """

    def __init__(self, lock: pathlib.Path, works: Callable[[], bool], start: Callable[[], int], stop: Callable[[int], None]) -> None:
        self.lock, self.start_lock, self.marker = lock, lock.with_suffix(".start"), lock.with_suffix(".started")
        self.works, self.start_daemon, self.stop_daemon = works, start, stop
        self.fd: int | None = None

    def _starting(self) -> int:
        """The start lock, taken (blocks while another cluster starts or stops munged)."""
        fd = os.open(self.start_lock, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def acquire(self) -> None:
        self.lock.parent.mkdir(parents=True, exist_ok=True)
        starting = self._starting()
        try:
            if not self.works():
                self.marker.write_text(str(self.start_daemon()))
            self.fd = os.open(self.lock, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self.fd, fcntl.LOCK_SH)  # in use while this is held
        finally:
            os.close(starting)

    def release(self) -> None:
        if self.fd is None:
            return
        starting = self._starting()
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while another cluster holds it
        except BlockingIOError:
            pass
        else:
            if self.marker.exists():
                pid = int(self.marker.read_text())
                self.marker.unlink()
                self.stop_daemon(pid)
        finally:
            os.close(self.fd)
            self.fd = None
            os.close(starting)


class SlurmCluster:
    """Start with ``start()``, stop with ``stop()``; ``env()`` is what clients need.

    Args:
        folder: where the configuration, state and logs go.
        nodes: how many nodes (slurmd daemons); with more than one they are named
            ``lbn1``, ``lbn2``, ... and resolve to 127.0.0.1 inside the jobs.
    """

    def __init__(self, folder: pathlib.Path, nodes: int = 1) -> None:
        self.folder = folder
        self.conf = folder / "slurm.conf"
        self.hostname = socket.gethostname().split(".")[0]
        self.nodes = [self.hostname] if nodes == 1 else [f"lbn{i + 1}" for i in range(nodes)]
        self.munge = MungeUse(pathlib.Path("/run/lock/largebatch-tests-munge.lock"), _munge_works, _start_munged, _stop_munged)
        self.daemons: list[subprocess.Popen] = []

    def env(self, base: dict[str, str]) -> dict[str, str]:
        return {**base, "SLURM_CONF": str(self.conf)}

    def start(self) -> None:
        self.munge.acquire()
        (self.folder / "state").mkdir(parents=True, exist_ok=True)
        f = self.folder
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=largebatch-test",
                    "SlurmctldHost=localhost",
                    f"SlurmctldPort={_free_port()}",
                    f"SlurmdPort={_free_port()}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    "JobRequeue=1",
                    "KillWait=5",
                    "MinJobAge=600",
                    f"StateSaveLocation={f}/state",
                    f"SlurmdSpoolDir={f}/spool-%n",
                    f"SlurmctldPidFile={f}/slurmctld.pid",
                    f"SlurmdPidFile={f}/slurmd-%n.pid",
                    f"SlurmctldLogFile={f}/slurmctld.log",
                    f"SlurmdLogFile={f}/slurmd-%n.log",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    *self._node_lines(),
                    "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        env = self.env(dict(os.environ))
        self._start_daemon([_which("slurmctld"), "-D", "-f", str(self.conf)], "slurmctld", env)
        time.sleep(0.5)
        for node in self.nodes:
            named = ["-N", node] if len(self.nodes) > 1 else []
            self._start_daemon([_which("slurmd"), "-D", *named, "-f", str(self.conf)], f"slurmd-{node}", env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.nodes_idle():
                return
            if any(d.poll() is not None for d in self.daemons):
                break
            time.sleep(0.5)
        raise RuntimeError(f"the Slurm nodes did not become idle; see {f}/slurmctld.log and {f}/slurmd-*.log")

    def _node_lines(self) -> list[str]:
        cpus = os.cpu_count()
        if len(self.nodes) == 1:
            return [f"NodeName={self.hostname} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN"]
        # each slurmd of this machine listens on its own port; NodeHostname is the machine's name
        return [
            f"NodeName={node} NodeHostname={self.hostname} NodeAddr=127.0.0.1 Port={_free_port()} CPUs={cpus} State=UNKNOWN"
            for node in self.nodes
        ]

    def _start_daemon(self, cmd: list[str | None], name: str, env: dict[str, str]) -> None:
        if len(self.nodes) > 1:
            hosts = self.folder / "hosts"
            if not hosts.exists():
                hosts.write_text(pathlib.Path("/etc/hosts").read_text().rstrip("\n") + f"\n127.0.0.1 {' '.join(self.nodes)}\n")
            # mount the cluster's hosts file over /etc/hosts in a namespace of the daemon's own, then become the daemon
            bind = 'mount --bind "$0" /etc/hosts && exec "$@"'
            cmd = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", bind, str(hosts), *cmd]
        log = open(self.folder / f"{name}.out", "w")  # noqa: SIM115 - kept open for the daemon's life
        self.daemons.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=log))

    def run(self, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=self.env(dict(os.environ)))

    def job_field(self, job: str, field: str) -> str:
        out = self.run("scontrol", "show", "job", job).stdout
        for token in out.split():
            if token.startswith(f"{field}="):
                return token.split("=", 1)[1]
        return ""

    def nodes_idle(self) -> bool:
        """Every node idle: no job, and no step of an ended one still being cleaned up."""
        states = self.run("sinfo", "-h", "-N", "-o", "%t").stdout.split()
        return states == ["idle"] * len(self.nodes)

    def diagnosis(self, job: str) -> str:
        """The job's record and the last lines of the daemons' logs, for a failure message."""
        parts = [self.run("scontrol", "show", "job", job).stdout]
        for log in sorted(self.folder.glob("slurm*.log")):
            lines = [line for line in log.read_text(errors="replace").splitlines() if "debug" not in line]
            parts.append(f"--- {log.name}\n" + "\n".join(lines[-25:]))
        return "\n".join(parts)

    def stop(self) -> None:
        if self.daemons:
            self.run("scontrol", "shutdown")
            for daemon in self.daemons:
                try:
                    daemon.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait(timeout=10)
        self.munge.release()
