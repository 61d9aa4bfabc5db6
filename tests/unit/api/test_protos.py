"""The generated stubs match the protos, and the user API is wire-compatible with virmgrpc.

The table below records the published virmgrpc user API (graphcore/vipu-protos): every message's
fields with their numbers and types, every enum value and every method. Our protos may add to
it, never change it: a renumbered, retyped or removed field fails here.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor as F

from vipu.api import codegen
from vipu.api.protos import version_pb2, vipuuser_pb2

T = {
    "string": F.TYPE_STRING, "uint32": F.TYPE_UINT32, "bool": F.TYPE_BOOL,
}

# message -> [(field, number, type, repeated)], type a scalar name or a message/enum full name
PUBLISHED_MESSAGES = {
    "PartitionIpu": [("ipulink_domain_topology_id", 1, "uint32", False), ("ipulink_domain_routing_id", 2, "uint32", False),
                     ("topology_id", 3, "uint32", False), ("routing_id", 4, "uint32", False)],
    "PartitionSpec": [("cluster_id", 1, "string", False), ("ipus", 2, "virmgrpc.PartitionIpu", True),
                      ("ipulink_routing_type", 3, "virmgrpc.IpuLinkRoutingType", False), ("sync_type", 4, "virmgrpc.SyncType", False),
                      ("num_gcds", 5, "uint32", False), ("num_ipulink_segments", 6, "uint32", False), ("reconfigurable", 7, "bool", False),
                      ("gw_routing_type", 8, "virmgrpc.GatewayRoutingType", False), ("num_replicas", 9, "uint32", False),
                      ("allocation_id", 10, "string", False)],
    "Partition": [("id", 1, "string", False), ("spec", 2, "virmgrpc.PartitionSpec", False),
                  ("ready_state", 3, "virmgrpc.PartitionReadyState", False), ("ipuof_server_version", 4, "string", False)],
    "ListPartitionsRequest": [("allocation_id", 1, "string", False)],
    "ListPartitionsReply": [("partitions", 1, "virmgrpc.Partition", True)],
    "PartitionRequirements": [("id", 1, "string", False), ("size", 2, "uint32", False), ("cluster_id", 3, "string", False),
                              ("ipulink_routing_type", 4, "virmgrpc.IpuLinkRoutingType", False),
                              ("num_ipulink_segments", 5, "uint32", False),
                              ("gw_routing_type", 6, "virmgrpc.GatewayRoutingType", False), ("sync_type", 7, "virmgrpc.SyncType", False),
                              ("num_gcds", 8, "uint32", False), ("reconfigurable", 9, "bool", False), ("num_replicas", 10, "uint32", False),
                              ("allocation_id", 11, "string", False), ("ipus", 12, "virmgrpc.PartitionIpu", True)],
    "CreatePartitionRequest": [("requirements", 2, "virmgrpc.PartitionRequirements", False), ("disable_auto_reset", 3, "bool", False),
                               ("relocatable", 5, "bool", False)],
    "IpuofDevice": [("ip", 1, "string", False), ("server_port", 2, "uint32", False), ("rdma_port", 3, "uint32", False),
                    ("device_id", 4, "uint32", False), ("ipulink_segment_id", 5, "uint32", False), ("routing_id", 6, "uint32", False),
                    ("ipu_arch_id", 7, "uint32", False), ("ipu_id", 8, "uint32", False), ("chip_id", 9, "string", False),
                    ("gwsw_version", 10, "string", False), ("ipum_sw_version", 11, "string", False)],
    "PartitionConfig.Gcd": [("devices", 2, "virmgrpc.IpuofDevice", True),
                            ("attributes", 3, "virmgrpc.PartitionConfig.Gcd.AttributesEntry", True)],
    "PartitionConfig": [("ipulink_routing_type", 2, "virmgrpc.IpuLinkRoutingType", False), ("sync_type", 3, "virmgrpc.SyncType", False),
                        ("reconfigurable", 5, "bool", False), ("gw_routing_type", 6, "virmgrpc.GatewayRoutingType", False),
                        ("num_ipulink_segments", 7, "uint32", False), ("gcd_configs", 8, "virmgrpc.PartitionConfig.Gcd", True),
                        ("ipuof_server_version", 9, "string", False)],
    "CreatePartitionReply": [("partition_id", 1, "string", False)],
    "ResetPartitionRequest": [("partition_id", 1, "string", False), ("relocatable", 2, "bool", False)],
    "ResetPartitionReply": [],
    "RemovePartitionRequest": [("partition_id", 1, "string", False), ("force", 2, "bool", False)],
    "RemovePartitionReply": [],
    "GetPartitionIpuofConfigRequest.GcdID": [("id", 1, "uint32", False)],
    "GetPartitionIpuofConfigRequest": [("partition_id", 1, "string", False),
                                       ("gcd_id", 2, "virmgrpc.GetPartitionIpuofConfigRequest.GcdID", False)],
    "GetPartitionIpuofConfigReply": [("ipuof_config", 1, "virmgrpc.PartitionConfig", False)],
    "PartitionStatus": [("partition_id", 1, "string", False), ("ready_state", 2, "virmgrpc.PartitionReadyState", False),
                        ("operation_state", 3, "virmgrpc.PartitionOperationState", False), ("errors", 4, "string", True),
                        ("max_auto_reset_retries", 5, "uint32", False), ("auto_reset_retry_count", 6, "uint32", False),
                        ("last_auto_reset_time", 7, "google.protobuf.Timestamp", False)],
    "GetPartitionStatusRequest": [("partition_id", 1, "string", False)],
    "GetPartitionStatusReply": [("status", 1, "virmgrpc.PartitionStatus", False)],
    "AllocationSpec": [("cluster_id", 1, "string", False), ("agent_ids", 2, "string", True)],
    "Allocation": [("id", 1, "string", False), ("spec", 2, "virmgrpc.AllocationSpec", False)],
    "ListIPUAttributesRequest": [("agents", 1, "string", True)],
    "ListIPUAttributesReply.Entry.Attributes": [
        ("attributes", 1, "virmgrpc.ListIPUAttributesReply.Entry.Attributes.AttributesEntry", True)],
    "ListIPUAttributesReply.Entry": [("agent", 1, "string", False),
                                     ("ipu_attributes", 2, "virmgrpc.ListIPUAttributesReply.Entry.IpuAttributesEntry", True)],
    "ListIPUAttributesReply": [("entries", 1, "virmgrpc.ListIPUAttributesReply.Entry", True)],
}

PUBLISHED_ENUMS = {
    "IpuLinkRoutingType": {"IRT_UNDEFINED": 0, "IRT_DNC": 1, "IRT_SWNC": 2, "IRT_BTNC": 3, "IRT_RINGSWNC": 4},
    "GatewayRoutingType": {"GRT_UNDEFINED": 0, "GRT_RING": 2, "GRT_SWRING": 3},
    "SyncType": {"ST_UNDEFINED": 0, "ST_GS2_DEFAULT": 1, "ST_GS2_INDEPENDENT_RAILS": 2, "ST_POD_NATIVE_DEFAULT": 3,
                 "ST_POD_NATIVE_REPLICATED_PIPELINE": 4},
    "PartitionReadyState": {"PS_UNDEFINED": 0, "PS_PENDING": 1, "PS_ACTIVE": 2, "PS_REMOVED": 3, "PS_ERROR": 4},
    "PartitionOperationState": {"POS_UNDEFINED": 0, "POS_IDLE": 1, "POS_CREATING": 2, "POS_REMOVING": 3,
                                "POS_RESETTING": 4, "POS_FAILED": 5},
}

PUBLISHED_METHODS = {
    "UserService": {
        "ListPartitions": ("ListPartitionsRequest", "ListPartitionsReply"),
        "ListIPUAttributes": ("ListIPUAttributesRequest", "ListIPUAttributesReply"),
        "CreatePartition": ("CreatePartitionRequest", "CreatePartitionReply"),
        "RemovePartition": ("RemovePartitionRequest", "RemovePartitionReply"),
        "ResetPartition": ("ResetPartitionRequest", "ResetPartitionReply"),
        "GetPartitionIpuofConfig": ("GetPartitionIpuofConfigRequest", "GetPartitionIpuofConfigReply"),
        "GetPartitionStatus": ("GetPartitionStatusRequest", "GetPartitionStatusReply"),
    },
}


def message_descriptor(path: str):
    parts = path.split(".")
    descriptor = vipuuser_pb2.DESCRIPTOR.message_types_by_name[parts[0]]
    for part in parts[1:]:
        descriptor = descriptor.nested_types_by_name[part]
    return descriptor


@pytest.mark.parametrize("message", sorted(PUBLISHED_MESSAGES))
def test_every_published_field_keeps_its_number_type_and_cardinality(message):
    descriptor = message_descriptor(message)
    assert descriptor.full_name == f"virmgrpc.{message}"
    for name, number, type_name, repeated in PUBLISHED_MESSAGES[message]:
        field = descriptor.fields_by_name.get(name)
        assert field is not None, f"{message}.{name} is missing"
        assert field.number == number, f"{message}.{name} is numbered {field.number}, published {number}"
        if type_name in T:
            assert field.type == T[type_name], f"{message}.{name} changed type"
        else:
            target = field.message_type or field.enum_type
            assert target is not None and target.full_name == type_name, f"{message}.{name} changed type"
        assert field.is_repeated == repeated, f"{message}.{name} changed cardinality"
    published_numbers = {number for _, number, _, _ in PUBLISHED_MESSAGES[message]}
    added = [f for f in descriptor.fields if f.number not in published_numbers]
    assert all(f.number > max(published_numbers, default=0) for f in added), "additions take new, higher numbers"


def test_map_fields_keep_their_key_and_value_types():
    gcd = message_descriptor("PartitionConfig.Gcd").fields_by_name["attributes"].message_type
    assert (gcd.fields_by_name["key"].type, gcd.fields_by_name["value"].type) == (F.TYPE_STRING, F.TYPE_STRING)
    entry = message_descriptor("ListIPUAttributesReply.Entry").fields_by_name["ipu_attributes"].message_type
    assert entry.fields_by_name["key"].type == F.TYPE_UINT32
    assert entry.fields_by_name["value"].message_type.full_name == "virmgrpc.ListIPUAttributesReply.Entry.Attributes"


@pytest.mark.parametrize("enum", sorted(PUBLISHED_ENUMS))
def test_every_published_enum_value_keeps_its_number(enum):
    descriptor = vipuuser_pb2.DESCRIPTOR.enum_types_by_name[enum]
    assert {v.name: v.number for v in descriptor.values} == PUBLISHED_ENUMS[enum]


def test_every_published_method_keeps_its_path_and_types():
    service = vipuuser_pb2.DESCRIPTOR.services_by_name["UserService"]
    assert service.full_name == "virmgrpc.UserService"
    for name, (request, reply) in PUBLISHED_METHODS["UserService"].items():
        method = service.methods_by_name[name]
        assert (method.input_type.full_name, method.output_type.full_name) == (f"virmgrpc.{request}", f"virmgrpc.{reply}")


def test_the_version_service_is_published_unchanged():
    service = version_pb2.DESCRIPTOR.services_by_name["VersionService"]
    assert service.full_name == "virmgrpc.VersionService"
    method = service.methods_by_name["GetVersion"]
    assert (method.input_type.full_name, method.output_type.full_name) == ("virmgrpc.VersionRequest", "virmgrpc.VersionReply")
    assert version_pb2.VersionReply.DESCRIPTOR.fields_by_name["version"].number == 1


def test_a_message_from_a_published_client_decodes_identically():
    """Bytes built by field number alone, as any client of the published API would send them."""
    # requirements (2) { id (1) = "p1", size (2) = 4, num_gcds (8) = 2, allocation_id (11) = "a" }, relocatable (5) = true
    inner = b"\x0a\x02p1" + b"\x10\x04" + b"\x40\x02" + b"\x5a\x01a"
    wire = b"\x12" + bytes([len(inner)]) + inner + b"\x28\x01"
    request = vipuuser_pb2.CreatePartitionRequest.FromString(wire)
    assert (request.requirements.id, request.requirements.size, request.requirements.num_gcds) == ("p1", 4, 2)
    assert (request.requirements.allocation_id, request.relocatable) == ("a", True)


def test_the_committed_stubs_are_what_the_protos_generate():
    with tempfile.TemporaryDirectory() as scratch:
        generated = codegen.generate(Path(scratch))
        assert {p.name for p in generated} == {p.name for p in codegen.PROTO_DIR.glob("*_pb2*.py*")}
        for path in generated:
            committed = codegen.PROTO_DIR / path.name
            assert codegen.comparable(committed.read_text()) == codegen.comparable(path.read_text()), (
                f"{committed.name} is stale: run scripts/gen-protos"
            )
