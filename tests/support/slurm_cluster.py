"""A real one-node Slurm cluster for tests: munged, slurmctld and slurmd as root, their
configuration and state in a temporary folder, on free ports.

Debian's ``slurmctld slurmd slurm-client munge`` are installed when missing (as root).
Only the daemons started here are stopped afterwards: ``scontrol shutdown`` for Slurm,
and munged only when this module started it.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import subprocess
import time

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


class SlurmCluster:
    """Start with ``start()``, stop with ``stop()``; ``env()`` is what clients need."""

    def __init__(self, folder: pathlib.Path) -> None:
        self.folder = folder
        self.conf = folder / "slurm.conf"
        self.node = socket.gethostname().split(".")[0]
        self.munged_pid: int | None = None
        self.daemons: list[subprocess.Popen] = []

    def env(self, base: dict[str, str]) -> dict[str, str]:
        return {**base, "SLURM_CONF": str(self.conf)}

    def _start_munge(self) -> None:
        if _munge_works():
            return
        key = pathlib.Path("/etc/munge/munge.key")
        if not key.exists():
            subprocess.run(["mungekey", "--create"], check=True, timeout=30)
            shutil.chown(key, "munge", "munge")
        run = pathlib.Path("/run/munge")
        run.mkdir(exist_ok=True)
        shutil.chown(run, "munge", "munge")
        subprocess.run(["runuser", "-u", "munge", "--", _which("munged")], check=True, timeout=30)
        self.munged_pid = int((run / "munged.pid").read_text())
        for _ in range(50):
            if _munge_works():
                return
            time.sleep(0.1)
        raise RuntimeError("munged started but munge -n | unmunge fails")

    def start(self) -> None:
        self._start_munge()
        for sub in ("state", "spool"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
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
                    f"SlurmdSpoolDir={f}/spool",
                    f"SlurmctldPidFile={f}/slurmctld.pid",
                    f"SlurmdPidFile={f}/slurmd.pid",
                    f"SlurmctldLogFile={f}/slurmctld.log",
                    f"SlurmdLogFile={f}/slurmd.log",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN",
                    "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        env = self.env(dict(os.environ))
        for daemon in ("slurmctld", "slurmd"):
            log = open(f / f"{daemon}.out", "w")  # noqa: SIM115 - kept open for the daemon's life
            self.daemons.append(subprocess.Popen([_which(daemon), "-D", "-f", str(self.conf)], env=env, stdout=log, stderr=log))
            time.sleep(0.5 if daemon == "slurmctld" else 0)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = self.run("sinfo", "-h", "-o", "%t").stdout.strip()
            if state == "idle":
                return
            if any(d.poll() is not None for d in self.daemons):
                break
            time.sleep(0.5)
        raise RuntimeError(f"the Slurm node did not become idle; see {f}/slurmctld.log and {f}/slurmd.log")

    def run(self, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=self.env(dict(os.environ)))

    def job_field(self, job: str, field: str) -> str:
        out = self.run("scontrol", "show", "job", job).stdout
        for token in out.split():
            if token.startswith(f"{field}="):
                return token.split("=", 1)[1]
        return ""

    def stop(self) -> None:
        if self.daemons:
            self.run("scontrol", "shutdown")
            for daemon in self.daemons:
                try:
                    daemon.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait(timeout=10)
        if self.munged_pid is not None:
            try:
                os.kill(self.munged_pid, 15)
            except ProcessLookupError:
                pass
