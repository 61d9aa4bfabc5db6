"""`UserClient`: partitions, through the user end-point (virmgrpc.UserService and vipu's additions)."""

from __future__ import annotations

from vipu.api.protos import vipuuser_pb2 as pb
from vipu.api.protos import vipuuser_pb2_grpc as pb_grpc
from vipu.client.base import EndpointClient
from vipu.client.connection import Stream
from vipu.model.errors import NotFound


class UserClient(EndpointClient):
    """What a user does with partitions. Results are the API's messages (`vipu.api.protos.vipuuser_pb2`);
    failures raise the families of `vipu.model.errors`, which `vipu.client.retry.verdict` judges."""

    def _call(self, method: str, request):
        return self.connection.call(pb_grpc.UserServiceStub, method, request)

    def create_partition(self, partition_id: str, size: int, *, num_gcds: int = 1, num_replicas: int = 0,
                         cluster_id: str = "", allocation_id: str = "", reconfigurable: bool = False,
                         sync_type: int = pb.ST_UNDEFINED, ipulink_routing: int = pb.IRT_UNDEFINED,
                         num_ipulink_segments: int = 0, disable_auto_reset: bool = False,
                         keep_on_error: bool = False, index: int | None = None) -> pb.PartitionConfig:
        """Create a partition; its IPUoF configuration, every GCD (what `ipuof_files.write` takes).
        `index` places a reconfigurable partition at the index-th run of `size` IPUs of its allocation."""
        requirements = pb.PartitionRequirements(
            id=partition_id, size=size, num_gcds=num_gcds, num_replicas=num_replicas, cluster_id=cluster_id,
            allocation_id=allocation_id, reconfigurable=reconfigurable, sync_type=sync_type,  # type: ignore[arg-type]
            ipulink_routing_type=ipulink_routing, num_ipulink_segments=num_ipulink_segments)  # type: ignore[arg-type]
        if index is not None:
            requirements.index = index
        created = self._call("CreatePartition", pb.CreatePartitionRequest(
            requirements=requirements, disable_auto_reset=disable_auto_reset, keep_on_error=keep_on_error))
        if created.HasField("ipuof_config"):
            return created.ipuof_config
        return self.ipuof_config(partition_id)  # a controller from before the reply carried it

    def remove_partition(self, partition_id: str, force: bool = False) -> None:
        self._call("RemovePartition", pb.RemovePartitionRequest(partition_id=partition_id, force=force))

    def reset_partition(self, partition_id: str) -> None:
        self._call("ResetPartition", pb.ResetPartitionRequest(partition_id=partition_id))

    def list_partitions(self, allocation_id: str = "") -> list[pb.Partition]:
        return list(self._call("ListPartitions", pb.ListPartitionsRequest(allocation_id=allocation_id)).partitions)

    def get_partition(self, partition_id: str) -> pb.Partition:
        found = next((p for p in self.list_partitions() if p.id == partition_id), None)
        if found is None:
            raise NotFound(f"partition {partition_id} does not exist")
        return found

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
