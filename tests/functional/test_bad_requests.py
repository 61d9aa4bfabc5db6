"""Bad input at the gRPC door: random requests to the user API (hypothesis) against a real
controller. Every refusal is a proper status with a message, never an internal error, and leaves
the controller as it was."""

from __future__ import annotations

import contextlib

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.functional.harness import wait_until
from vipu.api.protos import admin_pb2, admin_pb2_grpc
from vipu.api.protos import vipuuser_pb2 as pb
from vipu.api.protos import vipuuser_pb2_grpc as pb_grpc

pytestmark = pytest.mark.functional

REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.ALREADY_EXISTS,
            grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED}
UINT = st.one_of(st.integers(0, 80), st.integers(0, 2**32 - 1))
IDS = st.one_of(st.text(max_size=70), st.sampled_from(["p1", "held", "", " ", "a/b", "x" * 64]))
REQUIREMENTS = st.builds(
    pb.PartitionRequirements, id=IDS, size=UINT, cluster_id=st.sampled_from(["", "cl0", "nosuch"]),
    ipulink_routing_type=st.integers(0, 9), num_ipulink_segments=UINT, gw_routing_type=st.integers(0, 5),
    sync_type=st.integers(0, 9), num_gcds=UINT, reconfigurable=st.booleans(), num_replicas=UINT,
    allocation_id=st.sampled_from(["", "alloc-1", "nosuch"]))


def state(api) -> list:
    partitions = api.ListPartitions(pb.ListPartitionsRequest()).partitions
    waiting = api.ListQueued(pb.ListQueuedRequest()).requests
    return sorted((p.id, p.SerializeToString()) for p in partitions) + sorted(r.partition_id for r in waiting)


CHANGING = {"CreatePartition", "ResetPartition", "CancelQueued"}


def served_lines(log, logged: int, served: int) -> str:
    """The log written since `logged`, checked: no traceback, and at most a couple of lines for each
    call served that changed something (what it made, reset or removed), so none for a refusal. The server writes its
    log from a thread of its own, so the last lines may still be on their way: that only lets
    a few more through, never fails a good run."""
    grown = log.read_bytes()[logged:].decode(errors="replace")  # the size is in bytes
    assert "Traceback" not in grown, grown[-2000:]
    assert len(grown.splitlines()) <= 2 * served + 4, (served, grown[-2000:])
    return grown


def test_random_requests_are_served_or_refused_cleanly(registered_pod):
    api = pb_grpc.UserServiceStub(registered_pod._channel(registered_pod.user_port))
    log = registered_pod.directory / "server.log"
    logged, served = log.stat().st_size, [0]

    @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(requirements=REQUIREMENTS, other_id=IDS, force=st.booleans(), wait_seconds=st.one_of(st.just(0), UINT),
           relocate=st.booleans(), seconds=st.integers(0, 1))
    def call_each_method(requirements, other_id, force, wait_seconds, relocate, seconds):
        if not state(api):
            api.CreatePartition(pb.CreatePartitionRequest(requirements=pb.PartitionRequirements(id="held", size=4)))
            served[0] += 1
        calls = [
            ("CreatePartition", pb.CreatePartitionRequest(requirements=requirements, wait_seconds=wait_seconds,
                                                          relocatable=relocate)),
            ("ResetPartition", pb.ResetPartitionRequest(partition_id=other_id, relocatable=relocate)),
            ("GetPartitionStatus", pb.GetPartitionStatusRequest(partition_id=other_id)),
            ("GetPartitionIpuofConfig", pb.GetPartitionIpuofConfigRequest(partition_id=other_id)),
            ("ListPartitions", pb.ListPartitionsRequest(allocation_id=other_id)),
            ("WaitPartition", pb.WaitPartitionRequest(partition_id=other_id, seconds=seconds)),
            ("ListQueued", pb.ListQueuedRequest(allocation_id=other_id)),
            ("CancelQueued", pb.CancelQueuedRequest(partition_id=other_id)),
        ]
        for method, request in calls:
            before = state(api)
            try:
                getattr(api, method)(request, timeout=30)
                served[0] += method in CHANGING  # a reading logs nothing
            except grpc.RpcError as error:
                assert error.code() in REFUSALS, (method, request, error.code(), error.details())
                assert error.details() and "\n" not in error.details() and "Traceback" not in error.details()
                assert state(api) == before, (method, request)
        created = requirements.id
        if created and created != "held" and created in {entry if isinstance(entry, str) else entry[0] for entry in state(api)}:
            api.RemovePartition(pb.RemovePartitionRequest(partition_id=created, force=force))  # or cancels its request
            served[0] += 1

    call_each_method()
    served_lines(log, logged, served[0])


def test_malformed_bytes_are_refused_in_one_line_and_a_storm_of_them_barely_touches_the_log(registered_pod):
    """Bytes that are not the method's message: INVALID_ARGUMENT, not INTERNAL with a traceback, at
    every door (the controller's user and admin end-points, a machine's agent and IPUoF end-points);
    1,000 of them at each add a few lines to the logs, not 1,000 tracebacks."""
    pod = registered_pod
    garbage = b"\xff\xff\xff\xff\x0f"  # a field tag with no end
    m01 = pod.rack.machine("m01")
    server_log, agent_log = pod.directory / "server.log", pod.directory / "agent-m01.log"
    doors = [(pod.user_port, "/virmgrpc.UserService/CreatePartition", server_log),
             (pod.admin_port, "/vipu.admin.v1.AdminService/ListAgents", server_log),
             (m01.port, "/vipu.agent.v1.AgentService/ApplyPartition", agent_log),
             (m01.ipuof_port, "/vipu.ipuof.v1.IpuofService/Attach", agent_log)]
    before, counted_before = {log: log.stat().st_size for log in (server_log, agent_log)}, pod.metrics()
    for port, method, _ in doors:
        call = pod._channel(port).unary_unary(method, request_serializer=None, response_deserializer=None)
        for _ in range(1000):
            with pytest.raises(grpc.RpcError) as refused:
                call(garbage, timeout=5)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == f"malformed request: its 5 bytes are not a {method} request"
    for log, size in before.items():
        grown = log.read_bytes()[size:].decode(errors="replace")
        assert "Traceback" not in grown and grown.count("malformed request") <= 4, grown[-2000:]
        assert len(grown) < 2000, grown[-2000:]
    counted = pod.metrics()
    for service, method in (("virmgrpc.UserService", "CreatePartition"), ("vipu.admin.v1.AdminService", "ListAgents")):
        sample = f'vipu_malformed_requests_total{{method="{method}",service="{service}"}}'
        assert counted[sample] - counted_before.get(sample, 0) == 1000


def test_random_bytes_at_every_door_are_served_or_refused_in_one_line_and_the_logs_stay_small(registered_pod):
    """Whatever bytes arrive (most are no message at all, some decode to one): a proper status and
    one line at the user, admin, agent and IPUoF end-points, the pod as it was, and logs that grow
    by a few lines for the whole run, not a line or a traceback per request."""
    pod = registered_pod
    m01 = pod.rack.machine("m01")
    doors = [(pod.user_port, "/virmgrpc.UserService/GetPartitionStatus"), (pod.user_port, "/virmgrpc.UserService/ListPartitions"),
             (pod.user_port, "/virmgrpc.UserService/RemovePartition"), (pod.user_port, "/virmgrpc.UserService/ResetPartition"),
             (pod.admin_port, "/vipu.admin.v1.AdminService/GetAgent"), (pod.admin_port, "/vipu.admin.v1.AdminService/ListAgents"),
             (pod.admin_port, "/vipu.admin.v1.AdminService/RemoveAgent"),
             (m01.port, "/vipu.agent.v1.AgentService/GetInventory"), (m01.ipuof_port, "/vipu.ipuof.v1.IpuofService/Attach")]
    assert pod.user("create", "partition", "kept", "--size", "4").code == 0  # on m01: what a request changing things would change
    logs = {log: log.stat().st_size for log in (pod.directory / "server.log", pod.directory / "agent-m01.log")}
    before = pod.snapshot()

    @settings(max_examples=400, deadline=None)
    @given(door=st.sampled_from(doors), payload=st.binary(max_size=120))
    def arrive(door, payload):
        port, method = door
        try:
            pod._channel(port).unary_unary(method, request_serializer=None, response_deserializer=None)(payload, timeout=5)
        except grpc.RpcError as error:
            assert error.code() in REFUSALS, (method, payload, error.code(), error.details())
            assert error.details() and "\n" not in error.details()

    arrive()
    assert pod.snapshot() == before
    for log, size in logs.items():
        grown = log.read_bytes()[size:].decode(errors="replace")
        assert "Traceback" not in grown and len(grown) < 4000, grown[-2000:]


ADMIN_IDS = st.one_of(st.text(max_size=70), st.sampled_from(["ag1", "ag9", "cl0", "cl9", "alloc-1", "a9", "", "x" * 64]))


def test_random_admin_requests_are_served_or_refused_cleanly(registered_pod):
    """The admin end-point too: every refusal a proper status and one line, the pod as it was, and
    nothing in the server's log that looks like a crash or a line per refusal."""
    pod = registered_pod
    api = admin_pb2_grpc.AdminServiceStub(pod._channel(pod.admin_port))
    log = pod.directory / "server.log"
    logged, served = log.stat().st_size, [0]

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(entity_id=ADMIN_IDS, agents=st.lists(ADMIN_IDS, max_size=5), port=UINT, size=UINT, ilds=UINT,
           topology=st.integers(0, 5), tests=st.lists(st.sampled_from(["Sync-Link", "Cabling", "Traffic", "nonsense", ""]),
                                                      max_size=3), force=st.booleans())
    def call_each_method(entity_id, agents, port, size, ilds, topology, tests, force):
        before = pod.snapshot()
        calls = [
            ("CreateAgent", admin_pb2.CreateAgentRequest(id=entity_id, host="127.0.0.1", port=port)),
            ("CreateCluster", admin_pb2.CreateClusterRequest(id=entity_id, agent_ids=agents, topology=topology,
                                                             num_ipulinkdomains=ilds)),
            ("CreateAllocation", admin_pb2.CreateAllocationRequest(id=entity_id, cluster_id="cl0", agent_ids=agents, size=size)),
            ("GetAgent", admin_pb2.GetRequest(id=entity_id)),
            ("GetCluster", admin_pb2.GetRequest(id=entity_id)),
            ("GetAllocation", admin_pb2.GetRequest(id=entity_id)),
            ("CreateUser", admin_pb2.CreateUserRequest(id=entity_id)),
            ("TestCluster", admin_pb2.TestClusterRequest(cluster_id=entity_id, tests=tests, wait=False)),
        ]
        for method, request in calls:
            try:
                getattr(api, method)(request, timeout=30)
                served[0] += 1
            except grpc.RpcError as error:
                assert error.code() in REFUSALS | {grpc.StatusCode.UNAVAILABLE}, (method, request, error.code(), error.details())
                assert error.details() and "\n" not in error.details()
        after = pod.snapshot()
        if after != before:  # something was made: take it away again, by the API, and compare
            made = [m for m, _ in calls if m.startswith("Create")]
            for kind in ("Allocation", "Cluster", "Agent"):
                if f"Create{kind}" in made:
                    with contextlib.suppress(grpc.RpcError):
                        getattr(api, f"Remove{kind}")(admin_pb2.RemoveRequest(id=entity_id, force=force), timeout=30)
                        served[0] += 1
            wait_until(lambda: pod.snapshot() == before, timeout=30, what="the pod as it was")

    call_each_method()
    served_lines(log, logged, served[0])
