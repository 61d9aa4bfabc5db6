"""`UserClient`: partitions, through the user end-point (virmgrpc.UserService and vipu's additions)."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable

from vipu.api.protos import vipuuser_pb2 as pb
from vipu.api.protos import vipuuser_pb2_grpc as pb_grpc
from vipu.client.base import EndpointClient
from vipu.client.connection import Stream
from vipu.client.retry import RetryPolicy, answered_early
from vipu.model.errors import HardwareFailure, NoRoom, NotFound, Unavailable, VipuError
from vipu.model.waiting import WAIT_CALL_SECONDS

# How long past its own deadline a waiting client lets the controller end the request (so that it
# is told the controller's last reason).
DEADLINE_GRACE_SECONDS = 5.0
# Between waiting calls that failed for a moment (the leader changed, say), or that the controller
# answered at once without waiting (its places for waiting calls all taken).
WAIT_RETRY = RetryPolicy(attempts=None, first_delay=0.2, longest_delay=2.0)


class UserClient(EndpointClient):
    """What a user does with partitions. Results are the API's messages (`vipu.api.protos.vipuuser_pb2`);
    failures raise the families of `vipu.model.errors`, which `vipu.client.retry.verdict` judges."""

    def _call(self, method: str, request):
        return self.connection.call(pb_grpc.UserServiceStub, method, request)

    def create_partition(self, partition_id: str, size: int, *, num_gcds: int = 1, num_replicas: int = 0,
                         cluster_id: str = "", allocation_id: str = "", reconfigurable: bool = False,
                         sync_type: int = pb.ST_UNDEFINED, ipulink_routing: int = pb.IRT_UNDEFINED,
                         num_ipulink_segments: int = 0, disable_auto_reset: bool = False,
                         keep_on_error: bool = False, index: int | None = None, relocatable: bool = False,
                         may_move: bool = False, expected_seconds: int = 0, reservation: str = "", account: str = "",
                         preemptible: bool = False, labels: dict[str, str] | None = None, wait: float = 0.0,
                         on_wait: Callable[[pb.QueuedRequest], None] | None = None) -> pb.PartitionConfig:
        """Create a partition; its IPUoF configuration, every GCD (what `ipuof_files.write` takes).
        `index` places a reconfigurable partition at the index-th run of `size` IPUs of its allocation.
        `may_move` consents that compaction moves it even while IPUoF clients are attached;
        `expected_seconds` is how long it is expected to run from its start (0: unknown);
        `reservation`, the reservation to make it in; `account`, the account to make it on
        (`preemptible`: it may be reclaimed while its account borrows quota); `labels`, the workload
        it is for, which its IPUs' telemetry is labelled with (ipujob, namespace, slurm_job).
        With `wait` (seconds), a request that does not fit now waits for room in its allocation's
        queue until the partition is ACTIVE (`on_wait` is told of its place and reason as they
        change); at the deadline it is withdrawn and NoRoom says why it waited. Interrupted
        (Ctrl-C) while it waits, the request is withdrawn too: cancelled, or the partition it
        became meanwhile removed."""
        try:
            created = self.create_or_queue(
                partition_id, size, num_gcds=num_gcds, num_replicas=num_replicas, cluster_id=cluster_id,
                allocation_id=allocation_id, reconfigurable=reconfigurable, sync_type=sync_type,
                ipulink_routing=ipulink_routing, num_ipulink_segments=num_ipulink_segments,
                disable_auto_reset=disable_auto_reset, keep_on_error=keep_on_error, index=index, relocatable=relocatable,
                may_move=may_move, expected_seconds=expected_seconds, reservation=reservation, account=account,
                preemptible=preemptible, labels=labels, wait_seconds=math.ceil(wait))
        except KeyboardInterrupt:
            if wait:  # no answer yet: the id may be a partition made before, so only a waiting request is cancelled
                with contextlib.suppress(VipuError):
                    self.cancel_queued(partition_id)
            raise
        if created.HasField("ipuof_config"):
            return created.ipuof_config
        if created.HasField("queued"):
            try:
                return self.wait_partition(partition_id, math.ceil(wait), on_wait, created.queued)
            except KeyboardInterrupt:
                self.withdraw(partition_id)
                raise
        return self.ipuof_config(partition_id)  # a controller from before the reply carried it

    def create_or_queue(self, partition_id: str, size: int, *, wait_seconds: int = 0, index: int | None = None,
                        disable_auto_reset: bool = False, keep_on_error: bool = False, relocatable: bool = False,
                        detached: bool = False, may_move: bool = False, expected_seconds: int = 0, reservation: str = "",
                        account: str = "", preemptible: bool = False, labels: dict[str, str] | None = None,
                        **requirements) -> pb.CreatePartitionReply:
        """One create call: the reply carries the new partition's IPUoF configuration, or, given
        `wait_seconds`, where its request waits for room (`queued`) if it does not fit now. A waiting
        request is withdrawn once nobody asks after it (`wait_once`) for the controller's lease, its
        waiter being gone; one `detached` (to be picked up later) has no lease.
        `requirements` are PartitionRequirements' fields, by their names in `create_partition`."""
        names = {"ipulink_routing": "ipulink_routing_type"}  # the rest are named as the message names them
        asked = pb.PartitionRequirements(id=partition_id, size=size, **{names.get(k, k): v for k, v in requirements.items()})
        if index is not None:
            asked.index = index
        return self._call("CreatePartition", pb.CreatePartitionRequest(
            requirements=asked, disable_auto_reset=disable_auto_reset, keep_on_error=keep_on_error, relocatable=relocatable,
            wait_seconds=wait_seconds, detached=detached, may_move=may_move, expected_seconds=expected_seconds,
            reservation=reservation, account=account, preemptible=preemptible, labels=labels or {}))

    def wait_once(self, partition_id: str, seconds: int) -> pb.WaitPartitionReply:
        """One waiting call: at most `seconds` (and WAIT_CALL_SECONDS) until the partition is settled;
        the reply says where its request waits (`queued`), or the partition's status and, once ACTIVE,
        its IPUoF configuration. How a request that ended without a partition ended is raised."""
        return self._call("WaitPartition", pb.WaitPartitionRequest(partition_id=partition_id,
                                                                     seconds=max(0, min(seconds, WAIT_CALL_SECONDS))))

    def wait_partition(self, partition_id: str, seconds: float, on_wait: Callable[[pb.QueuedRequest], None] | None = None,
                       queued: pb.QueuedRequest | None = None) -> pb.PartitionConfig:
        """Wait up to `seconds` for a partition whose request waits (or whose create is under way)
        to be ACTIVE; its IPUoF configuration. NoRoom at the deadline, the request cancelled; the
        controller's error if the request ended otherwise; HardwareFailure if it went to ERROR.
        Each call waits at most WAIT_CALL_SECONDS; one the controller could not answer (a new
        leader taking over, say), or answered at once without waiting (its places for waiting
        calls all taken), is made again after a pause that grows, until the deadline."""
        deadline = time.monotonic() + seconds + DEADLINE_GRACE_SECONDS
        if queued is not None and on_wait is not None:
            on_wait(queued)
        pauses = WAIT_RETRY.delays()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.withdraw(partition_id)  # the controller lets it go at its own deadline anyway
                why = f": {queued.reason}" if queued is not None else ""
                raise NoRoom(f"partition {partition_id} did not start within {seconds:g} s{why}")
            asked = max(1, min(math.floor(remaining), math.floor(self.connection.timeout / 2), WAIT_CALL_SECONDS))
            began = time.monotonic()
            try:
                reply = self.wait_once(partition_id, asked)
            except Unavailable:
                time.sleep(min(next(pauses), max(0.0, deadline - time.monotonic())))
                continue
            if reply.HasField("queued"):
                if on_wait is not None and (queued is None or (reply.queued.position, reply.queued.reason)
                                            != (queued.position, queued.reason)):
                    on_wait(reply.queued)
                queued = reply.queued
            elif reply.status.ready_state == pb.PS_ACTIVE:
                return reply.ipuof_config if reply.HasField("ipuof_config") else self.ipuof_config(partition_id)
            elif reply.status.ready_state == pb.PS_ERROR:
                raise HardwareFailure(f"partition {partition_id} is in ERROR: {'; '.join(reply.status.errors)}")
            if reply.busy or answered_early(asked, time.monotonic() - began):
                time.sleep(min(next(pauses), max(0.0, deadline - time.monotonic())))
            else:
                pauses = WAIT_RETRY.delays()

    def withdraw(self, partition_id: str) -> None:
        """Give up a request made to wait: cancel it if it still waits, or remove the partition it
        became meanwhile (a forced remove, which waits for its create to end); nothing if neither
        is left. Errors are left to the controller, which ends a request at its own deadline."""
        with contextlib.suppress(VipuError):
            self.remove_partition(partition_id, force=True)

    def list_queued(self, allocation_id: str = "") -> list[pb.QueuedRequest]:
        """The requests waiting for room in the allocations this user may use (or one), each queue in order."""
        return list(self._call("ListQueued", pb.ListQueuedRequest(allocation_id=allocation_id)).requests)

    def list_reservations(self, allocation_id: str = "") -> list[pb.Reservation]:
        """The reservations of the allocations this user may use (or one), by start."""
        return list(self._call("ListReservations", pb.ListReservationsRequest(allocation_id=allocation_id)).reservations)

    def cancel_queued(self, partition_id: str) -> None:
        """Cancel a request that waits for room."""
        self._call("CancelQueued", pb.CancelQueuedRequest(partition_id=partition_id))

    def remove_partition(self, partition_id: str, force: bool = False) -> list[str]:
        """Remove a partition; the agents a forced remove could not clear (their IPUs stay out of use
        until the controller sees them cleared)."""
        reply = self._call("RemovePartition", pb.RemovePartitionRequest(partition_id=partition_id, force=force))
        return list(reply.uncleared_agents)

    def reset_partition(self, partition_id: str, relocate: bool = False) -> None:
        """Reset a partition; with `relocate`, move it now to other IPUs of its allocation, off the
        machines that failed it (or all of its own)."""
        self._call("ResetPartition", pb.ResetPartitionRequest(partition_id=partition_id, relocate=relocate))

    def update_partition(self, partition_id: str, *, may_move: bool | None = None) -> pb.PartitionStatus:
        """Change what its user may change of a partition (its owner's, or an administrator's):
        `may_move`, the consent that compaction moves it while IPUoF clients are attached; None
        leaves it as it is. Its status as the change left it."""
        request = pb.UpdatePartitionRequest(partition_id=partition_id)
        if may_move is not None:
            request.may_move = may_move
        return self._call("UpdatePartition", request).status

    def list_partitions(self, allocation_id: str = "") -> list[pb.Partition]:
        return list(self._call("ListPartitions", pb.ListPartitionsRequest(allocation_id=allocation_id)).partitions)

    def get_partition(self, partition_id: str) -> pb.Partition:
        found = next((p for p in self.list_partitions() if p.id == partition_id), None)
        if found is None:
            raise NotFound(f"partition {partition_id} does not exist")
        return found

    def partition_telemetry(self, partition_id: str) -> pb.GetPartitionTelemetryReply:
        """What its IPUs measure now, and their utilisation over its life."""
        return self._call("GetPartitionTelemetry", pb.GetPartitionTelemetryRequest(partition_id=partition_id))

    def partition_status(self, partition_id: str) -> pb.PartitionStatus:
        return self._call("GetPartitionStatus", pb.GetPartitionStatusRequest(partition_id=partition_id)).status

    def ipuof_config(self, partition_id: str, gcd: int | None = None) -> pb.PartitionConfig:
        """The partition's IPUoF configuration: every GCD, or the one asked for."""
        request = pb.GetPartitionIpuofConfigRequest(partition_id=partition_id)
        if gcd is not None:
            request.gcd_id.id = gcd
        return self._call("GetPartitionIpuofConfig", request).ipuof_config

    def list_allocations(self) -> list[pb.Allocation]:
        """The allocations this user may create partitions in."""
        return list(self._call("ListAllocations", pb.ListAllocationsRequest()).allocations)

    def ipu_attributes(self, agents: tuple[str, ...] = ()) -> list[pb.ListIPUAttributesReply.Entry]:
        return list(self._call("ListIPUAttributes", pb.ListIPUAttributesRequest(agents=agents)).entries)

    def watch_changes(self) -> Stream:
        """The controller's changes as they happen, as `Change` messages naming the topics changed
        (partitions, configuration, users, tests) that the caller may see: the first, with none,
        once the watch is in place, and one with none every 10 s of quiet. It ends after a change
        of users (watch again); `cancel()` ends it from another thread."""
        return self.connection.stream(pb_grpc.UserServiceStub, "WatchChanges", pb.WatchChangesRequest())

    def capacity(self, size: int = 0, *, allocation_id: str = "", cluster_id: str = "") -> pb.GetCapacityReply:
        """Room now in the allocations this user may use (or the one named, or a cluster's): IPUs
        used and free, how many partitions of `size` fit side by side, the largest that fits."""
        return self._call("GetCapacity", pb.GetCapacityRequest(size=size, allocation_id=allocation_id, cluster_id=cluster_id))
