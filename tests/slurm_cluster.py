"""A real one-node SLURM cluster for the tests, started from Debian's packages (``slurmctld slurmd
slurm-client munge``; ``.ci/run`` installs them): a private munged on its own socket, then slurmctld and
slurmd on free ports with a generated ``slurm.conf`` (this machine's CPUs, one partition ``debug``), all
under one temporary folder and stopped at the end. The clients (``sbatch``, ``sinfo``, and the tests'
``dmlbench`` processes) reach it through ``SLURM_CONF``.

Where it cannot start (not root, a package missing) the SLURM tests are skipped with the reason; with
``DMLBENCH_REQUIRE_SLURM`` set (``.ci/run`` sets it) they fail instead.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PARTITION = "debug"
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo", "scontrol", "srun")
MUNGE_KEY = Path("/etc/munge/munge.key")


def missing_reason() -> str | None:
    """Why no cluster can start here, or ``None``."""
    if os.geteuid() != 0:
        return "a test SLURM cluster is started as root (its daemons run as root and munge)"
    absent = [name for name in DAEMONS if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]
    if absent:
        return f"SLURM is not installed ({', '.join(absent)} missing): apt-get install slurmctld slurmd slurm-client munge"
    if not MUNGE_KEY.is_file():
        return f"no munge key at {MUNGE_KEY} (Debian's munge package creates it)"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _config(base: Path, munge_socket: Path) -> str:
    host = socket.gethostname().split(".")[0]
    cpus = os.cpu_count() or 1
    return "\n".join([
        "ClusterName=dmlbenchtest", f"SlurmctldHost={host}", "SlurmUser=root", "SlurmdUser=root",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={base / 'state'}", f"SlurmdSpoolDir={base / 'spool'}",
        f"SlurmctldPidFile={base / 'slurmctld.pid'}", f"SlurmdPidFile={base / 'slurmd.pid'}",
        f"SlurmctldLogFile={base / 'slurmctld.log'}", f"SlurmdLogFile={base / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "SchedulerType=sched/backfill",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "ReturnToService=2", "MinJobAge=600", "KillWait=10",
        f"NodeName={host} CPUs={cpus} State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""])


@contextmanager
def running_cluster(base: Path) -> Iterator[dict[str, str]]:
    """Start the cluster in ``base``; yields the environment its clients need (``SLURM_CONF``)."""
    for name in ("state", "spool"):
        (base / name).mkdir(parents=True, exist_ok=True)
    # munged runs as the munge user: its folder cannot be inside pytest's (root's, mode 0700).
    munge = Path(tempfile.mkdtemp(prefix="dmlbench-munge-"))
    munge.chmod(0o755)
    shutil.chown(munge, "munge", "munge")
    munge_socket = munge / "munge.socket"
    conf = base / "slurm.conf"
    conf.write_text(_config(base, munge_socket))
    environment = {**os.environ, "SLURM_CONF": str(conf)}
    started: list[Path] = []
    try:
        subprocess.run(["runuser", "-u", "munge", "--", _binary("munged"), f"--socket={munge_socket}",
                        f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
                        f"--seed-file={munge / 'munged.seed'}"], check=True, capture_output=True, timeout=30)
        started.append(munge / "munged.pid")
        for daemon in ("slurmctld", "slurmd"):
            subprocess.run([_binary(daemon), "-f", str(conf)], check=True, capture_output=True, env=environment, timeout=30)
            started.append(base / f"{daemon}.pid")
        _wait_idle(environment, base)
        yield {"SLURM_CONF": str(conf)}
    finally:
        subprocess.run(["scancel", "--full", "--user=root"], env=environment, capture_output=True, timeout=30)
        for pid_file in reversed(started):
            _stop(pid_file)
        shutil.rmtree(munge, ignore_errors=True)


def _wait_idle(environment: dict[str, str], base: Path, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        completed = subprocess.run(["sinfo", "--noheader", "--format=%t"], env=environment, capture_output=True, text=True)
        if completed.returncode == 0 and completed.stdout.strip() in ("idle", "mix", "alloc"):
            return
        time.sleep(0.5)
    logs = "\n".join(path.read_text()[-2000:] for path in (base / "slurmctld.log", base / "slurmd.log") if path.is_file())
    raise RuntimeError(f"the test SLURM cluster did not come up within {seconds:.0f} s:\n{logs}")


def _stop(pid_file: Path) -> None:
    """Stop the daemon whose pid ``pid_file`` holds and wait until it is gone."""
    try:
        pid = int(pid_file.read_text().split()[0])
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError, IndexError):
        return
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
