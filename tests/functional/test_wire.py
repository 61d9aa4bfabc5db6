"""A client that knows only the published virmgrpc wire format drives the controller.

It builds requests from field numbers by hand and calls the published method paths with raw
bytes, as a client compiled from the published protos would: nothing of ours is used.
"""

from __future__ import annotations

import grpc


def field(number: int, wire_type: int, payload: bytes) -> bytes:
    return bytes([number << 3 | wire_type]) + payload


def text(number: int, value: str) -> bytes:
    raw = value.encode()
    return field(number, 2, bytes([len(raw)]) + raw)


def leb128(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def varint(number: int, value: int) -> bytes:
    return field(number, 0, leb128(value))


def nested(number: int, body: bytes) -> bytes:
    return field(number, 2, bytes([len(body)]) + body)


def call(pod, method: str, request: bytes) -> bytes:
    channel = grpc.insecure_channel(f"127.0.0.1:{pod.user_port}")
    try:
        return channel.unary_unary(f"/virmgrpc.UserService/{method}")(request, timeout=30)
    finally:
        channel.close()


def test_a_client_of_the_published_api_creates_inspects_and_removes_a_partition(registered_pod):
    pod = registered_pod
    # CreatePartitionRequest { requirements (2) { id (1): "w1", size (2): 8, num_gcds (8): 2 } }
    reply = call(pod, "CreatePartition", nested(2, text(1, "w1") + varint(2, 8) + varint(8, 2)))
    # CreatePartitionReply { partition_id (1): "w1" }, then only our extension ipuof_config (100),
    # one length-delimited field that a client of the published protos skips as unknown.
    assert reply.startswith(text(1, "w1"))
    extension = reply[len(text(1, "w1")):]
    tag = leb128(100 << 3 | 2)
    assert extension.startswith(tag)
    length, size_bytes = 0, 0
    for shift, byte in enumerate(extension[len(tag):]):
        length |= (byte & 0x7F) << (7 * shift)
        size_bytes += 1
        if not byte & 0x80:
            break
    assert len(extension) == len(tag) + size_bytes + length

    # GetPartitionStatusReply { status (1) { partition_id (1), ready_state (2): PS_ACTIVE = 2, operation_state (3): POS_IDLE = 1, ... } }
    status = call(pod, "GetPartitionStatus", text(1, "w1"))
    assert status.startswith(bytes([0x0A])) and text(1, "w1") + varint(2, 2) + varint(3, 1) in status

    # GetPartitionIpuofConfigRequest { partition_id (1), gcd_id (2) { id (1): 1 } }
    config = call(pod, "GetPartitionIpuofConfig", text(1, "w1") + nested(2, varint(1, 1)))
    second = pod.rack.machines[1]  # GCD 1 of an 8-IPU partition is the second machine
    assert text(1, second.ipuof_host) + varint(2, second.ipuof_port) in config  # IpuofDevice.ip (1), server_port (2)
    assert varint(2, pod.rack.machines[0].ipuof_port) not in config

    assert call(pod, "RemovePartition", text(1, "w1")) == b""
    assert pod.held_anywhere("w1") == []


def test_the_published_version_service_answers(registered_pod):
    channel = grpc.insecure_channel(f"127.0.0.1:{registered_pod.user_port}")
    reply = channel.unary_unary("/virmgrpc.VersionService/GetVersion")(b"", timeout=10)
    channel.close()
    assert reply == text(1, "0.1.0")
