"""A real Slurm on this machine, from Debian's packages: munged, slurmctld and one slurmd.

`scripts/system-deps` installs them. Everything the daemons keep lives in a private directory:
their own munge key and socket, configuration, state, spool and logs, on free loopback ports.
They run as root (as Slurm does on a single machine), with process tracking by /proc and no
cgroups, so they work in a container. The one node claims `cpus` CPUs whatever the machine has
(so jobs of many tasks fit), and offers `ipus` generic resources (GRES) with no device files:
a count Slurm hands out, which is all a scheduler needs to know of them. Given `nodes`, there
are that many nodes of those names on this machine instead, each with a slurmd of its own on
a port of its own (Debian's Slurm takes several slurmd on one host so).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.ports import free_port
from tests.processes import dying_with_parent

PARTITION = "ipus"
ROOT = Path(__file__).resolve().parents[1]


def build_spank_plugin() -> str:
    """Build vipu's SPANK plugin (once) and return its path; a failed build fails the test with
    the compiler's own words rather than a bare exit status."""
    done = subprocess.run([str(ROOT / "scripts" / "build-slurm-plugin")], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/build-slurm-plugin failed (exit {done.returncode}):\n{done.stderr.strip()}")
    return done.stdout.strip()


class SlurmCluster:
    def __init__(self, gres_ipus: int = 64, cpus: int = 32, extra_config: str = "", plugstack: str = "",
                 files: dict[str, str] | None = None, nodes: tuple[str, ...] = (), oversubscribe: str = "FORCE:64"):
        """`extra_config` and `plugstack` are added to slurm.conf and plugstack.conf, and `files`
        written beside them (scripts executable), before the daemons start; `{dir}` in any of
        them is the directory. `oversubscribe` is the partition's OverSubscribe (NO: --exclusive
        jobs have whole nodes)."""
        for program in ("munged", "slurmctld", "slurmd", "sinfo"):
            if shutil.which(program) is None:
                raise RuntimeError(f"{program} is not installed; scripts/system-deps installs Slurm and munge from Debian")
        self.directory = Path(tempfile.mkdtemp(prefix="vipu-slurm-"))
        self.host = socket.gethostname().split(".")[0]
        self.nodes = list(nodes) or [self.host]
        self.node = self.nodes[0]
        self.oversubscribe = oversubscribe
        self.conf = self.directory / "slurm.conf"
        self.munge_socket = self.directory / "munge.socket"
        self.processes: list[subprocess.Popen] = []
        for name in ("state", "spool", "log", "munge"):
            (self.directory / name).mkdir()
        for node in self.nodes:
            (self.directory / "spool" / node).mkdir()
        for name, text in (files or {}).items():
            path = self.directory / name
            path.write_text(text.replace("{dir}", str(self.directory)))
            if text.startswith("#!"):
                path.chmod(0o755)
        self._write_configuration(gres_ipus, cpus, extra_config.replace("{dir}", str(self.directory)),
                                  plugstack.replace("{dir}", str(self.directory)))
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    @property
    def env(self) -> dict[str, str]:
        """The environment the Slurm commands need to talk to this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *command: str, timeout: float = 60, **options) -> subprocess.CompletedProcess:
        return subprocess.run(command, capture_output=True, text=True, env=self.env, timeout=timeout, **options)

    def log(self, daemon: str) -> str:
        return (self.directory / "log" / f"{daemon}.log").read_text(errors="replace")

    def _write_configuration(self, gres_ipus: int, cpus: int, extra: str, plugstack: str) -> None:
        d = self.directory
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        (d / "gres.conf").write_text("".join(f"NodeName={node} Name=ipu Count={gres_ipus}\n" for node in self.nodes))
        own_port = len(self.nodes) > 1 or self.node != self.host
        node_lines = "".join(
            f"NodeName={node} NodeHostname={self.host} NodeAddr=127.0.0.1" + (f" Port={free_port()}" if own_port else "")
            + f" CPUs={cpus} Gres=ipu:{gres_ipus} State=UNKNOWN\n" for node in self.nodes)
        (d / "plugstack.conf").write_text(plugstack)
        (d / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
        self.conf.write_text(f"""\
ClusterName=vipu
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={d / 'state'}
SlurmdSpoolDir={d / 'spool'}/%n
SlurmctldPidFile={d / 'slurmctld.pid'}
SlurmdPidFile={d / 'slurmd-%n.pid'}
SlurmctldLogFile={d / 'log' / 'slurmctld.log'}
SlurmdLogFile={d / 'log' / 'slurmd.log'}
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={d / 'plugstack.conf'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
MinJobAge=2
KillWait=2
InactiveLimit=0
Waittime=0
GresTypes=ipu
{extra}
{node_lines}PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe={self.oversubscribe}
""")

    def _spawn(self, name: str, command: list[str]) -> None:
        with open(self.directory / "log" / f"{name}.out", "ab") as out:
            self.processes.append(subprocess.Popen(dying_with_parent(command), stdout=out,
                                                   stderr=subprocess.STDOUT, env=self.env))

    def _start(self) -> None:
        d = self.directory
        self._spawn("munged", ["munged", "--foreground", "--force", f"--key-file={d / 'munge' / 'munge.key'}",
                               f"--socket={self.munge_socket}", f"--pid-file={d / 'munge' / 'munged.pid'}",
                               f"--log-file={d / 'log' / 'munged.log'}", f"--seed-file={d / 'munge' / 'seed'}"])
        self._wait(lambda: self.munge_socket.exists(), "munged")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: self.run("scontrol", "ping", timeout=10).stdout.count("UP") > 0, "slurmctld")
        for node in self.nodes:
            self._spawn("slurmd" if node == self.node else f"slurmd-{node}", ["slurmd", "-D", "-f", str(self.conf), "-N", node])
        self._wait(self._node_ready, "slurmd to register its nodes")

    def _node_ready(self) -> bool:
        states = self.run("sinfo", "-h", "-N", "-o", "%T", timeout=10).stdout.split()
        return len(states) == len(self.nodes) and all(state in ("idle", "mixed", "allocated") for state in states)

    def _wait(self, condition, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"{process.args[0]} exited while waiting for {what}; logs in {self.directory / 'log'}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}; logs in {self.directory / 'log'}")
            time.sleep(0.1)

    def stop(self) -> None:
        """Cancel what still runs (its slurmstepd would outlive slurmd), then stop the daemons."""
        if self.processes:
            try:
                self.run("scancel", f"--partition={PARTITION}", timeout=10)
                self._wait(lambda: not self.run("squeue", "-h", timeout=10).stdout.strip(), "the jobs to end", timeout=20)
            except (RuntimeError, subprocess.TimeoutExpired):
                pass  # stopping anyway
        for process in reversed(self.processes):
            process.terminate()
        for process in reversed(self.processes):
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes = []
