"""A Slurm job's partition: created before its first step, removed however the job ends.

`vipu-slurm-prolog` runs as PrologSlurmctld when Slurm grants a job its nodes. For a job
submitted with `--ipus` (the SPANK plugin passes it as SPANK_VIPU_IPUS) it creates partition
`slurm-<job id>` of that size, one GCD per task (`-n`), expected to run for the job's time limit
(TimeLimit, as slurmctld shows it), and writes its IPUoF files into IpuofDir for the job's tasks
to find. Slurm starts the job only once the licences `ipu` it holds say
enough IPUs are free (`job_submit.lua`, `licences`), so the partition is normally made at once;
should the free IPUs not form one partition of its size, the request waits in vipu's queue up to
QueueTimeout, its reason in the job's comment. If the controller cannot be reached or that wait
ends, the prolog fails, so Slurm requeues the job; a request no controller could satisfy cancels
it. Either way the job's comment says why.

`vipu-slurm-epilog` runs as EpilogSlurmctld at every job end (success, failure, scancel, time
limit, node failure) and removes the partition and its files. A partition an epilog could not
remove (its controller was down) is removed by the next prolog, which forgets every `slurm-N`
partition whose job N is over.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping

from vipu.api.convert import reservation_from_proto
from vipu.client.retry import Verdict, verdict
from vipu.client.user import UserClient
from vipu.ipuof import files as ipuof_files
from vipu.model.errors import AlreadyExists, NotFound, VipuError
from vipu.slurm.config import VipuSlurmConfig

log = logging.getLogger(__name__)

PARTITION_PREFIX = "slurm-"
SYSTEM_PATH = ("/usr/bin", "/bin", "/usr/local/bin")
OVER = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"}


def partition_id(job_id: str) -> str:
    return f"{PARTITION_PREFIX}{job_id}"


def job_of(partition: str) -> str | None:
    """The id of the Slurm job whose partition (or request) this is by its name (`slurm-<job id>`),
    or None. A name alone proves nothing (anyone may name a partition so): who counts what as a
    job's checks the id against Slurm's jobs."""
    job_id = partition.removeprefix(PARTITION_PREFIX)
    return job_id if partition.startswith(PARTITION_PREFIX) and job_id.isdigit() else None



def job_owner(env: Mapping[str, str]) -> int | None:
    """The job's user, who must read its IPUoF files (readable by their owner only), when the
    prolog runs as root and can give them away; else None."""
    uid = env.get("SLURM_JOB_UID", "")
    return int(uid) if uid.isdigit() and os.geteuid() == 0 else None

class JobFailed(VipuError):
    """The prolog could not give the job its partition; `permanent` if no retry can."""

    def __init__(self, message: str, permanent: bool = False):
        super().__init__(message)
        self.permanent = permanent


def command(name: str) -> str:
    """A Slurm command's path: slurmctld runs its scripts with an empty PATH."""
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), *SYSTEM_PATH])) or name


class Scontrol:
    """What the programs ask of slurmctld, through its own commands."""

    def job(self, job_id: str) -> dict[str, str] | None:
        """The job's fields (`scontrol show job -o`), or None if Slurm no longer knows it. Only
        the job's own: its user names it, and a name may look like fields."""
        done = subprocess.run([command("scontrol"), "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            return None
        return dict(re.findall(r"(\w+)=(\S*)", done.stdout))

    def job_states(self) -> dict[str, str]:
        """The state of every job slurmctld knows, by id (`squeue`: ids and states only, nothing a
        user wrote): one call however many jobs there are. A job it forgot is over."""
        done = subprocess.run([command("squeue"), "-h", "-t", "all", "-o", "%i %T"], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise JobFailed(f"squeue failed: {done.stderr.strip() or done.returncode}")
        return dict(line.split(None, 1) for line in done.stdout.splitlines() if len(line.split()) == 2)

    def comment(self, job_id: str, text: str) -> None:
        subprocess.run([command("scontrol"), "update", f"JobId={job_id}", f"Comment={text[:250]}"], capture_output=True, timeout=30)

    def cancel(self, job_id: str) -> None:
        subprocess.run([command("scancel"), job_id], capture_output=True, timeout=30)


class JobPartitions:
    def __init__(self, config: VipuSlurmConfig, slurm: Scontrol | None = None, user: UserClient | None = None):
        self.config = config
        self.slurm = slurm or Scontrol()
        self.user = user or UserClient(config.client_settings(), config.api_timeout)
        self._drains_told: dict[str, str] = {}  # job id -> what its comment last said of the drains under its partition

    def tell_drains(self) -> None:
        """Tell each job whose partition runs on a machine being drained (an operator's drain, a
        maintenance window) what becomes of it, in the job's comment (`squeue -o %k`), once per
        change; and, once the drain is over for it, its partition again. vipu-slurm-service does
        this at each upkeep."""
        told = {}
        for partition in self.user.list_partitions():
            job_id = job_of(partition.id)
            if job_id is None:
                continue
            notices = "; ".join(partition.status.drain_notices)
            if notices != self._drains_told.get(job_id, ""):
                self.slurm.comment(job_id, f"vipu: partition {partition.id}" + (f": {notices}" if notices else ""))
            if notices:
                told[job_id] = notices
        self._drains_told = told

    def prolog(self, env: Mapping[str, str]) -> str | None:
        """Create the job's partition and its files; the partition's id, or None for a job without IPUs."""
        job_id, requested = env["SLURM_JOB_ID"], env.get("SPANK_VIPU_IPUS", "")
        if not requested:
            return None
        try:
            name = self._create(job_id, env)
        except JobFailed as failure:
            self.slurm.comment(job_id, f"vipu: {failure.message}")
            if failure.permanent:
                self.slurm.cancel(job_id)
            raise
        self.slurm.comment(job_id, f"vipu: partition {name}")
        return name

    def _create(self, job_id: str, env: Mapping[str, str]) -> str:
        name = partition_id(job_id)
        ipus = _count(env["SPANK_VIPU_IPUS"], "--ipus")
        if ipus > self.config.max_ipus_per_job:
            raise JobFailed(f"--ipus={ipus} is more than MaxIpusPerJob ({self.config.max_ipus_per_job})", permanent=True)
        replicas = _count(env["SPANK_VIPU_NUM_REPLICAS"], "--num-replicas") if env.get("SPANK_VIPU_NUM_REPLICAS") else 0
        job = self.slurm.job(job_id)
        if job is None:
            log.warning("job %s: slurmctld did not say its number of tasks; the partition gets one GCD", job_id)
        gcds = int((job or {}).get("NumTasks") or 1)
        expected = time_limit_seconds((job or {}).get("TimeLimit", ""))
        try:
            self.forget_finished_jobs()
            account = self.config.accounts.of(_named((job or {}).get("Account", "")))
            reservation = self._vipu_reservation((job or {}).get("Reservation", ""), account)
            try:
                config = self._create_partition(name, ipus, gcds, replicas, expected, reservation, account)
            except AlreadyExists:  # left by an earlier attempt of this job (requeued): start afresh
                with contextlib.suppress(NotFound):  # removed meanwhile by the operation that held it
                    self._remove(name)
                config = self._create_partition(name, ipus, gcds, replicas, expected, reservation, account)
        except VipuError as error:
            if verdict(error) is Verdict.NEVER:
                raise JobFailed(f"cannot create partition {name} of {ipus} IPUs in {gcds} GCD(s): {error.message}",
                                permanent=True) from None
            self._remove_quietly(name)
            raise JobFailed(f"no partition of {ipus} IPUs yet, job requeued: {error.message}") from None
        try:
            ipuof_files.write(self.config.ipuof_dir, name, config, owner=job_owner(env))
        except OSError as error:
            self._remove_quietly(name)
            raise JobFailed(f"cannot write the IPUoF files of {name} into {self.config.ipuof_dir}: {error.strerror}") from None
        log.info("job %s: partition %s of %d IPUs in %d GCD(s)", job_id, name, ipus, gcds)
        return name

    def epilog(self, env: Mapping[str, str]) -> bool:
        """Remove the job's partition and files, if it has them; whether there was a partition."""
        name = partition_id(env["SLURM_JOB_ID"])
        ipuof_files.remove(self.config.ipuof_dir, name)
        try:
            self._remove(name)
        except NotFound:
            return False
        log.info("job %s: partition %s removed", env["SLURM_JOB_ID"], name)
        return True

    def _vipu_reservation(self, slurm_reservation: str, account: str = "") -> str:
        """The vipu reservation a job runs in: the Slurm reservation it was given (sbatch
        --reservation), when vipu has a reservation for people of that name too (a site names the
        two alike), not over, for Slurm's vipu user (`ApiUser`; anyone in open mode) or for the job's
        vipu account; "" otherwise, and the job's partition is placed as any other (a Slurm maintenance reservation named as
        vipu's window, say)."""
        if not slurm_reservation or slurm_reservation == "(null)":
            return ""
        now = time.time()
        usable = any(r.name == slurm_reservation and not r.ended(now)
                     and r.admits(self.config.api_user, unrestricted=False, account=account)
                     for r in map(reservation_from_proto, self.user.list_reservations()))
        return slurm_reservation if usable else ""

    def _create_partition(self, name: str, ipus: int, gcds: int, replicas: int, expected_seconds: int = 0, reservation: str = "",
                          account: str = ""):
        """The job's partition, expected to run for the job's time limit (0: none known), in the vipu
        reservation given, on the vipu account given (`Accounts` of vipu.conf)."""
        job_id = name.removeprefix(PARTITION_PREFIX)
        return self.user.create_partition(
            name, ipus, num_gcds=gcds, num_replicas=replicas, expected_seconds=expected_seconds, reservation=reservation,
            account=account, labels={"slurm_job": job_id},
            wait=self.config.queue_timeout,
            on_wait=lambda queued: self.slurm.comment(job_id, f"vipu: waiting for its IPUs: {queued.reason}"))

    def _remove(self, name: str) -> None:
        self.user.remove_partition(name, force=True)

    def _remove_quietly(self, name: str) -> None:
        try:
            self._remove(name)
        except VipuError as error:
            log.warning("partition %s left behind for the next prolog to remove: %s", name, error.message)

    def forget_finished_jobs(self) -> None:
        """Remove the partitions, and cancel the waiting requests, of jobs that are over: those whose
        epilog could not reach the controller, or never ran (slurmctld may kill the epilog of a job
        cancelled while its prolog waits). They are listed before the jobs' states are asked: a job
        whose partition or request is listed was submitted before the states were taken, so a job
        missing from them is over. Run by each prolog, and by vipu-slurm-service every few seconds."""
        def ours(ids) -> list[str]:
            return [i for i in ids if job_of(i) is not None]

        made = ours(p.id for p in self.user.list_partitions())
        waiting = ours(q.partition_id for q in self.user.list_queued())
        if not made and not waiting:
            return
        states = self.slurm.job_states()
        for name in [*waiting, *made]:
            job_id = name.removeprefix(PARTITION_PREFIX)
            if states.get(job_id, "COMPLETED") in OVER:
                ipuof_files.remove(self.config.ipuof_dir, name)
                self._remove_quietly(name)  # cancels the request of one that only waits
                log.info("removed partition %s of finished job %s", name, job_id)


SLURM_YEAR_SECONDS = 365 * 86400  # what Slurm puts for no limit in a job its backfill starts
_TIME_LIMIT = re.compile(r"(?:(?P<days>[0-9]+)-)?(?P<first>[0-9]+)(?::(?P<second>[0-9]+))?(?::(?P<third>[0-9]+))?")


def time_limit_seconds(text: str) -> int:
    """A job's TimeLimit as slurmctld shows it (`scontrol show job`: D-HH:MM:SS or HH:MM:SS, or as
    Slurm takes it: MM, MM:SS, D-HH, D-HH:MM), in seconds: how long its partition is expected to
    run. 0 when it has none (UNLIMITED, Partition_Limit, NONE) or it cannot be read, and when it
    is a year or more: Slurm's backfill scheduler writes a year (its YEAR_MINUTES) into the limit
    of a job it starts with none, in a partition whose MaxTime is INFINITE."""
    found = _TIME_LIMIT.fullmatch(text.strip())
    if found is None:
        return 0
    days, first, second, third = (int(found[name] or 0) for name in ("days", "first", "second", "third"))
    if found["days"]:  # D-HH, D-HH:MM, D-HH:MM:SS
        seconds = days * 86400 + first * 3600 + second * 60 + third
    elif found["third"]:  # HH:MM:SS
        seconds = first * 3600 + second * 60 + third
    else:  # MM, MM:SS
        seconds = first * 60 + second
    return 0 if seconds >= SLURM_YEAR_SECONDS else seconds


def _count(text: str, option: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise JobFailed(f"{option} must be a positive whole number, not {text!r}", permanent=True)
    return int(text)


def _named(value: str) -> str:
    """A name as scontrol shows it, "" for none ("(null)")."""
    return "" if value in ("", "(null)") else value
