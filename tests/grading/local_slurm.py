"""A real one-node Slurm cluster on localhost for tests: munged, slurmctld and slurmd from Debian's packages
(`slurm-wlm`, `munge`; .ci/run installs them), started by hand with every file in one temporary folder.

No systemd and nothing under /etc: munged gets its own key and socket, Slurm finds its config through
``SLURM_CONF`` and the munge socket through ``AuthInfo=socket=...``; the ports are free ones picked at
start, so several test runs can share a machine. slurmd launches jobs as the submitting user, so this
needs root. The node advertises ``cpus`` CPUs (``SlurmdParameters=config_overrides``): on a 2-core CI
machine the tasks of a small job array then run at once, sharing the real cores.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PACKAGES = {"munged": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd", "sbatch": "slurm-client"}
NODE = "ptgnode"


def missing() -> str | None:
    """Why this machine cannot run the cluster (None if it can)."""
    if os.geteuid() != 0:
        return "a local Slurm needs root (slurmd launches jobs as the submitting user)"
    lost = [pkg for exe, pkg in PACKAGES.items() if not shutil.which(exe, path=os.environ.get("PATH", "") + ":/usr/sbin")]
    if lost:
        return f"Slurm is not installed: apt-get install slurm-wlm munge (missing {', '.join(sorted(set(lost)))})"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exe(name: str) -> str:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/usr/bin") or name


class LocalSlurm:
    def __init__(self, cpus: int = 6, memory_mb: int = 6144):
        self.base = Path(tempfile.mkdtemp(prefix="ptg-slurm-"))
        os.chmod(self.base, 0o755)  # munged insists that other users can reach its socket
        self.cpus, self.memory_mb = cpus, memory_mb
        self.conf = self.base / "slurm.conf"
        self.env = {"SLURM_CONF": str(self.conf)}
        self._daemons: list[subprocess.Popen] = []

    # ---- start and stop -------------------------------------------------------------------------------
    def start(self, timeout_s: float = 60) -> LocalSlurm:
        b = self.base
        for d, mode in (("munge", 0o700), ("run", 0o755), ("state", 0o700), ("spool", 0o755), ("log", 0o755)):
            (b / d).mkdir(mode=mode)
        key = b / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = b / "run" / "munge.sock"
        self._spawn([_exe("munged"), "-F", f"--socket={sock}", f"--key-file={key}", f"--log-file={b / 'log/munged.log'}",
                     f"--pid-file={b / 'run/munged.pid'}", f"--seed-file={b / 'munge/seed'}"])
        self._wait(lambda: sock.exists(), timeout_s, "munged did not create its socket", "munged.log")
        self.conf.write_text(self._config(sock))
        self._spawn([_exe("slurmctld"), "-D", "-f", str(self.conf)])
        self._spawn([_exe("slurmd"), "-D", "-f", str(self.conf), "-N", NODE])
        self._wait(lambda: self.slurm("sinfo", "-h", "-n", NODE, "-o", "%T", check=False).stdout.strip() == "idle",
                   timeout_s, "the node never became idle", "slurmd.log")
        return self

    def _config(self, munge_socket: Path) -> str:
        b = self.base
        return f"""\
ClusterName=ptgtest
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={b / 'state'}
SlurmdSpoolDir={b / 'spool'}
SlurmctldPidFile={b / 'run/slurmctld.pid'}
SlurmdPidFile={b / 'run/slurmd.pid'}
SlurmctldLogFile={b / 'log/slurmctld.log'}
SlurmdLogFile={b / 'log/slurmd.log'}
# no cgroups in a container: track processes by parentage, no task confinement, no accounting daemon
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
MinJobAge=900
NodeName={NODE} NodeHostname=localhost NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.memory_mb} State=UNKNOWN
PartitionName=cpu Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
"""

    def _spawn(self, cmd: list[str]) -> None:
        log = open(self.base / "log" / f"{Path(cmd[0]).name}.out", "ab")
        self._daemons.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self._env(),
                                              start_new_session=True))
        log.close()

    def _wait(self, ready, timeout_s: float, what: str, log: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ready():
                return
            dead = [p for p in self._daemons if p.poll() is not None]
            if dead:
                break
            time.sleep(0.3)
        raise RuntimeError(f"{what}; the end of {log}:\n{self.log(log)[-3000:]}\n{self.log(log[:-4] + '.out')[-2000:]}")

    def stop(self) -> None:
        """Cancel every job (their processes go with them), then stop the daemons and remove the folder."""
        try:
            self.slurm("scancel", "--full", "--user", "root", check=False)
            self._wait_until(lambda: not self.slurm("squeue", "-h", check=False).stdout.strip(), 30)
        except Exception:
            pass
        for p in reversed(self._daemons):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self._daemons):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()
        shutil.rmtree(self.base, ignore_errors=True)

    # ---- using it -------------------------------------------------------------------------------------
    def _env(self, extra: dict | None = None) -> dict:
        # Nothing from a Slurm job this test might itself run in may leak into the jobs it submits.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_"))}
        return {**env, **self.env, **(extra or {})}

    def slurm(self, *args: str, env: dict | None = None, cwd=None, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([_exe(args[0]), *args[1:]], env=self._env(env), cwd=cwd, text=True, capture_output=True,
                              timeout=60)
        if check and proc.returncode:
            raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def sbatch(self, *args: str, env: dict | None = None, cwd=None) -> str:
        """Submit; returns the job id."""
        return self.slurm("sbatch", "--parsable", *args, env=env, cwd=cwd).stdout.strip().split(";")[0]

    def tasks(self, job: str) -> dict[int, dict]:
        """Array task id -> scontrol's fields (JobState, ExitCode, StdOut, ...) for every task of ``job``."""
        out = self.slurm("scontrol", "-o", "show", "job", job).stdout
        tasks = {}
        for line in out.splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            if fields.get("ArrayTaskId", "").isdigit():
                tasks[int(fields["ArrayTaskId"])] = fields
        return tasks

    def wait(self, job: str, timeout_s: float = 600) -> dict[int, dict]:
        """Wait until no task of ``job`` is pending or running; returns ``tasks(job)``."""
        self._wait_until(lambda: not self.slurm("squeue", "-h", "-j", job, check=False).stdout.strip(), timeout_s,
                         f"job {job} still running after {timeout_s} s")
        return self.tasks(job)

    def _wait_until(self, done, timeout_s: float, message: str = "timed out") -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(message)
            time.sleep(0.5)

    def log(self, name: str) -> str:
        path = self.base / "log" / name
        return path.read_text(errors="replace") if path.exists() else ""
