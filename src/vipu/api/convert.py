"""Conversions between protobuf messages and `vipu.model` entities.

The only module that knows both shapes; servicers and clients call it and stay thin.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from vipu.api.protos import admin_pb2, agent_pb2
from vipu.api.protos import vipuuser_pb2 as user_pb2
from vipu.model.accounts import Account, AccountUse, Quota, ShapeLimit
from vipu.model.clustertests import CableResult, InternalReading, Observation, Outcome, PortReading
from vipu.model.compaction import Report
from vipu.model.configuration import AgentSettings, GcdConfig, IpuSetting, PortLink
from vipu.model.entities import (
    MAX_AUTO_RESETS,
    Agent,
    Allocation,
    Cluster,
    Drain,
    GwRouting,
    GwTopology,
    IldTopology,
    IpuInfo,
    IpuLinkRouting,
    MachineInventory,
    OperationState,
    Partition,
    PartitionRequest,
    ReadyState,
    SyncType,
    checked_labels,
    natural_key,
)
from vipu.model.errors import InvalidArgument
from vipu.model.hardware import (
    NO_CAPABILITIES_SAID,
    Cable,
    Component,
    ComponentHealth,
    HealthEvent,
    HealthLevel,
    MachineCondition,
)
from vipu.model.linkhealth import CableIdentity, CableRecord, LinkDetail, LinkReading, LinkState, Sample
from vipu.model.queue import WaitingRequest
from vipu.model.reasons import span
from vipu.model.reservations import Reservation
from vipu.model.telemetry import IpuReading, LogLine, SensorReading, TelemetryReading, WatchReport
from vipu.model.topology import LinkKind

IPULINK_ROUTING = {
    IpuLinkRouting.DNC: user_pb2.IRT_DNC,
    IpuLinkRouting.SWNC: user_pb2.IRT_SWNC,
    IpuLinkRouting.BTNC: user_pb2.IRT_BTNC,
    IpuLinkRouting.RINGSWNC: user_pb2.IRT_RINGSWNC,
}
GW_ROUTING = {
    GwRouting.DEFAULT: user_pb2.GRT_UNDEFINED,
    GwRouting.RING: user_pb2.GRT_RING,
    GwRouting.SWRING: user_pb2.GRT_SWRING,
}
SYNC_TYPE = {
    SyncType.GS2_DEFAULT: user_pb2.ST_GS2_DEFAULT,
    SyncType.GS2_INDEPENDENT_RAILS: user_pb2.ST_GS2_INDEPENDENT_RAILS,
    SyncType.POD_NATIVE_DEFAULT: user_pb2.ST_POD_NATIVE_DEFAULT,
    SyncType.POD_NATIVE_REPLICATED_PIPELINE: user_pb2.ST_POD_NATIVE_REPLICATED_PIPELINE,
}
READY_STATE = {
    ReadyState.PENDING: user_pb2.PS_PENDING,
    ReadyState.ACTIVE: user_pb2.PS_ACTIVE,
    ReadyState.REMOVED: user_pb2.PS_REMOVED,
    ReadyState.ERROR: user_pb2.PS_ERROR,
}
OPERATION_STATE = {
    OperationState.IDLE: user_pb2.POS_IDLE,
    OperationState.CREATING: user_pb2.POS_CREATING,
    OperationState.REMOVING: user_pb2.POS_REMOVING,
    OperationState.RESETTING: user_pb2.POS_RESETTING,
    OperationState.FAILED: user_pb2.POS_FAILED,
}
ILD_TOPOLOGY = {IldTopology.MESH: admin_pb2.ILD_TOPOLOGY_MESH, IldTopology.TORUS: admin_pb2.ILD_TOPOLOGY_TORUS}


def _reverse(table: dict, value, what: str):
    for key, number in table.items():
        if number == value:
            return key
    raise InvalidArgument(f"unknown {what} {value}")


# Agent service


def inventory_to_proto(inventory: MachineInventory) -> agent_pb2.Inventory:
    return agent_pb2.Inventory(
        machine_serial=inventory.serial,
        platform=inventory.platform,
        manufacturer=inventory.manufacturer,
        board_part_number=inventory.board_part_number,
        versions=inventory.versions,
        backend=inventory.backend,
        backend_version=inventory.backend_version,
        ipuof_host=inventory.ipuof_host,
        ipuof_port=inventory.ipuof_port,
        rdma_port=inventory.rdma_port,
        ipus=[agent_pb2.Ipu(index=i.index, chip_id=i.chip_id, attributes=i.attributes) for i in inventory.ipus],
        exporter_port=inventory.exporter_port,
        ipu_arch_id=inventory.ipu_arch_id,
        capabilities=inventory.capabilities,
        cables=[agent_pb2.PortCable(port=c.port, serial=c.serial, vendor=c.vendor, model=c.model) for c in inventory.cables],
        components=[agent_pb2.HardwareComponent(id=c.id, kind=c.kind, name=c.name, serial=c.serial, model=c.model,
                                                manufacturer=c.manufacturer, firmware=c.firmware) for c in inventory.components],
    )


def inventory_from_proto(message: agent_pb2.Inventory) -> MachineInventory:
    return MachineInventory(
        serial=message.machine_serial,
        platform=message.platform,
        manufacturer=message.manufacturer,
        board_part_number=message.board_part_number,
        versions=dict(message.versions),
        backend=message.backend,
        backend_version=message.backend_version,
        ipuof_host=message.ipuof_host,
        ipuof_port=message.ipuof_port,
        rdma_port=message.rdma_port,
        ipus=[IpuInfo(i.index, i.chip_id, dict(i.attributes)) for i in message.ipus],
        exporter_port=message.exporter_port,
        ipu_arch_id=message.ipu_arch_id,
        capabilities=tuple(message.capabilities) or NO_CAPABILITIES_SAID,
        cables=tuple(Cable(c.port, c.serial, c.vendor, c.model) for c in message.cables),
        components=tuple(Component(c.id, c.kind, c.name, c.serial, c.model, c.manufacturer, c.firmware) for c in message.components),
    )


def condition_to_proto(condition: MachineCondition) -> agent_pb2.Condition:
    return agent_pb2.Condition(
        power_state=condition.power_state, health=condition.health, problems=condition.problems,
        components=[agent_pb2.ComponentStatus(component=c.component, health=c.health.value, state=c.state, message=c.message)
                    for c in condition.components],
        events=[agent_pb2.HealthEvent(sequence=e.sequence, at=e.at, severity=e.severity.value, component=e.component, message=e.message)
                for e in condition.events])


def condition_from_proto(message: agent_pb2.Condition) -> MachineCondition:
    return MachineCondition(
        power_state=message.power_state, health=message.health, problems=tuple(message.problems),
        components=tuple(ComponentHealth(c.component, HealthLevel(c.health), c.state, c.message) for c in message.components),
        events=tuple(HealthEvent(e.sequence, e.at, HealthLevel(e.severity), e.component, e.message) for e in message.events))


def _links_to_proto(links: tuple[PortLink, ...]) -> list[agent_pb2.PortLink]:
    return [agent_pb2.PortLink(port=link.port, peer_serial=link.peer_serial, peer_port=link.peer_port) for link in links]


def _links_from_proto(links) -> tuple[PortLink, ...]:
    return tuple(PortLink(link.port, link.peer_serial, link.peer_port) for link in links)


def settings_to_proto(settings: AgentSettings) -> agent_pb2.PartitionSettings:
    return agent_pb2.PartitionSettings(
        partition_id=settings.partition_id,
        ipus=[
            agent_pb2.IpuSetting(
                index=i.index,
                routing_id=i.routing_id,
                gcd_id=i.gcd,
                ipulink_segment_id=i.segment,
                internal_peers=i.internal_peers,
            )
            for i in settings.ipus
        ],
        ipulinks=_links_to_proto(settings.ipulinks),
        synclinks=_links_to_proto(settings.synclinks),
        gwlinks=_links_to_proto(settings.gwlinks),
        ipulink_routing=settings.ipulink_routing,
        gw_routing=settings.gw_routing,
        sync_type=settings.sync_type,
        reconfigurable=settings.reconfigurable,
        attach_key=settings.attach_key,
        owner=settings.owner,
        labels=dict(settings.labels),
    )


def settings_from_proto(message: agent_pb2.PartitionSettings) -> AgentSettings:
    return AgentSettings(
        partition_id=message.partition_id,
        ipus=tuple(
            IpuSetting(i.index, i.routing_id, i.gcd_id, i.ipulink_segment_id, tuple(i.internal_peers)) for i in message.ipus
        ),
        ipulinks=_links_from_proto(message.ipulinks),
        synclinks=_links_from_proto(message.synclinks),
        gwlinks=_links_from_proto(message.gwlinks),
        ipulink_routing=message.ipulink_routing,
        gw_routing=message.gw_routing,
        sync_type=message.sync_type,
        reconfigurable=message.reconfigurable,
        attach_key=message.attach_key,
        owner=message.owner,
        labels=tuple(sorted(message.labels.items())),
    )


# Admin service


def agent_to_proto(agent: Agent, cluster_id: str = "", allocation_id: str = "", ipu_uses=(),
                   draining_partitions: tuple[str, ...] = ()) -> admin_pb2.Agent:
    """`draining_partitions`: the partitions still on it while it is drained."""
    drain = agent.drain
    return admin_pb2.Agent(
        drain=None if drain is None else admin_pb2.AgentDrain(reason=drain.reason, by=drain.by, since=drain.since,
                                                              partition_ids=draining_partitions, deadline=drain.deadline),
        id=agent.id,
        host=agent.host,
        port=agent.port,
        status=agent.status.value,
        cluster_id=cluster_id,
        allocation_id=allocation_id,
        inventory=inventory_to_proto(agent.inventory),
        ipus=[
            admin_pb2.AgentIpuUse(
                index=use.index,
                partition_id=use.partition_id,
                partition_state=use.partition_state,
                routing_id=use.routing_id,
                gcd_id=use.gcd,
            )
            for use in ipu_uses
        ],
        discovery_mode=agent.discovery_mode,
        last_error=agent.last_error,
        condition=condition_to_proto(agent.inventory.condition),
    )


def cluster_to_proto(cluster: Cluster, allocation_ids=()) -> admin_pb2.Cluster:
    return admin_pb2.Cluster(
        id=cluster.id,
        agent_ids=cluster.agent_ids,
        topology=ILD_TOPOLOGY[cluster.topology],
        num_ipulinkdomains=cluster.num_ilds,
        cluster_topology=admin_pb2.GW_TOPOLOGY_LOOPED if cluster.gw_topology else admin_pb2.GW_TOPOLOGY_UNSPECIFIED,
        allocation_ids=list(allocation_ids),
    )


def drain_from_proto(message: admin_pb2.AgentDrain) -> Drain:
    return Drain(message.reason, message.by, message.since, message.deadline)


def cluster_from_proto(message: admin_pb2.Cluster) -> Cluster:
    """A cluster as the admin API gives it (`cluster_to_proto`'s reverse)."""
    return Cluster(id=message.id, agent_ids=tuple(message.agent_ids),
                   topology=_reverse(ILD_TOPOLOGY, message.topology, "IPU-Link domain topology"), num_ilds=message.num_ipulinkdomains or 1,
                   gw_topology=GwTopology.LOOPED if message.cluster_topology == admin_pb2.GW_TOPOLOGY_LOOPED else None)


def cluster_request_from_proto(message: admin_pb2.CreateClusterRequest) -> Cluster:
    topology = IldTopology.MESH
    if message.topology != admin_pb2.ILD_TOPOLOGY_UNSPECIFIED:
        topology = _reverse(ILD_TOPOLOGY, message.topology, "IPU-Link domain topology")
    return Cluster(
        id=message.id,
        agent_ids=tuple(message.agent_ids),
        topology=topology,
        num_ilds=message.num_ipulinkdomains or 1,
        gw_topology=GwTopology.LOOPED if message.cluster_topology == admin_pb2.GW_TOPOLOGY_LOOPED else None,
    )


def compaction_to_proto(report: Report) -> admin_pb2.CompactReply:
    plan = report.plan
    reply = admin_pb2.CompactReply(allocation_id=report.allocation_id, no_plan=report.why_none, stopped=report.stopped,
                                   dry_run=report.dry_run)
    if plan is not None:
        reply.frees_ipus, reply.frees_at = plan.size, span(report.layout, plan.shape)
        reply.moves.extend(admin_pb2.CompactionMove(partition_id=move.partition_id, **{"from": span(report.layout, move.before)},
                                                    to=span(report.layout, move.to), moved=move.partition_id in report.moved)
                           for move in plan.moves)
    return reply


def admin_allocation_to_proto(allocation: Allocation, partition_ids=()) -> admin_pb2.Allocation:
    return admin_pb2.Allocation(
        id=allocation.id,
        cluster_id=allocation.cluster_id,
        agent_ids=allocation.agent_ids,
        partition_ids=list(partition_ids),
    )


# User service


def requirements_from_proto(request: user_pb2.CreatePartitionRequest) -> PartitionRequest:
    req = request.requirements
    return PartitionRequest(
        id=req.id,
        size=req.size,
        allocation_id=req.allocation_id,
        cluster_id=req.cluster_id,
        num_gcds=req.num_gcds or 1,
        num_replicas=req.num_replicas,
        reconfigurable=req.reconfigurable,
        sync_type=_reverse(SYNC_TYPE, req.sync_type, "sync type") if req.sync_type else None,
        ipulink_routing=_reverse(IPULINK_ROUTING, req.ipulink_routing_type, "IPU-Link routing type") if req.ipulink_routing_type else None,
        gw_routing=_reverse(GW_ROUTING, req.gw_routing_type, "GW routing type") if req.gw_routing_type else None,
        num_segments=req.num_ipulink_segments,
        explicit_ipus=tuple((ipu.ipulink_domain_topology_id, ipu.topology_id) for ipu in req.ipus),
        index=req.index if req.HasField("index") else None,
        disable_auto_reset=request.disable_auto_reset,
        relocatable=request.relocatable,
        may_move=request.may_move,
        expected_seconds=request.expected_seconds,
        reservation=request.reservation,
        account=request.account,
        preemptible=request.preemptible,
        labels=checked_labels(dict(request.labels)),
    )


def partition_to_proto(partition: Partition, ipuof_server_version: str = "") -> user_pb2.Partition:
    message = user_pb2.Partition(
        id=partition.id,
        spec=user_pb2.PartitionSpec(
            cluster_id=partition.cluster_id,
            ipus=[
                user_pb2.PartitionIpu(
                    ipulink_domain_topology_id=i.ild,
                    ipulink_domain_routing_id=i.segment,
                    topology_id=i.topology_id,
                    routing_id=i.routing_id,
                    agent_id=i.agent_id,
                    agent_ipu_index=i.index,
                )
                for i in sorted(partition.ipus, key=lambda i: i.routing_id)
            ],
            ipulink_routing_type=IPULINK_ROUTING[partition.ipulink_routing],
            sync_type=SYNC_TYPE[partition.sync_type],
            num_gcds=partition.num_gcds,
            num_ipulink_segments=partition.num_segments,
            reconfigurable=partition.reconfigurable,
            gw_routing_type=GW_ROUTING[partition.gw_routing],
            num_replicas=partition.num_replicas,
            allocation_id=partition.allocation_id,
        ),
        ready_state=READY_STATE[partition.ready_state],
        ipuof_server_version=ipuof_server_version,
        status=status_to_proto(partition),
        owner=partition.owner,
    )
    if partition.created is not None:
        message.created.FromDatetime(partition.created)
    return message


def status_to_proto(partition: Partition) -> user_pb2.PartitionStatus:
    status = user_pb2.PartitionStatus(
        partition_id=partition.id,
        ready_state=READY_STATE[partition.ready_state],
        operation_state=OPERATION_STATE[partition.operation_state],
        errors=partition.errors,
        max_auto_reset_retries=0 if partition.disable_auto_reset else MAX_AUTO_RESETS,
        auto_reset_retry_count=partition.auto_reset_count,
    )
    if partition.last_auto_reset is not None:
        status.last_auto_reset_time.FromDatetime(partition.last_auto_reset)
    if partition.power_cycled is not None:
        status.last_power_cycle_time.FromDatetime(partition.power_cycled)
    status.relocatable, status.relocation = partition.relocatable, partition.relocation
    status.placement_note = partition.placement_note
    status.link_warnings.extend(partition.link_warnings)
    status.drain_notices.extend(partition.drain_notices)
    status.may_move, status.expected_seconds = partition.may_move, partition.expected_seconds
    status.reservation = partition.reservation
    status.account, status.preemptible = partition.account, partition.preemptible
    status.labels.update(partition.labels)
    return status


def queued_to_proto(request: WaitingRequest, position: int, reason: str) -> user_pb2.QueuedRequest:
    queued = user_pb2.QueuedRequest(partition_id=request.partition_id, allocation_id=request.allocation_id, size=request.size,
                                    user=request.owner, position=position, reason=reason)
    queued.since.FromDatetime(request.since)
    queued.deadline.FromDatetime(request.deadline)
    return queued


def config_to_proto(partition: Partition, gcds: list[GcdConfig], ipuof_server_version: str) -> user_pb2.PartitionConfig:
    return user_pb2.PartitionConfig(
        ipulink_routing_type=IPULINK_ROUTING[partition.ipulink_routing],
        sync_type=SYNC_TYPE[partition.sync_type],
        reconfigurable=partition.reconfigurable,
        gw_routing_type=GW_ROUTING[partition.gw_routing],
        num_ipulink_segments=partition.num_segments,
        gcd_configs=[
            user_pb2.PartitionConfig.Gcd(
                devices=[user_pb2.IpuofDevice(**vars(device)) for device in gcd.devices],
                attributes=gcd.attributes,
            )
            for gcd in gcds
        ],
        ipuof_server_version=ipuof_server_version,
    )


def user_allocation_to_proto(allocation: Allocation, agent_ilds: dict[str, int]) -> user_pb2.Allocation:
    """`agent_ilds`: the IPU-Link domain of each agent in its cluster (what Slurm's topology is made
    from); none are given for an allocation with an agent it lacks (its cluster changed meanwhile)."""
    known = all(agent in agent_ilds for agent in allocation.agent_ids)
    return user_pb2.Allocation(
        id=allocation.id,
        spec=user_pb2.AllocationSpec(cluster_id=allocation.cluster_id, agent_ids=allocation.agent_ids,
                                     agent_ilds=[agent_ilds[agent] for agent in allocation.agent_ids] if known else []),
    )


# Cluster tests


def observation_to_proto(observation: Observation) -> agent_pb2.DiagnoseReply:
    return agent_pb2.DiagnoseReply(
        ports=[
            agent_pb2.PortReading(kind=r.kind.value, port=r.port, cable_serial=r.cable_serial, up=r.up,
                                  peer_serial=r.peer_serial, peer_port=r.peer_port, errors=r.errors)
            for r in observation.ports
        ],
        internal_links=[agent_pb2.InternalLinkReading(link=r.link, up=r.up, errors=r.errors) for r in observation.internal],
        checksums=dict(observation.checksums),
        rnics={name: agent_pb2.PfcClasses(classes=list(classes)) for name, classes in observation.rnics.items()},
    )


def observation_from_proto(message: agent_pb2.DiagnoseReply) -> Observation:
    return Observation(
        ports=tuple(
            PortReading(LinkKind(r.kind), r.port, r.cable_serial, r.up, r.peer_serial, r.peer_port, r.errors)
            for r in message.ports
        ),
        internal=tuple(InternalReading(r.link, r.up, r.errors) for r in message.internal_links),
        checksums=dict(message.checksums),
        rnics={name: tuple(classes.classes) for name, classes in message.rnics.items()},
    )


# The link ledger


def link_counters_to_proto(readings: list[LinkReading], read_at: float) -> agent_pb2.LinkCountersReply:
    return agent_pb2.LinkCountersReply(read_at=read_at, links=[
        agent_pb2.LinkCounter(place=r.place, corrected_errors=r.corrected, recovery_events=r.recoveries, up=r.up,
                              cable=agent_pb2.CableIdentity(serial=r.cable.serial, vendor=r.cable.vendor, model=r.cable.model)
                              if r.cable else None, peer_serial=r.peer_serial, peer_port=r.peer_port)
        for r in readings])


def link_counters_from_proto(message: agent_pb2.LinkCountersReply) -> tuple[list[LinkReading], float]:
    return [LinkReading(r.place, r.corrected_errors, r.recovery_events, r.up,
                        CableIdentity(r.cable.serial, r.cable.vendor, r.cable.model) if r.HasField("cable") else None,
                        r.peer_serial, r.peer_port) for r in message.links], message.read_at


def _link_cable(record: CableRecord) -> admin_pb2.LinkCable:
    return admin_pb2.LinkCable(serial=record.identity.serial, vendor=record.identity.vendor, model=record.identity.model,
                               first_seen=record.first_seen, replaced=record.replaced)


def _link_sample(sample: Sample) -> admin_pb2.LinkSample:
    return admin_pb2.LinkSample(at=sample.at, corrected_errors=sample.corrected, recovery_events=sample.recoveries, up=sample.up)


def link_to_proto(state: LinkState) -> admin_pb2.Link:
    """A link as the admin API lists it."""
    kind = state.name.kind
    message = admin_pb2.Link(name=str(state.name), kind=kind.value if kind else "internal", health=state.health.value,
                             reason=state.reason, changed_at=state.changed_at,
                             last=_link_sample(state.last) if state.last else None, quarantined=state.quarantined,
                             breaker=state.breaker)
    if state.cable is not None:
        message.cable.CopyFrom(admin_pb2.LinkCable(serial=state.cable.serial, vendor=state.cable.vendor, model=state.cable.model,
                                                   first_seen=state.cable_since))
    return message


def link_history_to_proto(detail: LinkDetail) -> admin_pb2.Link:
    """A link with what the ledger kept of it: its readings, summaries, events and cables."""
    message = link_to_proto(detail.state)
    message.samples.extend(_link_sample(s) for s in detail.history.samples)
    message.summaries.extend(admin_pb2.LinkSummary(start=s.start, end=s.end, samples=s.samples, down=s.down,
                                                   corrected_growth=s.corrected_growth, recovery_growth=s.recovery_growth)
                             for s in detail.history.summaries)
    message.events.extend(admin_pb2.LinkEvent(at=e.at, health=e.health.value, reason=e.reason, partitions=e.partitions)
                          for e in detail.events)
    message.cables.extend(_link_cable(c) for c in detail.cables)
    message.samples_left_out, message.events_left_out = detail.samples_left_out, detail.events_left_out
    return message


def cabling_to_proto(cluster_id: str, test_state: str, cables: list[CableResult]) -> admin_pb2.Cabling:
    return admin_pb2.Cabling(cluster_id=cluster_id, test_state=test_state, cables=[
        admin_pb2.Cable(kind=r.cable.kind.value, lower_agent_id=r.cable.lower.agent_id, lower_port=r.cable.lower.number,
                        upper_agent_id=r.cable.upper.agent_id, upper_port=r.cable.upper.number, verdict=r.verdict.value,
                        failures=r.lines)
        for r in cables
    ])


def test_report_to_proto(cluster_id: str, state: str, outcomes: list[Outcome], running_test: str = "",
                         planned: tuple[str, ...] = ()) -> admin_pb2.ClusterTestReport:
    return admin_pb2.ClusterTestReport(
        cluster_id=cluster_id,
        state=state,
        running_test=running_test,
        planned=planned,
        results=[
            admin_pb2.ClusterTestResult(test=o.test.value, status=o.status.value, passed=o.passed, total=o.total,
                                        summary=o.summary, duration_seconds=o.duration)
            for o in outcomes
        ],
    )


def reservation_to_proto(reservation: Reservation, ipus_in_use: int) -> user_pb2.Reservation:
    return user_pb2.Reservation(
        name=reservation.name, allocation_id=reservation.allocation_id,
        ipus=[user_pb2.ReservedIpu(agent_id=agent, index=index)
              for agent, index in sorted(reservation.ipus, key=lambda ipu: (natural_key(ipu[0]), ipu[1]))],
        start=reservation.start, end=reservation.end, reason=reservation.reason, maintenance=reservation.maintenance,
        users=list(reservation.users), by=reservation.by, created=reservation.created, ipus_in_use=ipus_in_use,
        description=reservation.describe(), accounts=list(reservation.accounts))


def reservation_from_proto(message: user_pb2.Reservation) -> Reservation:
    return Reservation(message.name, message.allocation_id, frozenset((ipu.agent_id, ipu.index) for ipu in message.ipus),
                       message.start, message.end, message.reason, message.maintenance, tuple(message.users), message.by,
                       message.created, tuple(message.accounts))


def account_to_proto(account: Account, uses: Iterable[AccountUse] = ()) -> admin_pb2.Account:
    return admin_pb2.Account(
        name=account.name, users=list(account.users), cohort=account.cohort,
        quotas=[admin_pb2.AccountQuota(allocation_id=allocation_id, ipus=quota.ipus, limits=[limit.spec() for limit in quota.limits])
                for allocation_id, quota in sorted(account.quotas.items())],
        use=[admin_pb2.AccountUse(allocation_id=u.allocation_id, ipus=u.ipus, partitions=u.partitions, borrowed_ipus=u.borrowed,
                                  waiting=u.waiting, used_share=u.used_share, entitled_share=u.entitled_share) for u in uses])


def account_uses_from_proto(message: admin_pb2.Account) -> tuple[AccountUse, ...]:
    return tuple(AccountUse(u.allocation_id, u.ipus, u.partitions, u.borrowed_ipus, u.waiting, u.used_share, u.entitled_share)
                 for u in message.use)


def account_from_proto(message: admin_pb2.Account) -> Account:
    quotas: dict[str, Quota] = {}
    for quota in message.quotas:
        if quota.allocation_id in quotas:
            raise InvalidArgument(f"one quota per allocation: {quota.allocation_id or 'every allocation'} is given twice")
        quotas[quota.allocation_id] = Quota(quota.ipus, tuple(ShapeLimit.parse(limit) for limit in quota.limits))
    return Account(message.name, tuple(dict.fromkeys(u.strip() for u in message.users if u.strip())), message.cohort.strip(), quotas)


_IPU_FIELDS = tuple(f.name for f in dataclasses.fields(IpuReading) if f.name != "index")  # each a field of IpuTelemetry too


def telemetry_to_proto(reading: TelemetryReading, age: float) -> agent_pb2.MachineTelemetry:
    return agent_pb2.MachineTelemetry(
        read_at=reading.read_at, age_seconds=age,
        ipus=[agent_pb2.IpuTelemetry(index=ipu.index, **{f: getattr(ipu, f) for f in _IPU_FIELDS if getattr(ipu, f) is not None})
              for ipu in reading.ipus],
        sensors=[agent_pb2.SensorTelemetry(name=s.name, kind=s.kind, value=s.value) for s in reading.sensors])


def telemetry_from_proto(message: agent_pb2.MachineTelemetry) -> TelemetryReading:
    return TelemetryReading(
        message.read_at,
        tuple(IpuReading(ipu.index, **{f: getattr(ipu, f) if ipu.HasField(f) else None for f in _IPU_FIELDS}) for ipu in message.ipus),
        tuple(SensorReading(s.name, s.kind, s.value) for s in message.sensors))


def log_line_to_proto(line: LogLine) -> agent_pb2.MachineLogLine:
    return agent_pb2.MachineLogLine(sequence=line.sequence, at=line.at, source=line.source, text=line.text)


def log_line_from_proto(message: agent_pb2.MachineLogLine) -> LogLine:
    return LogLine(message.sequence, message.at, message.source, message.text)


def watch_report_from_proto(message: agent_pb2.WatchReply) -> WatchReport:
    telemetry = message.telemetry if message.HasField("telemetry") else None
    return WatchReport(telemetry_from_proto(telemetry) if telemetry is not None else None,
                       telemetry.age_seconds if telemetry is not None else 0.0,
                       tuple(log_line_from_proto(line) for line in message.lines), message.missed_lines, message.incarnation)
