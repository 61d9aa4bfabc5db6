"""The controller's gRPC client to its agents: one cached channel per agent address."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import grpc

from vipu.api import convert
from vipu.api.channels import LEADER_EPOCH_KEY, RECONNECT_PROMPTLY
from vipu.api.protos import agent_pb2, agent_pb2_grpc
from vipu.api.status import error_from_rpc
from vipu.controller.core.lending import Cancellation
from vipu.model.clustertests import Observation, Probe
from vipu.model.configuration import AgentSettings
from vipu.model.entities import MachineInventory
from vipu.model.errors import Unavailable, VipuError
from vipu.model.hardware import MachineCondition, PowerAction, PowerState
from vipu.model.linkhealth import LinkReading
from vipu.model.telemetry import WatchReport

# No retries of our calls behind our back, and a machine that comes back is reached promptly:
# gRPC's own back-off would keep it Down, and its partitions in ERROR, long after it answers.
CHANNEL_OPTIONS = [("grpc.enable_retries", 0), *RECONNECT_PROMPTLY]


class GrpcAgentGateway:
    """Implements `AgentGateway` over gRPC, with a deadline on every call.

    Cluster-test steps get a deadline of their own: on real hardware one takes up to a minute.
    """

    def __init__(self, timeout: float = 10.0, test_timeout: float = 600.0, credentials: grpc.ChannelCredentials | None = None):
        """`credentials`: the agent link's mutual TLS (secure mode); plaintext without."""
        self.timeout = timeout
        self.test_timeout = test_timeout
        self.credentials = credentials
        self.epoch: Callable[[], int] = lambda: 0  # the leader's lease term (`Leadership`); 0: no replicas, no term
        self._lock = threading.Lock()
        self._stubs: dict[str, tuple[grpc.Channel, agent_pb2_grpc.AgentServiceStub]] = {}

    def _stub(self, host: str, port: int) -> agent_pb2_grpc.AgentServiceStub:
        address = f"{host}:{port}"
        with self._lock:
            entry = self._stubs.get(address)
            if entry is None:
                channel = (grpc.insecure_channel(address, options=CHANNEL_OPTIONS) if self.credentials is None
                           else grpc.secure_channel(address, self.credentials, options=CHANNEL_OPTIONS))
                entry = (channel, agent_pb2_grpc.AgentServiceStub(channel))
                self._stubs[address] = entry
            return entry[1]

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        epoch = self.epoch()
        return ((LEADER_EPOCH_KEY, str(epoch)),) if epoch else ()

    def _call(self, host: str, port: int, method: str, request, timeout: float | None = None):
        try:
            return getattr(self._stub(host, port), method)(request, timeout=timeout or self.timeout, metadata=self._metadata())
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None

    def inventory(self, host: str, port: int) -> MachineInventory:
        return convert.inventory_from_proto(self._call(host, port, "GetInventory", agent_pb2.GetInventoryRequest()))

    def apply(self, host: str, port: int, settings: AgentSettings) -> None:
        self._call(host, port, "ApplyPartition", agent_pb2.ApplyPartitionRequest(settings=convert.settings_to_proto(settings)))

    def clear(self, host: str, port: int, partition_id: str) -> None:
        self._call(host, port, "ClearPartition", agent_pb2.ClearPartitionRequest(partition_id=partition_id))

    def apply_all(self, targets: Sequence[tuple[str, int, AgentSettings]]) -> list[VipuError | None]:
        return self._fan_out([(host, port, "ApplyPartition", agent_pb2.ApplyPartitionRequest(settings=convert.settings_to_proto(s)))
                              for host, port, s in targets])

    def clear_all(self, targets: Sequence[tuple[str, int]], partition_id: str) -> list[VipuError | None]:
        request = agent_pb2.ClearPartitionRequest(partition_id=partition_id)
        return self._fan_out([(host, port, "ClearPartition", request) for host, port in targets])

    def _fan_out(self, calls: list[tuple[str, int, str, object]]) -> list[VipuError | None]:
        """Start every call, then collect each outcome: gRPC runs them together, with no thread
        of ours per call; each is bounded by its own deadline."""
        if len(calls) == 1:  # on the caller's own thread, with no hand-off at all
            host, port, method, request = calls[0]
            try:
                self._call(host, port, method, request)
            except VipuError as error:
                return [error]
            return [None]
        metadata = self._metadata()
        started = [getattr(self._stub(host, port), method).future(request, timeout=self.timeout, metadata=metadata)
                   for host, port, method, request in calls]
        outcomes: list[VipuError | None] = []
        for call in started:
            try:
                call.result()
                outcomes.append(None)
            except grpc.RpcError as error:
                outcomes.append(error_from_rpc(error))
        return outcomes

    def partitions(self, host: str, port: int) -> list[AgentSettings]:
        reply = self._call(host, port, "ListPartitions", agent_pb2.ListPartitionsRequest())
        return [convert.settings_from_proto(p) for p in reply.partitions]

    def diagnose(self, host: str, port: int, probe: Probe, ipus: dict[int, int], seed: int,
                 cancellation: Cancellation | None = None) -> Observation:
        """One test step; cancelled as a gRPC call (the agent sees its context end), it raises
        Unavailable at once."""
        request = agent_pb2.DiagnoseRequest(probe=probe.value, ipus=ipus, seed=seed)
        if cancellation is None:
            return convert.observation_from_proto(self._call(host, port, "Diagnose", request, self.test_timeout))
        call = self._stub(host, port).Diagnose.future(request, timeout=self.test_timeout, metadata=self._metadata())
        cancellation.arm(call.cancel)
        try:
            return convert.observation_from_proto(call.result())
        except grpc.FutureCancelledError:
            raise Unavailable(f"the test step at {host}:{port} was cancelled") from None
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None

    def link_counters(self, host: str, port: int) -> tuple[list[LinkReading], float]:
        return convert.link_counters_from_proto(self._call(host, port, "LinkCounters", agent_pb2.LinkCountersRequest()))

    def reset_link(self, host: str, port: int, place: str) -> None:
        self._call(host, port, "ResetLink", agent_pb2.ResetLinkRequest(place=place))

    def attachments(self, host: str, port: int, partition_ids: Sequence[str], fence_seconds: float = 0.0) -> dict[str, int]:
        reply = self._call(host, port, "Attachments",
                           agent_pb2.AttachmentsRequest(partition_ids=list(partition_ids), fence_seconds=fence_seconds))
        return {p.partition_id: p.attached_clients for p in reply.partitions}

    def condition(self, host: str, port: int, after_event: int = 0) -> MachineCondition:
        return convert.condition_from_proto(self._call(host, port, "GetCondition", agent_pb2.GetConditionRequest(after_event=after_event)))

    def watch(self, host: str, port: int, after_line: int, most_lines: int, incarnation: str = "", timeout: float = 0.0) -> WatchReport:
        request = agent_pb2.WatchRequest(after_line=after_line, most_lines=most_lines, incarnation=incarnation)
        return convert.watch_report_from_proto(self._call(host, port, "Watch", request, timeout or None))

    def power(self, host: str, port: int, action: PowerAction, timeout: float) -> PowerState:
        """A power action, waited for by the agent at most `timeout` seconds (and by the call a little longer)."""
        reply = self._call(host, port, "Power", agent_pb2.PowerRequest(action=action.value, timeout_seconds=timeout),
                           timeout + self.timeout)
        return PowerState(reply.power_state)

    def claim(self, host: str, port: int, takeover_grant: str = "") -> str:
        if self.credentials is None and not takeover_grant:  # a plaintext link knows no holders
            return ""
        return self._call(host, port, "Claim", agent_pb2.ClaimRequest(takeover_grant=takeover_grant)).previous_holder

    def release(self, host: str, port: int) -> None:
        if self.credentials is not None:
            self._call(host, port, "Release", agent_pb2.ReleaseRequest())

    def forget(self, host: str, port: int) -> None:
        """Drop the channel to an agent that was removed."""
        with self._lock:
            entry = self._stubs.pop(f"{host}:{port}", None)
        if entry is not None:
            entry[0].close()

    def close(self) -> None:
        with self._lock:
            entries, self._stubs = list(self._stubs.values()), {}
        for channel, _ in entries:
            channel.close()
