"""The agent's gRPC service: a thin layer over one machine's backend."""

from __future__ import annotations

from vipu.api import convert
from vipu.api.protos import agent_pb2, agent_pb2_grpc
from vipu.backends.base import MachineBackend
from vipu.model.clustertests import Probe
from vipu.model.errors import InvalidArgument


class AgentServicer(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self, backend: MachineBackend):
        self.backend = backend

    def GetInventory(self, request, context):
        return convert.inventory_to_proto(self.backend.inventory())

    def ApplyPartition(self, request, context):
        self.backend.apply(convert.settings_from_proto(request.settings))
        return agent_pb2.ApplyPartitionReply()

    def ClearPartition(self, request, context):
        self.backend.clear(request.partition_id)
        return agent_pb2.ClearPartitionReply()

    def ListPartitions(self, request, context):
        return agent_pb2.ListPartitionsReply(
            partitions=[convert.settings_to_proto(s) for s in self.backend.partitions()]
        )

    def Diagnose(self, request, context):
        try:
            probe = Probe(request.probe)
        except ValueError:
            raise InvalidArgument(f"unknown probe {request.probe!r}") from None
        return convert.observation_to_proto(self.backend.diagnose(probe, dict(request.ipus), request.seed))
