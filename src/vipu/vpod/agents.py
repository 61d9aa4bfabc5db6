"""The orchestrator's own link to the site's agents: reading a machine, and taking it back.

The orchestrator is a controller of the site by certificate (named `vipu-vpod`, issued by the
site's agent-link authority) and holds that authority's key, so it can sign takeover grants: one
for a tenant's controller to take a machine (handed over by that controller's admin end-point),
one for itself to take a machine back from a tenant, clearing it.
"""

from __future__ import annotations

import grpc

from vipu.api import grants
from vipu.api.protos import agent_pb2, agent_pb2_grpc
from vipu.api.status import error_from_rpc
from vipu.api.tls import TlsFiles, client_credentials, link_authority
from vipu.vpod.store import SiteMachine

IDENTITY = "vipu-vpod"


class SiteAgents:
    def __init__(self, site: TlsFiles, identity: TlsFiles, timeout: float = 10.0):
        """`site`: the site's TLS directory (with the agent-link authority's key); `identity`: the
        orchestrator's own, whose controller/ holds its agent-link certificate."""
        self.site = site
        self.timeout = timeout
        self._credentials = client_credentials(identity.ca_for(identity.controller_dir), identity.controller_cert,
                                               identity.controller_key)

    def _call(self, machine: SiteMachine, method: str, request):
        with grpc.secure_channel(f"{machine.host}:{machine.port}", self._credentials) as channel:
            try:
                return getattr(agent_pb2_grpc.AgentServiceStub(channel), method)(request, timeout=self.timeout)
            except grpc.RpcError as error:
                failure = error_from_rpc(error)
                raise type(failure)(f"machine {machine.name}: {failure.message}") from None

    def serial(self, machine: SiteMachine) -> str:
        return self._call(machine, "GetInventory", agent_pb2.GetInventoryRequest()).machine_serial

    def holder(self, machine: SiteMachine) -> str:
        return self._call(machine, "GetInventory", agent_pb2.GetInventoryRequest()).holder

    def grant(self, machine: SiteMachine, holder: str) -> str:
        """A grant for controller `holder` to take the machine."""
        key = self.site.link_ca_key.read_bytes()
        return grants.sign(key, link_authority(self.site.controller_dir), self.serial(machine), holder)

    def take_back(self, machine: SiteMachine) -> None:
        """Hold the machine again, whoever held it, its partitions cleared."""
        if self.holder(machine) == IDENTITY:  # taken back before: what is left is cleared again
            self._clear(machine)
            return
        self._call(machine, "Claim", agent_pb2.ClaimRequest(takeover_grant=self.grant(machine, IDENTITY)))

    def _clear(self, machine: SiteMachine) -> None:
        for settings in self._call(machine, "ListPartitions", agent_pb2.ListPartitionsRequest()).partitions:
            self._call(machine, "ClearPartition", agent_pb2.ClearPartitionRequest(partition_id=settings.partition_id))
