"""Slurm's topology file kept equal to vipu's IPU-Link domains and allocations.

vipu-slurm-service, when vipu.conf sets `Topology` (and `NodeMachines`), draws the topology from
the allocations vipu gives Slurm's user (`vipu.model.slurm_topology`) every `--topology-interval`
seconds, and when it differs from the file beside slurm.conf, replaces the file in one step and
has slurmctld read it again (`scontrol reconfigure`). A file that is already right is left alone,
so slurmctld is not reconfigured for nothing.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from vipu.api.atomic import write_text_for_readers
from vipu.client.user import UserClient
from vipu.model.errors import InvalidArgument, Unavailable
from vipu.model.slurm_topology import SlurmTopology, file_name, slurm_topology
from vipu.slurm.config import DEFAULT_SLURM_CONF, VipuSlurmConfig
from vipu.slurm.jobs import command


def topology_path(form: str) -> Path:
    """Where slurmctld reads the form: beside the slurm.conf in use."""
    return Path(os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF).parent / file_name(form)


def drawn(user: UserClient, config: VipuSlurmConfig) -> SlurmTopology:
    """The topology of the allocations vipu gives Slurm's user, as they are now."""
    allocations = []
    for allocation in user.list_allocations():
        spec = allocation.spec
        if len(spec.agent_ilds) != len(spec.agent_ids):
            raise InvalidArgument("vipu-server does not say its allocations' IPU-Link domains: it is older than this "
                                  "vipu-slurm-service; upgrade it")
        allocations.append((allocation.id, dict(zip(spec.agent_ids, spec.agent_ilds, strict=True))))
    return slurm_topology(config.node_machines, allocations)


class TopologyKeeper:
    """Keeps Slurm's topology file up to date; remembers a reconfigure that failed, to ask again."""

    def __init__(self, user: UserClient, config: VipuSlurmConfig):
        self.user, self.config = user, config
        self.path = topology_path(config.topology)
        self._reconfigure_owed = False

    def refresh(self) -> bool:
        """Bring the file up to date, and slurmctld with it; whether either changed."""
        text = drawn(self.user, self.config).render(self.config.topology)
        wanted = text.encode()
        try:
            with open(self.path, "rb") as kept:
                same = kept.read(len(wanted) + 1) == wanted  # no more than it takes to tell: the file may be anything
        except FileNotFoundError:
            same = False
        except OSError as error:
            raise Unavailable(f"cannot read {self.path}: {error.strerror}") from None
        if same and not self._reconfigure_owed:
            return False
        if not same:
            write_text_for_readers(self.path, text)
        self._reconfigure_owed = True
        try:
            told = subprocess.run([command("scontrol"), "reconfigure"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise Unavailable(f"{self.path} is written, but scontrol reconfigure failed: {error}") from None
        if told.returncode != 0:
            raise Unavailable(f"{self.path} is written, but scontrol reconfigure failed: "
                              f"{told.stderr.strip() or told.stdout.strip() or told.returncode}")
        self._reconfigure_owed = False
        return True

