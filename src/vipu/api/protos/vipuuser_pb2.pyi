import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class IpuLinkRoutingType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IRT_UNDEFINED: _ClassVar[IpuLinkRoutingType]
    IRT_DNC: _ClassVar[IpuLinkRoutingType]
    IRT_SWNC: _ClassVar[IpuLinkRoutingType]
    IRT_BTNC: _ClassVar[IpuLinkRoutingType]
    IRT_RINGSWNC: _ClassVar[IpuLinkRoutingType]

class GatewayRoutingType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GRT_UNDEFINED: _ClassVar[GatewayRoutingType]
    GRT_RING: _ClassVar[GatewayRoutingType]
    GRT_SWRING: _ClassVar[GatewayRoutingType]

class SyncType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ST_UNDEFINED: _ClassVar[SyncType]
    ST_GS2_DEFAULT: _ClassVar[SyncType]
    ST_GS2_INDEPENDENT_RAILS: _ClassVar[SyncType]
    ST_POD_NATIVE_DEFAULT: _ClassVar[SyncType]
    ST_POD_NATIVE_REPLICATED_PIPELINE: _ClassVar[SyncType]

class PartitionReadyState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PS_UNDEFINED: _ClassVar[PartitionReadyState]
    PS_PENDING: _ClassVar[PartitionReadyState]
    PS_ACTIVE: _ClassVar[PartitionReadyState]
    PS_REMOVED: _ClassVar[PartitionReadyState]
    PS_ERROR: _ClassVar[PartitionReadyState]

class PartitionOperationState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POS_UNDEFINED: _ClassVar[PartitionOperationState]
    POS_IDLE: _ClassVar[PartitionOperationState]
    POS_CREATING: _ClassVar[PartitionOperationState]
    POS_REMOVING: _ClassVar[PartitionOperationState]
    POS_RESETTING: _ClassVar[PartitionOperationState]
    POS_FAILED: _ClassVar[PartitionOperationState]
IRT_UNDEFINED: IpuLinkRoutingType
IRT_DNC: IpuLinkRoutingType
IRT_SWNC: IpuLinkRoutingType
IRT_BTNC: IpuLinkRoutingType
IRT_RINGSWNC: IpuLinkRoutingType
GRT_UNDEFINED: GatewayRoutingType
GRT_RING: GatewayRoutingType
GRT_SWRING: GatewayRoutingType
ST_UNDEFINED: SyncType
ST_GS2_DEFAULT: SyncType
ST_GS2_INDEPENDENT_RAILS: SyncType
ST_POD_NATIVE_DEFAULT: SyncType
ST_POD_NATIVE_REPLICATED_PIPELINE: SyncType
PS_UNDEFINED: PartitionReadyState
PS_PENDING: PartitionReadyState
PS_ACTIVE: PartitionReadyState
PS_REMOVED: PartitionReadyState
PS_ERROR: PartitionReadyState
POS_UNDEFINED: PartitionOperationState
POS_IDLE: PartitionOperationState
POS_CREATING: PartitionOperationState
POS_REMOVING: PartitionOperationState
POS_RESETTING: PartitionOperationState
POS_FAILED: PartitionOperationState

class PartitionIpu(_message.Message):
    __slots__ = ("ipulink_domain_topology_id", "ipulink_domain_routing_id", "topology_id", "routing_id", "agent_id", "agent_ipu_index")
    IPULINK_DOMAIN_TOPOLOGY_ID_FIELD_NUMBER: _ClassVar[int]
    IPULINK_DOMAIN_ROUTING_ID_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTING_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_IPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    ipulink_domain_topology_id: int
    ipulink_domain_routing_id: int
    topology_id: int
    routing_id: int
    agent_id: str
    agent_ipu_index: int
    def __init__(self, ipulink_domain_topology_id: _Optional[int] = ..., ipulink_domain_routing_id: _Optional[int] = ..., topology_id: _Optional[int] = ..., routing_id: _Optional[int] = ..., agent_id: _Optional[str] = ..., agent_ipu_index: _Optional[int] = ...) -> None: ...

class PartitionSpec(_message.Message):
    __slots__ = ("cluster_id", "ipus", "ipulink_routing_type", "sync_type", "num_gcds", "num_ipulink_segments", "reconfigurable", "gw_routing_type", "num_replicas", "allocation_id")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    IPUS_FIELD_NUMBER: _ClassVar[int]
    IPULINK_ROUTING_TYPE_FIELD_NUMBER: _ClassVar[int]
    SYNC_TYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_GCDS_FIELD_NUMBER: _ClassVar[int]
    NUM_IPULINK_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    RECONFIGURABLE_FIELD_NUMBER: _ClassVar[int]
    GW_ROUTING_TYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    ipus: _containers.RepeatedCompositeFieldContainer[PartitionIpu]
    ipulink_routing_type: IpuLinkRoutingType
    sync_type: SyncType
    num_gcds: int
    num_ipulink_segments: int
    reconfigurable: bool
    gw_routing_type: GatewayRoutingType
    num_replicas: int
    allocation_id: str
    def __init__(self, cluster_id: _Optional[str] = ..., ipus: _Optional[_Iterable[_Union[PartitionIpu, _Mapping]]] = ..., ipulink_routing_type: _Optional[_Union[IpuLinkRoutingType, str]] = ..., sync_type: _Optional[_Union[SyncType, str]] = ..., num_gcds: _Optional[int] = ..., num_ipulink_segments: _Optional[int] = ..., reconfigurable: _Optional[bool] = ..., gw_routing_type: _Optional[_Union[GatewayRoutingType, str]] = ..., num_replicas: _Optional[int] = ..., allocation_id: _Optional[str] = ...) -> None: ...

class Partition(_message.Message):
    __slots__ = ("id", "spec", "ready_state", "ipuof_server_version", "status", "owner", "created")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    READY_STATE_FIELD_NUMBER: _ClassVar[int]
    IPUOF_SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    id: str
    spec: PartitionSpec
    ready_state: PartitionReadyState
    ipuof_server_version: str
    status: PartitionStatus
    owner: str
    created: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., spec: _Optional[_Union[PartitionSpec, _Mapping]] = ..., ready_state: _Optional[_Union[PartitionReadyState, str]] = ..., ipuof_server_version: _Optional[str] = ..., status: _Optional[_Union[PartitionStatus, _Mapping]] = ..., owner: _Optional[str] = ..., created: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListPartitionsRequest(_message.Message):
    __slots__ = ("allocation_id",)
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    allocation_id: str
    def __init__(self, allocation_id: _Optional[str] = ...) -> None: ...

class ListPartitionsReply(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[Partition]
    def __init__(self, partitions: _Optional[_Iterable[_Union[Partition, _Mapping]]] = ...) -> None: ...

class PartitionRequirements(_message.Message):
    __slots__ = ("id", "size", "cluster_id", "ipulink_routing_type", "num_ipulink_segments", "gw_routing_type", "sync_type", "num_gcds", "reconfigurable", "num_replicas", "allocation_id", "ipus", "index")
    ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    IPULINK_ROUTING_TYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_IPULINK_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    GW_ROUTING_TYPE_FIELD_NUMBER: _ClassVar[int]
    SYNC_TYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_GCDS_FIELD_NUMBER: _ClassVar[int]
    RECONFIGURABLE_FIELD_NUMBER: _ClassVar[int]
    NUM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    IPUS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    id: str
    size: int
    cluster_id: str
    ipulink_routing_type: IpuLinkRoutingType
    num_ipulink_segments: int
    gw_routing_type: GatewayRoutingType
    sync_type: SyncType
    num_gcds: int
    reconfigurable: bool
    num_replicas: int
    allocation_id: str
    ipus: _containers.RepeatedCompositeFieldContainer[PartitionIpu]
    index: int
    def __init__(self, id: _Optional[str] = ..., size: _Optional[int] = ..., cluster_id: _Optional[str] = ..., ipulink_routing_type: _Optional[_Union[IpuLinkRoutingType, str]] = ..., num_ipulink_segments: _Optional[int] = ..., gw_routing_type: _Optional[_Union[GatewayRoutingType, str]] = ..., sync_type: _Optional[_Union[SyncType, str]] = ..., num_gcds: _Optional[int] = ..., reconfigurable: _Optional[bool] = ..., num_replicas: _Optional[int] = ..., allocation_id: _Optional[str] = ..., ipus: _Optional[_Iterable[_Union[PartitionIpu, _Mapping]]] = ..., index: _Optional[int] = ...) -> None: ...

class CreatePartitionRequest(_message.Message):
    __slots__ = ("requirements", "disable_auto_reset", "relocatable", "keep_on_error", "wait_seconds", "detached", "may_move", "expected_seconds", "reservation", "account", "preemptible", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUIREMENTS_FIELD_NUMBER: _ClassVar[int]
    DISABLE_AUTO_RESET_FIELD_NUMBER: _ClassVar[int]
    RELOCATABLE_FIELD_NUMBER: _ClassVar[int]
    KEEP_ON_ERROR_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DETACHED_FIELD_NUMBER: _ClassVar[int]
    MAY_MOVE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_FIELD_NUMBER: _ClassVar[int]
    ACCOUNT_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIBLE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    requirements: PartitionRequirements
    disable_auto_reset: bool
    relocatable: bool
    keep_on_error: bool
    wait_seconds: int
    detached: bool
    may_move: bool
    expected_seconds: int
    reservation: str
    account: str
    preemptible: bool
    labels: _containers.ScalarMap[str, str]
    def __init__(self, requirements: _Optional[_Union[PartitionRequirements, _Mapping]] = ..., disable_auto_reset: _Optional[bool] = ..., relocatable: _Optional[bool] = ..., keep_on_error: _Optional[bool] = ..., wait_seconds: _Optional[int] = ..., detached: _Optional[bool] = ..., may_move: _Optional[bool] = ..., expected_seconds: _Optional[int] = ..., reservation: _Optional[str] = ..., account: _Optional[str] = ..., preemptible: _Optional[bool] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class IpuofDevice(_message.Message):
    __slots__ = ("ip", "server_port", "rdma_port", "device_id", "ipulink_segment_id", "routing_id", "ipu_arch_id", "ipu_id", "chip_id", "gwsw_version", "ipum_sw_version")
    IP_FIELD_NUMBER: _ClassVar[int]
    SERVER_PORT_FIELD_NUMBER: _ClassVar[int]
    RDMA_PORT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    IPULINK_SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTING_ID_FIELD_NUMBER: _ClassVar[int]
    IPU_ARCH_ID_FIELD_NUMBER: _ClassVar[int]
    IPU_ID_FIELD_NUMBER: _ClassVar[int]
    CHIP_ID_FIELD_NUMBER: _ClassVar[int]
    GWSW_VERSION_FIELD_NUMBER: _ClassVar[int]
    IPUM_SW_VERSION_FIELD_NUMBER: _ClassVar[int]
    ip: str
    server_port: int
    rdma_port: int
    device_id: int
    ipulink_segment_id: int
    routing_id: int
    ipu_arch_id: int
    ipu_id: int
    chip_id: str
    gwsw_version: str
    ipum_sw_version: str
    def __init__(self, ip: _Optional[str] = ..., server_port: _Optional[int] = ..., rdma_port: _Optional[int] = ..., device_id: _Optional[int] = ..., ipulink_segment_id: _Optional[int] = ..., routing_id: _Optional[int] = ..., ipu_arch_id: _Optional[int] = ..., ipu_id: _Optional[int] = ..., chip_id: _Optional[str] = ..., gwsw_version: _Optional[str] = ..., ipum_sw_version: _Optional[str] = ...) -> None: ...

class PartitionConfig(_message.Message):
    __slots__ = ("ipulink_routing_type", "sync_type", "reconfigurable", "gw_routing_type", "num_ipulink_segments", "gcd_configs", "ipuof_server_version")
    class Gcd(_message.Message):
        __slots__ = ("devices", "attributes")
        class AttributesEntry(_message.Message):
            __slots__ = ("key", "value")
            KEY_FIELD_NUMBER: _ClassVar[int]
            VALUE_FIELD_NUMBER: _ClassVar[int]
            key: str
            value: str
            def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
        DEVICES_FIELD_NUMBER: _ClassVar[int]
        ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
        devices: _containers.RepeatedCompositeFieldContainer[IpuofDevice]
        attributes: _containers.ScalarMap[str, str]
        def __init__(self, devices: _Optional[_Iterable[_Union[IpuofDevice, _Mapping]]] = ..., attributes: _Optional[_Mapping[str, str]] = ...) -> None: ...
    IPULINK_ROUTING_TYPE_FIELD_NUMBER: _ClassVar[int]
    SYNC_TYPE_FIELD_NUMBER: _ClassVar[int]
    RECONFIGURABLE_FIELD_NUMBER: _ClassVar[int]
    GW_ROUTING_TYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_IPULINK_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    GCD_CONFIGS_FIELD_NUMBER: _ClassVar[int]
    IPUOF_SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    ipulink_routing_type: IpuLinkRoutingType
    sync_type: SyncType
    reconfigurable: bool
    gw_routing_type: GatewayRoutingType
    num_ipulink_segments: int
    gcd_configs: _containers.RepeatedCompositeFieldContainer[PartitionConfig.Gcd]
    ipuof_server_version: str
    def __init__(self, ipulink_routing_type: _Optional[_Union[IpuLinkRoutingType, str]] = ..., sync_type: _Optional[_Union[SyncType, str]] = ..., reconfigurable: _Optional[bool] = ..., gw_routing_type: _Optional[_Union[GatewayRoutingType, str]] = ..., num_ipulink_segments: _Optional[int] = ..., gcd_configs: _Optional[_Iterable[_Union[PartitionConfig.Gcd, _Mapping]]] = ..., ipuof_server_version: _Optional[str] = ...) -> None: ...

class CreatePartitionReply(_message.Message):
    __slots__ = ("partition_id", "ipuof_config", "queued")
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    IPUOF_CONFIG_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    partition_id: str
    ipuof_config: PartitionConfig
    queued: QueuedRequest
    def __init__(self, partition_id: _Optional[str] = ..., ipuof_config: _Optional[_Union[PartitionConfig, _Mapping]] = ..., queued: _Optional[_Union[QueuedRequest, _Mapping]] = ...) -> None: ...

class ResetPartitionRequest(_message.Message):
    __slots__ = ("partition_id", "relocatable", "relocate")
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    RELOCATABLE_FIELD_NUMBER: _ClassVar[int]
    RELOCATE_FIELD_NUMBER: _ClassVar[int]
    partition_id: str
    relocatable: bool
    relocate: bool
    def __init__(self, partition_id: _Optional[str] = ..., relocatable: _Optional[bool] = ..., relocate: _Optional[bool] = ...) -> None: ...

class ResetPartitionReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RemovePartitionRequest(_message.Message):
    __slots__ = ("partition_id", "force")
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    partition_id: str
    force: bool
    def __init__(self, partition_id: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class RemovePartitionReply(_message.Message):
    __slots__ = ("uncleared_agents",)
    UNCLEARED_AGENTS_FIELD_NUMBER: _ClassVar[int]
    uncleared_agents: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, uncleared_agents: _Optional[_Iterable[str]] = ...) -> None: ...

class GetPartitionIpuofConfigRequest(_message.Message):
    __slots__ = ("partition_id", "gcd_id")
    class GcdID(_message.Message):
        __slots__ = ("id",)
        ID_FIELD_NUMBER: _ClassVar[int]
        id: int
        def __init__(self, id: _Optional[int] = ...) -> None: ...
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    GCD_ID_FIELD_NUMBER: _ClassVar[int]
    partition_id: str
    gcd_id: GetPartitionIpuofConfigRequest.GcdID
    def __init__(self, partition_id: _Optional[str] = ..., gcd_id: _Optional[_Union[GetPartitionIpuofConfigRequest.GcdID, _Mapping]] = ...) -> None: ...

class GetPartitionIpuofConfigReply(_message.Message):
    __slots__ = ("ipuof_config",)
    IPUOF_CONFIG_FIELD_NUMBER: _ClassVar[int]
    ipuof_config: PartitionConfig
    def __init__(self, ipuof_config: _Optional[_Union[PartitionConfig, _Mapping]] = ...) -> None: ...

class PartitionStatus(_message.Message):
    __slots__ = ("partition_id", "ready_state", "operation_state", "errors", "max_auto_reset_retries", "auto_reset_retry_count", "last_auto_reset_time", "relocatable", "relocation", "placement_note", "link_warnings", "may_move", "expected_seconds", "last_power_cycle_time", "drain_notices", "reservation", "account", "preemptible", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    READY_STATE_FIELD_NUMBER: _ClassVar[int]
    OPERATION_STATE_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    MAX_AUTO_RESET_RETRIES_FIELD_NUMBER: _ClassVar[int]
    AUTO_RESET_RETRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    LAST_AUTO_RESET_TIME_FIELD_NUMBER: _ClassVar[int]
    RELOCATABLE_FIELD_NUMBER: _ClassVar[int]
    RELOCATION_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_NOTE_FIELD_NUMBER: _ClassVar[int]
    LINK_WARNINGS_FIELD_NUMBER: _ClassVar[int]
    MAY_MOVE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LAST_POWER_CYCLE_TIME_FIELD_NUMBER: _ClassVar[int]
    DRAIN_NOTICES_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_FIELD_NUMBER: _ClassVar[int]
    ACCOUNT_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIBLE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    partition_id: str
    ready_state: PartitionReadyState
    operation_state: PartitionOperationState
    errors: _containers.RepeatedScalarFieldContainer[str]
    max_auto_reset_retries: int
    auto_reset_retry_count: int
    last_auto_reset_time: _timestamp_pb2.Timestamp
    relocatable: bool
    relocation: str
    placement_note: str
    link_warnings: _containers.RepeatedScalarFieldContainer[str]
    may_move: bool
    expected_seconds: int
    last_power_cycle_time: _timestamp_pb2.Timestamp
    drain_notices: _containers.RepeatedScalarFieldContainer[str]
    reservation: str
    account: str
    preemptible: bool
    labels: _containers.ScalarMap[str, str]
    def __init__(self, partition_id: _Optional[str] = ..., ready_state: _Optional[_Union[PartitionReadyState, str]] = ..., operation_state: _Optional[_Union[PartitionOperationState, str]] = ..., errors: _Optional[_Iterable[str]] = ..., max_auto_reset_retries: _Optional[int] = ..., auto_reset_retry_count: _Optional[int] = ..., last_auto_reset_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., relocatable: _Optional[bool] = ..., relocation: _Optional[str] = ..., placement_note: _Optional[str] = ..., link_warnings: _Optional[_Iterable[str]] = ..., may_move: _Optional[bool] = ..., expected_seconds: _Optional[int] = ..., last_power_cycle_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., drain_notices: _Optional[_Iterable[str]] = ..., reservation: _Optional[str] = ..., account: _Optional[str] = ..., preemptible: _Optional[bool] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class GetPartitionStatusRequest(_message.Message):
    __slots__ = ("partition_id",)
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    partition_id: str
    def __init__(self, partition_id: _Optional[str] = ...) -> None: ...

class GetPartitionStatusReply(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: PartitionStatus
    def __init__(self, status: _Optional[_Union[PartitionStatus, _Mapping]] = ...) -> None: ...

class AllocationSpec(_message.Message):
    __slots__ = ("cluster_id", "agent_ids", "agent_ilds")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    AGENT_ILDS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    agent_ids: _containers.RepeatedScalarFieldContainer[str]
    agent_ilds: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, cluster_id: _Optional[str] = ..., agent_ids: _Optional[_Iterable[str]] = ..., agent_ilds: _Optional[_Iterable[int]] = ...) -> None: ...

class Allocation(_message.Message):
    __slots__ = ("id", "spec")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    id: str
    spec: AllocationSpec
    def __init__(self, id: _Optional[str] = ..., spec: _Optional[_Union[AllocationSpec, _Mapping]] = ...) -> None: ...

class ListIPUAttributesRequest(_message.Message):
    __slots__ = ("agents",)
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    agents: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, agents: _Optional[_Iterable[str]] = ...) -> None: ...

class ListIPUAttributesReply(_message.Message):
    __slots__ = ("entries",)
    class Entry(_message.Message):
        __slots__ = ("agent", "ipu_attributes")
        class Attributes(_message.Message):
            __slots__ = ("attributes",)
            class AttributesEntry(_message.Message):
                __slots__ = ("key", "value")
                KEY_FIELD_NUMBER: _ClassVar[int]
                VALUE_FIELD_NUMBER: _ClassVar[int]
                key: str
                value: str
                def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
            ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
            attributes: _containers.ScalarMap[str, str]
            def __init__(self, attributes: _Optional[_Mapping[str, str]] = ...) -> None: ...
        class IpuAttributesEntry(_message.Message):
            __slots__ = ("key", "value")
            KEY_FIELD_NUMBER: _ClassVar[int]
            VALUE_FIELD_NUMBER: _ClassVar[int]
            key: int
            value: ListIPUAttributesReply.Entry.Attributes
            def __init__(self, key: _Optional[int] = ..., value: _Optional[_Union[ListIPUAttributesReply.Entry.Attributes, _Mapping]] = ...) -> None: ...
        AGENT_FIELD_NUMBER: _ClassVar[int]
        IPU_ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
        agent: str
        ipu_attributes: _containers.MessageMap[int, ListIPUAttributesReply.Entry.Attributes]
        def __init__(self, agent: _Optional[str] = ..., ipu_attributes: _Optional[_Mapping[int, ListIPUAttributesReply.Entry.Attributes]] = ...) -> None: ...
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[ListIPUAttributesReply.Entry]
    def __init__(self, entries: _Optional[_Iterable[_Union[ListIPUAttributesReply.Entry, _Mapping]]] = ...) -> None: ...

class ListAllocationsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListAllocationsReply(_message.Message):
    __slots__ = ("allocations",)
    ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    allocations: _containers.RepeatedCompositeFieldContainer[Allocation]
    def __init__(self, allocations: _Optional[_Iterable[_Union[Allocation, _Mapping]]] = ...) -> None: ...

class GetCapacityRequest(_message.Message):
    __slots__ = ("size", "allocation_id", "cluster_id")
    SIZE_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    size: int
    allocation_id: str
    cluster_id: str
    def __init__(self, size: _Optional[int] = ..., allocation_id: _Optional[str] = ..., cluster_id: _Optional[str] = ...) -> None: ...

class AllocationCapacity(_message.Message):
    __slots__ = ("allocation_id", "cluster_id", "total_ipus", "used_ipus", "free_ipus", "fitting", "largest", "blocked", "down_ipus", "held_ipus", "held_for", "draining_ipus", "reserved_ipus")
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    TOTAL_IPUS_FIELD_NUMBER: _ClassVar[int]
    USED_IPUS_FIELD_NUMBER: _ClassVar[int]
    FREE_IPUS_FIELD_NUMBER: _ClassVar[int]
    FITTING_FIELD_NUMBER: _ClassVar[int]
    LARGEST_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_FIELD_NUMBER: _ClassVar[int]
    DOWN_IPUS_FIELD_NUMBER: _ClassVar[int]
    HELD_IPUS_FIELD_NUMBER: _ClassVar[int]
    HELD_FOR_FIELD_NUMBER: _ClassVar[int]
    DRAINING_IPUS_FIELD_NUMBER: _ClassVar[int]
    RESERVED_IPUS_FIELD_NUMBER: _ClassVar[int]
    allocation_id: str
    cluster_id: str
    total_ipus: int
    used_ipus: int
    free_ipus: int
    fitting: int
    largest: int
    blocked: str
    down_ipus: int
    held_ipus: int
    held_for: str
    draining_ipus: int
    reserved_ipus: int
    def __init__(self, allocation_id: _Optional[str] = ..., cluster_id: _Optional[str] = ..., total_ipus: _Optional[int] = ..., used_ipus: _Optional[int] = ..., free_ipus: _Optional[int] = ..., fitting: _Optional[int] = ..., largest: _Optional[int] = ..., blocked: _Optional[str] = ..., down_ipus: _Optional[int] = ..., held_ipus: _Optional[int] = ..., held_for: _Optional[str] = ..., draining_ipus: _Optional[int] = ..., reserved_ipus: _Optional[int] = ...) -> None: ...

class GetCapacityReply(_message.Message):
    __slots__ = ("allocations", "fitting", "largest")
    ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    FITTING_FIELD_NUMBER: _ClassVar[int]
    LARGEST_FIELD_NUMBER: _ClassVar[int]
    allocations: _containers.RepeatedCompositeFieldContainer[AllocationCapacity]
    fitting: int
    largest: int
    def __init__(self, allocations: _Optional[_Iterable[_Union[AllocationCapacity, _Mapping]]] = ..., fitting: _Optional[int] = ..., largest: _Optional[int] = ...) -> None: ...

class WatchChangesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Change(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topics: _Optional[_Iterable[str]] = ...) -> None: ...

class QueuedRequest(_message.Message):
    __slots__ = ("partition_id", "allocation_id", "size", "user", "position", "since", "deadline", "reason")
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    partition_id: str
    allocation_id: str
    size: int
    user: str
    position: int
    since: _timestamp_pb2.Timestamp
    deadline: _timestamp_pb2.Timestamp
    reason: str
    def __init__(self, partition_id: _Optional[str] = ..., allocation_id: _Optional[str] = ..., size: _Optional[int] = ..., user: _Optional[str] = ..., position: _Optional[int] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class WaitPartitionRequest(_message.Message):
    __slots__ = ("partition_id", "seconds")
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    partition_id: str
    seconds: int
    def __init__(self, partition_id: _Optional[str] = ..., seconds: _Optional[int] = ...) -> None: ...

class WaitPartitionReply(_message.Message):
    __slots__ = ("status", "ipuof_config", "queued", "busy")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    IPUOF_CONFIG_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    status: PartitionStatus
    ipuof_config: PartitionConfig
    queued: QueuedRequest
    busy: bool
    def __init__(self, status: _Optional[_Union[PartitionStatus, _Mapping]] = ..., ipuof_config: _Optional[_Union[PartitionConfig, _Mapping]] = ..., queued: _Optional[_Union[QueuedRequest, _Mapping]] = ..., busy: _Optional[bool] = ...) -> None: ...

class Reservation(_message.Message):
    __slots__ = ("name", "allocation_id", "ipus", "start", "end", "reason", "maintenance", "users", "by", "created", "ipus_in_use", "description", "accounts")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    IPUS_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MAINTENANCE_FIELD_NUMBER: _ClassVar[int]
    USERS_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    IPUS_IN_USE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    allocation_id: str
    ipus: _containers.RepeatedCompositeFieldContainer[ReservedIpu]
    start: float
    end: float
    reason: str
    maintenance: bool
    users: _containers.RepeatedScalarFieldContainer[str]
    by: str
    created: float
    ipus_in_use: int
    description: str
    accounts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., allocation_id: _Optional[str] = ..., ipus: _Optional[_Iterable[_Union[ReservedIpu, _Mapping]]] = ..., start: _Optional[float] = ..., end: _Optional[float] = ..., reason: _Optional[str] = ..., maintenance: _Optional[bool] = ..., users: _Optional[_Iterable[str]] = ..., by: _Optional[str] = ..., created: _Optional[float] = ..., ipus_in_use: _Optional[int] = ..., description: _Optional[str] = ..., accounts: _Optional[_Iterable[str]] = ...) -> None: ...

class ReservedIpu(_message.Message):
    __slots__ = ("agent_id", "index")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    index: int
    def __init__(self, agent_id: _Optional[str] = ..., index: _Optional[int] = ...) -> None: ...

class ListReservationsRequest(_message.Message):
    __slots__ = ("allocation_id",)
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    allocation_id: str
    def __init__(self, allocation_id: _Optional[str] = ...) -> None: ...

class ListReservationsReply(_message.Message):
    __slots__ = ("reservations",)
    RESERVATIONS_FIELD_NUMBER: _ClassVar[int]
    reservations: _containers.RepeatedCompositeFieldContainer[Reservation]
    def __init__(self, reservations: _Optional[_Iterable[_Union[Reservation, _Mapping]]] = ...) -> None: ...

class ListQueuedRequest(_message.Message):
    __slots__ = ("allocation_id",)
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    allocation_id: str
    def __init__(self, allocation_id: _Optional[str] = ...) -> None: ...

class ListQueuedReply(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[QueuedRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[QueuedRequest, _Mapping]]] = ...) -> None: ...

class CancelQueuedRequest(_message.Message):
    __slots__ = ("partition_id",)
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    partition_id: str
    def __init__(self, partition_id: _Optional[str] = ...) -> None: ...

class CancelQueuedReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UpdatePartitionRequest(_message.Message):
    __slots__ = ("partition_id", "may_move")
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    MAY_MOVE_FIELD_NUMBER: _ClassVar[int]
    partition_id: str
    may_move: bool
    def __init__(self, partition_id: _Optional[str] = ..., may_move: _Optional[bool] = ...) -> None: ...

class UpdatePartitionReply(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: PartitionStatus
    def __init__(self, status: _Optional[_Union[PartitionStatus, _Mapping]] = ...) -> None: ...

class GetPartitionTelemetryRequest(_message.Message):
    __slots__ = ("partition_id",)
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    partition_id: str
    def __init__(self, partition_id: _Optional[str] = ...) -> None: ...

class PartitionIpuTelemetry(_message.Message):
    __slots__ = ("agent_id", "index", "routing_id", "utilisation", "temperature", "power", "clock_mhz", "memory_used", "ecc_errors", "age_seconds")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ROUTING_ID_FIELD_NUMBER: _ClassVar[int]
    UTILISATION_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    POWER_FIELD_NUMBER: _ClassVar[int]
    CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_FIELD_NUMBER: _ClassVar[int]
    ECC_ERRORS_FIELD_NUMBER: _ClassVar[int]
    AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    index: int
    routing_id: int
    utilisation: float
    temperature: float
    power: float
    clock_mhz: float
    memory_used: int
    ecc_errors: int
    age_seconds: float
    def __init__(self, agent_id: _Optional[str] = ..., index: _Optional[int] = ..., routing_id: _Optional[int] = ..., utilisation: _Optional[float] = ..., temperature: _Optional[float] = ..., power: _Optional[float] = ..., clock_mhz: _Optional[float] = ..., memory_used: _Optional[int] = ..., ecc_errors: _Optional[int] = ..., age_seconds: _Optional[float] = ...) -> None: ...

class UtilisationSample(_message.Message):
    __slots__ = ("at", "utilisation")
    AT_FIELD_NUMBER: _ClassVar[int]
    UTILISATION_FIELD_NUMBER: _ClassVar[int]
    at: float
    utilisation: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, at: _Optional[float] = ..., utilisation: _Optional[_Iterable[float]] = ...) -> None: ...

class GetPartitionTelemetryReply(_message.Message):
    __slots__ = ("ipus", "history")
    IPUS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    ipus: _containers.RepeatedCompositeFieldContainer[PartitionIpuTelemetry]
    history: _containers.RepeatedCompositeFieldContainer[UtilisationSample]
    def __init__(self, ipus: _Optional[_Iterable[_Union[PartitionIpuTelemetry, _Mapping]]] = ..., history: _Optional[_Iterable[_Union[UtilisationSample, _Mapping]]] = ...) -> None: ...
