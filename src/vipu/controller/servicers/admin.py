"""The admin end-point: agents, clusters and allocations."""

from __future__ import annotations

from vipu.api import convert
from vipu.api.protos import admin_pb2 as pb
from vipu.api.protos import admin_pb2_grpc as pb_grpc
from vipu.controller.services.agents import AgentService, AgentView
from vipu.controller.services.allocations import AllocationService
from vipu.controller.services.clusters import ClusterService


def _agent(view: AgentView) -> pb.Agent:
    return convert.agent_to_proto(view.agent, view.cluster_id, view.allocation_id, view.ipus)


class AdminServicer(pb_grpc.AdminServiceServicer):
    def __init__(self, agents: AgentService, clusters: ClusterService, allocations: AllocationService):
        self.agents = agents
        self.clusters = clusters
        self.allocations = allocations

    def CreateAgent(self, request, context):
        agent = self.agents.create(request.id, request.host, request.port)
        return pb.CreateAgentReply(agent=convert.agent_to_proto(agent))

    def ListAgents(self, request, context):
        return pb.ListAgentsReply(agents=[_agent(view) for view in self.agents.list()])

    def GetAgent(self, request, context):
        return _agent(self.agents.get(request.id))

    def RemoveAgent(self, request, context):
        return pb.RemoveReply(removed=self.agents.remove(request.id, force=request.force))

    def CreateCluster(self, request, context):
        return convert.cluster_to_proto(self.clusters.create(convert.cluster_request_from_proto(request)))

    def ListClusters(self, request, context):
        return pb.ListClustersReply(clusters=[convert.cluster_to_proto(c, a) for c, a in self.clusters.list()])

    def GetCluster(self, request, context):
        return convert.cluster_to_proto(*self.clusters.get(request.id))

    def RemoveCluster(self, request, context):
        return pb.RemoveReply(removed=self.clusters.remove(request.id, force=request.force))

    def CreateAllocation(self, request, context):
        allocation = self.allocations.create(request.id, request.cluster_id, tuple(request.agent_ids), request.size)
        return convert.admin_allocation_to_proto(allocation)

    def ListAllocations(self, request, context):
        return pb.ListAllocationsReply(allocations=[convert.admin_allocation_to_proto(a, p) for a, p in self.allocations.list()])

    def GetAllocation(self, request, context):
        return convert.admin_allocation_to_proto(*self.allocations.get(request.id))

    def RemoveAllocation(self, request, context):
        return pb.RemoveReply(removed=self.allocations.remove(request.id, force=request.force))
