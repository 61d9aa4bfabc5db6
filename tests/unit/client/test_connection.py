"""The CLIs' connection to several controller replicas: past standbys and dead addresses, never past a served call."""

from __future__ import annotations

from contextlib import contextmanager

import grpc
import pytest

from tests.ports import free_port
from vipu.api.protos import version_pb2, version_pb2_grpc
from vipu.api.serving import serve
from vipu.api.status import GuardInterceptor
from vipu.client.connection import Connection
from vipu.client.settings import ClientSettings, address
from vipu.model.errors import Conflict, InvalidArgument, Standby, Unavailable


class Replica(version_pb2_grpc.VersionServiceServicer):
    """A version service that answers with its name, or refuses as a standby or with another error."""

    def __init__(self, name: str, refusal: Exception | None = None):
        self.name = name
        self.refusal = refusal
        self.calls = 0

    @contextmanager
    def admit(self, method, metadata, peer):
        self.calls += 1
        if self.refusal is not None:
            raise self.refusal
        yield

    def GetVersion(self, request, context):
        return version_pb2.VersionReply(version=self.name)


@pytest.fixture
def replicas():
    started: list[tuple[grpc.Server, int, Replica]] = []

    def start(replica: Replica) -> int:
        port = free_port()
        server = serve(lambda s: version_pb2_grpc.add_VersionServiceServicer_to_server(replica, s), "127.0.0.1", port,
                       GuardInterceptor(authenticate=replica.admit))
        started.append((server, port, replica))
        return port

    yield start
    for server, _, _ in started:
        server.stop(0)


def version(connection: Connection) -> str:
    return connection.server_version()


def test_a_call_passes_standbys_and_unreachable_replicas_and_stays_with_the_one_that_served(replicas):
    standby = Replica("standby", Standby("this vipu-server is a standby replica; the leader is at h2", "h2"))
    leader = Replica("leader")
    dead = free_port()
    hosts = f"127.0.0.1:{replicas(standby)},127.0.0.1:{dead},127.0.0.1:{replicas(leader)}"
    connection = Connection(ClientSettings(hosts, 8090), timeout=5)
    assert version(connection) == "leader"
    assert version(connection) == "leader"
    assert standby.calls == 1  # the second call went straight to the replica that served
    assert connection.address == connection.addresses[2]


def test_a_service_refusal_is_not_sent_on_to_the_next_replica(replicas):
    first, second = Replica("first", Conflict("not enough free IPUs")), Replica("second")
    connection = Connection(ClientSettings(f"127.0.0.1:{replicas(first)},127.0.0.1:{replicas(second)}", 8090), timeout=5)
    with pytest.raises(Conflict, match="not enough free IPUs"):
        version(connection)
    assert second.calls == 0


def test_when_no_replica_serves_the_error_says_what_each_answered(replicas):
    standby = Replica("standby", Standby("this vipu-server is a standby replica; no leader is known yet"))
    dead = free_port()
    standby_port = replicas(standby)
    connection = Connection(ClientSettings(f"127.0.0.1:{dead},127.0.0.1:{standby_port}", 8090), timeout=5)
    with pytest.raises(Unavailable) as refused:
        version(connection)
    assert refused.value.message == (
        f"no vipu-server of 127.0.0.1:{dead}, 127.0.0.1:{standby_port} serves: "
        f"vipu-server at 127.0.0.1:{dead}: unreachable (connection refused); "
        f"127.0.0.1:{standby_port}: this vipu-server is a standby replica; no leader is known yet"
    )


def test_a_lone_standby_says_where_the_leader_is(replicas):
    standby = Replica("standby", Standby("this vipu-server is a standby replica; the leader is at h2", "h2"))
    connection = Connection(ClientSettings("127.0.0.1", replicas(standby)), timeout=5)
    with pytest.raises(Standby) as refused:
        version(connection)
    assert (refused.value.message, refused.value.leader) == ("this vipu-server is a standby replica; the leader is at h2", "h2")


@pytest.mark.parametrize(("entry", "expected"), [
    ("ctrl", "ctrl:8090"),
    ("ctrl:9000", "ctrl:9000"),
    ("10.0.0.1", "10.0.0.1:8090"),
    ("fd00::1", "[fd00::1]:8090"),
    ("[fd00::1]", "[fd00::1]:8090"),
    ("[fd00::1]:9000", "[fd00::1]:9000"),
    (" ctrl ", "ctrl:8090"),
])
def test_host_entries_become_addresses(entry, expected):
    assert address(entry, 8090) == expected


@pytest.mark.parametrize("entry", ["ctrl:", "ctrl:port", "ctrl:0", "ctrl:70000", ":9000", "[fd00::1]x", "[]:9000", "[fd00::1"])
def test_malformed_host_entries_are_refused(entry):
    with pytest.raises(InvalidArgument, match="cannot understand the host"):
        address(entry, 8090)


def test_a_list_of_hosts_gives_every_replica_with_the_common_port():
    assert ClientSettings("h1, h2:9000,,h3", 8090).addresses == ["h1:8090", "h2:9000", "h3:8090"]
