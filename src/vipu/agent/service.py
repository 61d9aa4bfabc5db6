"""The agent's gRPC service: a thin layer over one machine's backend, obeying the controller that holds it."""

from __future__ import annotations

import time

from vipu.agent.holds import MachineHold, caller_of, epoch_of
from vipu.agent.watch import MachineWatch
from vipu.api import convert
from vipu.api.protos import agent_pb2, agent_pb2_grpc
from vipu.backends.composed import ComposedMachine
from vipu.model.clustertests import Probe
from vipu.model.errors import InvalidArgument
from vipu.model.hardware import PowerAction

MAX_POWER_SECONDS = 600.0


class AgentServicer(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self, backend: ComposedMachine, hold: MachineHold, watch: MachineWatch | None = None):
        self.backend = backend
        self.hold = hold
        self.watch = watch

    def GetInventory(self, request, context):
        reply = convert.inventory_to_proto(self.backend.inventory())
        reply.holder = self.hold.holder
        return reply

    def ApplyPartition(self, request, context):
        with self.hold.obeying(caller_of(context), claim=True, epoch=epoch_of(context)):
            self.backend.apply(convert.settings_from_proto(request.settings))
        return agent_pb2.ApplyPartitionReply()

    def ClearPartition(self, request, context):
        with self.hold.obeying(caller_of(context), epoch=epoch_of(context)):
            self.backend.clear(request.partition_id)
        return agent_pb2.ClearPartitionReply()

    def ListPartitions(self, request, context):
        with self.hold.obeying(caller_of(context), epoch=epoch_of(context)):
            partitions = self.backend.partitions()
        return agent_pb2.ListPartitionsReply(partitions=[convert.settings_to_proto(s) for s in partitions])

    def Diagnose(self, request, context):
        try:
            probe = Probe(request.probe)
        except ValueError:
            raise InvalidArgument(f"unknown probe {request.probe!r}") from None
        with self.hold.obeying(caller_of(context), epoch=epoch_of(context)):
            return convert.observation_to_proto(self.backend.diagnose(probe, dict(request.ipus), request.seed))

    def LinkCounters(self, request, context):
        """Anyone may read them, as the inventory: they change nothing."""
        read_at = time.time()
        return convert.link_counters_to_proto(self.backend.link_counters(), read_at)

    def ResetLink(self, request, context):
        """A change to the machine: only from the controller the agent obeys."""
        with self.hold.obeying(caller_of(context), epoch=epoch_of(context)):
            self.backend.reset_link(request.place)
        return agent_pb2.ResetLinkReply()

    def Attachments(self, request, context):
        """A report anyone may read, as the inventory; a fence, a change to the machine, only from
        the controller the agent obeys."""
        read_at = time.time()
        if request.fence_seconds:
            with self.hold.obeying(caller_of(context), epoch=epoch_of(context)):
                reports = self.backend.attachments(list(request.partition_ids), request.fence_seconds)
        else:
            reports = self.backend.attachments(list(request.partition_ids))
        return agent_pb2.AttachmentsReply(read_at=read_at, partitions=[
            agent_pb2.PartitionAttachments(partition_id=r.partition_id, attached_clients=r.attached_clients,
                                           oldest_attached_at=r.oldest_attached_at, fenced_until=r.fenced_until)
            for r in reports])

    def GetCondition(self, request, context):
        """Anyone may read it, as the inventory."""
        return convert.condition_to_proto(self.backend.condition(request.after_event))

    def Power(self, request, context):
        """A change to the machine: only from the controller the agent obeys."""
        try:
            action = PowerAction(request.action)
        except ValueError:
            raise InvalidArgument(f"unknown power action {request.action!r}: on, off, reset or cycle") from None
        if not 0 < request.timeout_seconds <= MAX_POWER_SECONDS:
            raise InvalidArgument(f"a power action waits from 0 to {MAX_POWER_SECONDS:.0f} s, not {request.timeout_seconds:g}")
        with self.hold.obeying(caller_of(context), epoch=epoch_of(context)):
            state = self.backend.power(action, request.timeout_seconds)
        return agent_pb2.PowerReply(power_state=state.value)

    def Watch(self, request, context):
        """Telemetry and log lines: only to the controller the agent obeys, since a machine's log may
        say what its tenant ran (a vPOD's controller sees its own machines, no other tenant's)."""
        with self.hold.obeying(caller_of(context), epoch=epoch_of(context)):
            reply = agent_pb2.WatchReply()
            if self.watch is not None:
                reading, age = self.watch.latest()
                if reading is not None:
                    reply.telemetry.CopyFrom(convert.telemetry_to_proto(reading, age))
                reply.incarnation = self.watch.incarnation
                # Lines numbered by another run of this agent are no guide: every line kept is new to the caller.
                after = request.after_line if request.incarnation == self.watch.incarnation else 0
                lines, missed = self.watch.log.after(after, request.most_lines)
                reply.lines.extend(convert.log_line_to_proto(line) for line in lines)
                reply.missed_lines = missed
            return reply

    def Claim(self, request, context):
        caller = caller_of(context)
        previous = self.hold.claim(caller, request.takeover_grant, self.backend.inventory().serial, self._clear_all)
        return agent_pb2.ClaimReply(holder=self.hold.holder, previous_holder=previous)

    def Release(self, request, context):
        self.hold.release(caller_of(context))
        return agent_pb2.ReleaseReply()

    def _clear_all(self) -> None:
        for settings in self.backend.partitions():
            self.backend.clear(settings.partition_id)
