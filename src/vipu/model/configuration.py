"""What each agent must configure for a partition, and what the IPUoF client is told.

A partition is isolated by enabling exactly the links between its own IPUs: the internal links
between its IPUs on one machine, the IPU-Link and Sync-Link cables between its machines, and the
GW-Links between its segments. Everything else stays off. Each enabled cable is sent with the
machine and port its other end must reach, so the agent can refuse a cable that is not where the
cluster definition says it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from vipu.model.entities import WORKLOAD_LABELS, MachineInventory, Partition
from vipu.model.ipuof_attributes import ATTACH_KEY_ATTRIBUTE
from vipu.model.topology import IPULINK_PORT_IPU, Cable, ClusterLayout, internal_peers


@dataclass(frozen=True)
class PortLink:
    port: int
    peer_serial: str
    peer_port: int


@dataclass(frozen=True)
class IpuSetting:
    index: int
    routing_id: int
    gcd: int
    segment: int
    internal_peers: tuple[int, ...]


@dataclass(frozen=True)
class AgentSettings:
    partition_id: str
    ipus: tuple[IpuSetting, ...]
    ipulinks: tuple[PortLink, ...]
    synclinks: tuple[PortLink, ...]
    gwlinks: tuple[PortLink, ...]
    ipulink_routing: str
    gw_routing: str
    sync_type: str
    reconfigurable: bool
    attach_key: str = field(default="", repr=False)  # the partition's; IPUoF clients must present it
    # The partition's user, and the workload it runs (`Partition.labels`): what the agent's telemetry
    # attributes its IPUs to. Not part of what the machine is configured with, so not compared: an
    # agent from before them, or settings applied before them, are not taken for lost settings.
    owner: str = field(default="", compare=False)
    labels: tuple[tuple[str, str], ...] = field(default=(), compare=False)


def agent_settings(partition: Partition, layout: ClusterLayout, serials: Mapping[str, str]) -> dict[str, AgentSettings]:
    """The settings of `partition` for each agent holding some of its IPUs."""
    members: dict[str, set[int]] = {}
    for ipu in partition.ipus:
        members.setdefault(ipu.agent_id, set()).add(ipu.index)
    segment_of = {ipu.agent_id: ipu.segment for ipu in partition.ipus}
    links: dict[str, dict[str, list[PortLink]]] = {a: {"ipu": [], "sync": [], "gw": []} for a in members}

    def enable(kind: str, cable: Cable) -> None:
        low, up = cable.lower, cable.upper
        links[low.agent_id][kind].append(PortLink(low.number, serials[up.agent_id], up.number))
        links[up.agent_id][kind].append(PortLink(up.number, serials[low.agent_id], low.number))

    for cable in layout.ipulink_cables(members):
        low, up = cable.lower, cable.upper
        if IPULINK_PORT_IPU[low.number] in members.get(low.agent_id, ()) and IPULINK_PORT_IPU[up.number] in members.get(up.agent_id, ()):
            enable("ipu", cable)
    for cable in layout.sync_cables(members):
        if cable.lower.agent_id in members and cable.upper.agent_id in members:
            enable("sync", cable)
    for cable in layout.gwlink_cables(members):
        low_agent, up_agent = cable.lower.agent_id, cable.upper.agent_id
        if low_agent in members and up_agent in members and segment_of[low_agent] != segment_of[up_agent]:
            enable("gw", cable)

    result = {}
    for agent, indices in members.items():
        ipus = tuple(
            IpuSetting(ipu.index, ipu.routing_id, ipu.gcd, ipu.segment, tuple(internal_peers(ipu.index, indices)))
            for ipu in sorted(partition.ipus_on(agent), key=lambda i: i.index)
        )
        result[agent] = AgentSettings(
            partition_id=partition.id,
            ipus=ipus,
            ipulinks=tuple(sorted(links[agent]["ipu"], key=lambda link: link.port)),
            synclinks=tuple(sorted(links[agent]["sync"], key=lambda link: link.port)),
            gwlinks=tuple(sorted(links[agent]["gw"], key=lambda link: link.port)),
            ipulink_routing=partition.ipulink_routing.value,
            gw_routing=partition.gw_routing.value,
            sync_type=partition.sync_type.value,
            reconfigurable=partition.reconfigurable,
            attach_key=partition.attach_key,
            owner=partition.owner,
            labels=tuple(sorted(partition.labels.items())),
        )
    return result


def attribution(settings: AgentSettings | None) -> list[str]:
    """The partition, user, IPUJob, namespace and Slurm job an IPU's telemetry is labelled with; empty for an IPU in none."""
    if settings is None:
        return ["", "", *("" for _ in WORKLOAD_LABELS)]
    labels = dict(settings.labels)
    return [settings.partition_id, settings.owner, *(labels.get(key, "") for key in WORKLOAD_LABELS)]


@dataclass(frozen=True)
class IpuofDevice:
    ip: str
    server_port: int
    rdma_port: int
    device_id: int
    ipulink_segment_id: int
    routing_id: int  # within its GCD
    ipu_arch_id: int
    ipu_id: int
    chip_id: str
    gwsw_version: str
    ipum_sw_version: str


@dataclass(frozen=True)
class GcdConfig:
    gcd_id: int
    devices: tuple[IpuofDevice, ...]
    attributes: dict[str, str]


GATEWAY_VERSION_KEY = "gateway-software"
IPUM_VERSION_KEY = "ipum-software"
IPUOF_SERVER_VERSION_KEY = "ipuof-server"


def gcd_configs(partition: Partition, inventories: Mapping[str, MachineInventory]) -> list[GcdConfig]:
    """The IPUoF view of each GCD: where each IPU is served and what it is within the GCD."""
    per_gcd = partition.size // partition.num_gcds
    gcds = []
    for gcd in range(partition.num_gcds):
        ipus = sorted((i for i in partition.ipus if i.gcd == gcd), key=lambda i: i.routing_id)
        devices = []
        for local, ipu in enumerate(ipus):
            inventory = inventories[ipu.agent_id]
            chip = next((c.chip_id for c in inventory.ipus if c.index == ipu.index), "")
            devices.append(
                IpuofDevice(
                    ip=inventory.ipuof_host,
                    server_port=inventory.ipuof_port,
                    rdma_port=inventory.rdma_port,
                    device_id=ipu.index,
                    ipulink_segment_id=ipu.segment,
                    routing_id=local,
                    ipu_arch_id=inventory.ipu_arch_id,
                    ipu_id=local,
                    chip_id=chip,
                    gwsw_version=inventory.versions.get(GATEWAY_VERSION_KEY, ""),
                    ipum_sw_version=inventory.versions.get(IPUM_VERSION_KEY, ""),
                )
            )
        attributes = {
            "Partition Id": partition.id,
            "GCD Id": str(gcd),
            "Num GCDs": str(partition.num_gcds),
            "Num IPUs": str(per_gcd),
            "Num replicas": str(partition.num_replicas // partition.num_gcds),
            "Fabric reconfigurable": str(partition.reconfigurable).lower(),
            "IPU-Link routing type": partition.ipulink_routing.value,
            "GW-Link routing type": partition.gw_routing.value,
            "Sync type": partition.sync_type.value,
            "Num IPU-Link segments": str(partition.num_segments),
            ATTACH_KEY_ATTRIBUTE: partition.attach_key,
        }
        gcds.append(GcdConfig(gcd, tuple(devices), attributes))
    return gcds
