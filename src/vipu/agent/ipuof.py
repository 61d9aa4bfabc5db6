"""The IPUoF end-point of a machine: IPUoF clients attach to its IPUs, run programs on them and detach."""

from __future__ import annotations

from vipu.api.protos import ipuof_pb2, ipuof_pb2_grpc
from vipu.backends.base import MachineBackend


class IpuofServicer(ipuof_pb2_grpc.IpuofServiceServicer):
    def __init__(self, backend: MachineBackend):
        self.backend = backend

    def Attach(self, request, context):
        self.backend.ipuof_attach(request.partition_id, request.device_id, request.chip_id, request.attach_key, request.session,
                                  request.hold_seconds)
        return ipuof_pb2.AttachReply()

    def Run(self, request, context):
        result = self.backend.ipuof_run(request.partition_id, request.device_id, request.chip_id, request.routing_id, request.seed,
                                        request.attach_key, request.session)
        return ipuof_pb2.RunReply(result=result)

    def Detach(self, request, context):
        self.backend.ipuof_detach(request.partition_id, request.device_id, request.session)
        return ipuof_pb2.DetachReply()
