"""The user end-point: the published virmgrpc.UserService, plus our additions."""

from __future__ import annotations

import math

from vipu.api import convert
from vipu.api.protos import vipuuser_pb2 as pb
from vipu.api.protos import vipuuser_pb2_grpc as pb_grpc
from vipu.controller.auth import caller
from vipu.controller.core.changes import ChangeFeed
from vipu.controller.usecases.partitions import AllocationRoom, PartitionService
from vipu.controller.usecases.requests import RequestService, Waiting
from vipu.controller.usecases.reservations import ReservationView
from vipu.controller.usecases.telemetry import TelemetryService
from vipu.model.errors import Unavailable


class UserServicer(pb_grpc.UserServiceServicer):
    def __init__(self, partitions: PartitionService, requests: RequestService, changes: ChangeFeed,
                 telemetry: TelemetryService | None = None):
        self.partitions = partitions
        self.requests = requests
        self.changes = changes
        self.telemetry = telemetry

    def ListPartitions(self, request, context):
        partitions = self.partitions.list(request.allocation_id, caller())
        versions = self.partitions.ipuof_versions(partitions)
        return pb.ListPartitionsReply(partitions=[convert.partition_to_proto(p, versions[p.id]) for p in partitions])

    def ListIPUAttributes(self, request, context):
        entries = []
        for entry in self.partitions.ipu_attributes(list(request.agents), caller()):
            message = pb.ListIPUAttributesReply.Entry(agent=entry.agent_id)
            for index, attributes in entry.ipus.items():
                message.ipu_attributes[index].attributes.update(attributes)
            entries.append(message)
        return pb.ListIPUAttributesReply(entries=entries)

    def CreatePartition(self, request, context):
        created = self.requests.create(convert.requirements_from_proto(request), caller(), keep_on_error=request.keep_on_error,
                                       wait_seconds=request.wait_seconds, detached=request.detached)
        if isinstance(created, Waiting):
            return pb.CreatePartitionReply(partition_id=created.request.partition_id, queued=queued_to_proto(created))
        partition, gcds, version = created
        return pb.CreatePartitionReply(partition_id=partition.id, ipuof_config=convert.config_to_proto(partition, gcds, version))

    def RemovePartition(self, request, context):
        uncleared = self.requests.remove(request.partition_id, force=request.force, access=caller())
        return pb.RemovePartitionReply(uncleared_agents=uncleared)

    def ResetPartition(self, request, context):
        if request.relocate:
            self.partitions.relocate(request.partition_id, caller())
        elif request.relocatable:  # the published meaning: move it only if machines failed it
            self.partitions.relocate(request.partition_id, caller(), only_off_failed=True)
        else:
            self.partitions.reset(request.partition_id, caller())
        return pb.ResetPartitionReply()

    def GetPartitionIpuofConfig(self, request, context):
        gcd = request.gcd_id.id if request.HasField("gcd_id") else None
        partition, gcds, version = self.partitions.ipuof_config(request.partition_id, gcd, caller())
        return pb.GetPartitionIpuofConfigReply(ipuof_config=convert.config_to_proto(partition, gcds, version))

    def GetPartitionStatus(self, request, context):
        partition = self.partitions.get(request.partition_id, caller())
        return pb.GetPartitionStatusReply(status=convert.status_to_proto(partition))

    def ListAllocations(self, request, context):
        allocations, ilds = self.partitions.allocations(caller()), self.partitions.agent_ilds()
        return pb.ListAllocationsReply(allocations=[convert.user_allocation_to_proto(a, ilds) for a in allocations])

    def GetCapacity(self, request, context):
        return capacity_reply(self.partitions.capacity(request.size, request.allocation_id, request.cluster_id, caller()))

    def WatchChanges(self, request, context):
        context.add_callback(self.changes.wake)  # a watcher that goes away stops waiting at once
        for topics in self.changes.watch(caller(), context.is_active):
            yield pb.Change(topics=sorted(topic.value for topic in topics))

    def WaitPartition(self, request, context):
        settled = self.requests.wait(request.partition_id, request.seconds, caller())
        reply = pb.WaitPartitionReply(busy=settled.busy)
        if settled.waiting is not None:
            reply.queued.CopyFrom(queued_to_proto(settled.waiting))
        if settled.partition is not None:
            reply.status.CopyFrom(convert.status_to_proto(settled.partition))
        if settled.gcds is not None and settled.partition is not None:
            reply.ipuof_config.CopyFrom(convert.config_to_proto(settled.partition, settled.gcds, settled.ipuof_version))
        return reply

    def ListQueued(self, request, context):
        return queued_reply(self.requests.list(request.allocation_id, caller()))

    def ListReservations(self, request, context):
        return reservations_reply(self.partitions.reservations.list(request.allocation_id, caller()))

    def CancelQueued(self, request, context):
        self.requests.cancel(request.partition_id, caller())
        return pb.CancelQueuedReply()

    def GetPartitionTelemetry(self, request, context):
        partition = self.partitions.get(request.partition_id, caller())
        if self.telemetry is None:
            raise Unavailable("this controller does not collect telemetry")
        ipus, history = self.telemetry.partition(partition)
        reply = pb.GetPartitionTelemetryReply()
        for ipu in ipus:
            entry = reply.ipus.add(agent_id=ipu.agent_id, index=ipu.index, routing_id=ipu.routing_id)
            if math.isfinite(ipu.age):
                entry.age_seconds = ipu.age
            for field in ("utilisation", "temperature", "power", "clock_mhz", "memory_used", "ecc_errors"):
                value = getattr(ipu.reading, field) if ipu.reading is not None else None
                if value is not None:
                    setattr(entry, field, value)
        for at, values in history:
            reply.history.add(at=at, utilisation=[math.nan if v is None else v for v in values])
        return reply

    def UpdatePartition(self, request, context):
        may_move = request.may_move if request.HasField("may_move") else None
        partition = self.partitions.update(request.partition_id, may_move=may_move, access=caller())
        return pb.UpdatePartitionReply(status=convert.status_to_proto(partition))


def queued_to_proto(waiting: Waiting) -> pb.QueuedRequest:
    return convert.queued_to_proto(waiting.request, waiting.position, waiting.reason)


def reservations_reply(views: list[ReservationView]) -> pb.ListReservationsReply:
    return pb.ListReservationsReply(reservations=[convert.reservation_to_proto(v.reservation, v.ipus_in_use) for v in views])


def queued_reply(waiting: list[Waiting]) -> pb.ListQueuedReply:
    return pb.ListQueuedReply(requests=[queued_to_proto(w) for w in waiting])


def capacity_reply(rooms: list[AllocationRoom]) -> pb.GetCapacityReply:
    return pb.GetCapacityReply(
        allocations=[pb.AllocationCapacity(allocation_id=r.allocation_id, cluster_id=r.cluster_id, total_ipus=r.total_ipus,
                                           used_ipus=r.used_ipus, free_ipus=r.free_ipus, fitting=r.fitting, largest=r.largest,
                                           blocked=r.blocked, down_ipus=r.down_ipus, held_ipus=r.held_ipus,
                                           held_for=r.held_for, draining_ipus=r.draining_ipus, reserved_ipus=r.reserved_ipus)
                     for r in rooms],
        fitting=sum(r.fitting for r in rooms),
        largest=max((r.largest for r in rooms), default=0),
    )
