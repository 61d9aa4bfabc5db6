"""Slurm's licence `ipu`: the pod's IPUs as a count Slurm itself schedules by.

slurm.conf declares `Licenses=ipu:N`, N the IPUs of the allocations vipu gives Slurm's user, and
`slurm/job_submit.lua` (installed beside slurm.conf, with `JobSubmitPlugins=lua`) turns a job's
`--ipus=N`, which the SPANK plugin hands on in the job's SPANK environment, into a request of N
licences. Slurm then starts a job only while enough IPUs are free, and otherwise keeps it PENDING
in its own order with its own reason (`Licenses`): no job is started to be refused and requeued.

IPUs that Slurm's jobs cannot have are taken out of Slurm's count by a reservation of licences
only, `vipu-outside`, which no job uses: `sync` sets it to them, so that the licences free for
jobs are the IPUs free for them. They are the IPUs of partitions that are not a Slurm job's
(`vipu create partition`, Kubernetes jobs; a partition named `slurm-<n>` counts as job n's only
while Slurm knows job n and it is not over, so a name alone escapes nothing), the free IPUs on
machines that are down, and the free IPUs held for a request waiting first in its allocation's
queue that is not a Slurm job's. vipu-slurm-service runs it every `--licences-interval` seconds;
`vipu-slurm-licences` once.

slurmctld (22.05, as the Slurm tests run it) accepts the reservation's creation and its updates
while running jobs hold the licences it takes (it does not need the IGNORE_JOBS flag): the jobs
keep theirs, and the next jobs wait for licences until enough are free.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from vipu.client.user import UserClient
from vipu.model.errors import InvalidArgument, Unavailable, VipuError, one_line
from vipu.slurm import config as slurm_config
from vipu.slurm.jobs import OVER, Scontrol, command, job_of

log = logging.getLogger(__name__)

LICENCE = "ipu"
RESERVATION = "vipu-outside"


@dataclass(frozen=True)
class Count:
    """What one sync found and did."""

    licences: int  # Licenses=ipu:N in slurm.conf
    given: int  # the IPUs of the allocations vipu gives Slurm's user
    outside: int  # held by partitions Slurm's jobs did not make
    down: int = 0  # free, but on machines that are down
    held: int = 0  # free, but held for a request waiting first in its queue that is not a Slurm job's
    draining: int = 0  # free, but on machines an operator drains
    reserved_for_people: int = 0  # free, but in a reservation under way for others than Slurm's user

    @property
    def reserved(self) -> int:
        """What no job may have: reserved out of Slurm's count (at most all of it)."""
        return min(self.outside + self.down + self.held + self.draining + self.reserved_for_people, self.licences)

    def describe(self) -> str:
        line = f"{self.licences} licences {LICENCE}; {self.outside} IPUs held outside Slurm"
        if self.down:
            line += f", {self.down} free on machines that are down"
        if self.held:
            line += f", {self.held} free held for a request outside Slurm"
        if self.draining:
            line += f", {self.draining} free on machines being drained"
        if self.reserved_for_people:
            line += f", {self.reserved_for_people} free in reservations for their users"
        line += f", reserved ({RESERVATION})"
        if self.licences != self.given:
            line += (f"; but vipu gives Slurm's user {self.given} IPUs: set Licenses={LICENCE}:{self.given} in slurm.conf "
                     "and reconfigure")
        return line


def _scontrol(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([command("scontrol"), *args], capture_output=True, text=True, timeout=30)


def licences() -> int:
    """The licences `ipu` slurm.conf declares; InvalidArgument if none."""
    shown = _scontrol("show", "licenses", LICENCE, "-o")
    found = re.search(r"\bTotal=(\d+)", shown.stdout)
    if shown.returncode != 0 or found is None:
        raise InvalidArgument(f"slurmctld has no licence {LICENCE!r}: add Licenses={LICENCE}:N to slurm.conf, N the IPUs "
                              f"vipu gives Slurm ({shown.stderr.strip() or shown.stdout.strip() or 'no answer'})")
    return int(found.group(1))


def reserve(count: int) -> None:
    """Hold `count` licences out of every job's reach in the reservation; none: no reservation."""
    exists = _scontrol("show", "reservation", RESERVATION, "-o").returncode == 0
    if count == 0:
        done = _scontrol("delete", f"ReservationName={RESERVATION}") if exists else None
    elif exists:
        done = _scontrol("update", f"ReservationName={RESERVATION}", f"Licenses={LICENCE}:{count}")
    else:
        done = _scontrol("create", "reservation", f"ReservationName={RESERVATION}", "StartTime=now", "Duration=infinite",
                         "Users=root", "Flags=ANY_NODES", f"Licenses={LICENCE}:{count}")
    if done is not None and done.returncode != 0:
        raise Unavailable(f"scontrol could not set reservation {RESERVATION} to {count} licences {LICENCE}: "
                          f"{done.stderr.strip() or done.stdout.strip()}")


def sync(user: UserClient, slurm: Scontrol | None = None) -> Count:
    """Reserve out of Slurm's licences the IPUs its jobs cannot have now (the module says which)."""
    total = licences()
    rooms = user.capacity().allocations
    partitions = user.list_partitions()
    jobs = (slurm or Scontrol()).job_states()

    def slurms(partition: str) -> bool:
        job = job_of(partition)
        return job is not None and jobs.get(job, "COMPLETED") not in OVER

    count = Count(total, sum(a.total_ipus for a in rooms),
                  outside=sum(len(p.spec.ipus) for p in partitions if not slurms(p.id)),
                  down=sum(a.down_ipus for a in rooms),
                  held=sum(a.held_ipus for a in rooms if a.held_for and not slurms(a.held_for)),
                  draining=sum(a.draining_ipus for a in rooms), reserved_for_people=sum(a.reserved_ipus for a in rooms))
    reserve(count.reserved)
    return count


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--conf", "conf_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              envvar="VIPU_SLURM_CONF", help="vipu.conf. Default: beside slurm.conf.")
def main(conf_path):
    """Keep Slurm's licences ipu equal to the IPUs free for its jobs: reserve those held outside Slurm."""
    try:
        config = slurm_config.load(conf_path)
        with UserClient(config.client_settings(), config.api_timeout) as user:
            count = sync(user)
    except VipuError as error:
        click.echo(f"vipu-slurm-licences (ipu): failed: {one_line(error.message)}", err=True)
        sys.exit(1)
    click.echo(f"vipu-slurm-licences: {count.describe()}")
