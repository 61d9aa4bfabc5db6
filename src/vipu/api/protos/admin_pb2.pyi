from vipu.api.protos import agent_pb2 as _agent_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class IldTopology(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ILD_TOPOLOGY_UNSPECIFIED: _ClassVar[IldTopology]
    ILD_TOPOLOGY_MESH: _ClassVar[IldTopology]
    ILD_TOPOLOGY_TORUS: _ClassVar[IldTopology]

class GwTopology(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GW_TOPOLOGY_UNSPECIFIED: _ClassVar[GwTopology]
    GW_TOPOLOGY_LOOPED: _ClassVar[GwTopology]
ILD_TOPOLOGY_UNSPECIFIED: IldTopology
ILD_TOPOLOGY_MESH: IldTopology
ILD_TOPOLOGY_TORUS: IldTopology
GW_TOPOLOGY_UNSPECIFIED: GwTopology
GW_TOPOLOGY_LOOPED: GwTopology

class AgentIpuUse(_message.Message):
    __slots__ = ("index", "partition_id", "partition_state", "routing_id", "gcd_id")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_STATE_FIELD_NUMBER: _ClassVar[int]
    ROUTING_ID_FIELD_NUMBER: _ClassVar[int]
    GCD_ID_FIELD_NUMBER: _ClassVar[int]
    index: int
    partition_id: str
    partition_state: str
    routing_id: int
    gcd_id: int
    def __init__(self, index: _Optional[int] = ..., partition_id: _Optional[str] = ..., partition_state: _Optional[str] = ..., routing_id: _Optional[int] = ..., gcd_id: _Optional[int] = ...) -> None: ...

class Agent(_message.Message):
    __slots__ = ("id", "host", "port", "status", "cluster_id", "allocation_id", "inventory", "ipus", "discovery_mode", "last_error")
    ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    INVENTORY_FIELD_NUMBER: _ClassVar[int]
    IPUS_FIELD_NUMBER: _ClassVar[int]
    DISCOVERY_MODE_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    id: str
    host: str
    port: int
    status: str
    cluster_id: str
    allocation_id: str
    inventory: _agent_pb2.Inventory
    ipus: _containers.RepeatedCompositeFieldContainer[AgentIpuUse]
    discovery_mode: str
    last_error: str
    def __init__(self, id: _Optional[str] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., status: _Optional[str] = ..., cluster_id: _Optional[str] = ..., allocation_id: _Optional[str] = ..., inventory: _Optional[_Union[_agent_pb2.Inventory, _Mapping]] = ..., ipus: _Optional[_Iterable[_Union[AgentIpuUse, _Mapping]]] = ..., discovery_mode: _Optional[str] = ..., last_error: _Optional[str] = ...) -> None: ...

class Cluster(_message.Message):
    __slots__ = ("id", "agent_ids", "topology", "num_ipulinkdomains", "cluster_topology", "allocation_ids")
    ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    NUM_IPULINKDOMAINS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_IDS_FIELD_NUMBER: _ClassVar[int]
    id: str
    agent_ids: _containers.RepeatedScalarFieldContainer[str]
    topology: IldTopology
    num_ipulinkdomains: int
    cluster_topology: GwTopology
    allocation_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., agent_ids: _Optional[_Iterable[str]] = ..., topology: _Optional[_Union[IldTopology, str]] = ..., num_ipulinkdomains: _Optional[int] = ..., cluster_topology: _Optional[_Union[GwTopology, str]] = ..., allocation_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class Allocation(_message.Message):
    __slots__ = ("id", "cluster_id", "agent_ids", "partition_ids")
    ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_IDS_FIELD_NUMBER: _ClassVar[int]
    id: str
    cluster_id: str
    agent_ids: _containers.RepeatedScalarFieldContainer[str]
    partition_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., cluster_id: _Optional[str] = ..., agent_ids: _Optional[_Iterable[str]] = ..., partition_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class CreateAgentRequest(_message.Message):
    __slots__ = ("id", "host", "port")
    ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    id: str
    host: str
    port: int
    def __init__(self, id: _Optional[str] = ..., host: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class CreateAgentReply(_message.Message):
    __slots__ = ("agent",)
    AGENT_FIELD_NUMBER: _ClassVar[int]
    agent: Agent
    def __init__(self, agent: _Optional[_Union[Agent, _Mapping]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class RemoveRequest(_message.Message):
    __slots__ = ("id", "force")
    ID_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    id: str
    force: bool
    def __init__(self, id: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class RemoveReply(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, removed: _Optional[_Iterable[str]] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListAgentsReply(_message.Message):
    __slots__ = ("agents",)
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    agents: _containers.RepeatedCompositeFieldContainer[Agent]
    def __init__(self, agents: _Optional[_Iterable[_Union[Agent, _Mapping]]] = ...) -> None: ...

class CreateClusterRequest(_message.Message):
    __slots__ = ("id", "agent_ids", "topology", "num_ipulinkdomains", "cluster_topology")
    ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    NUM_IPULINKDOMAINS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    id: str
    agent_ids: _containers.RepeatedScalarFieldContainer[str]
    topology: IldTopology
    num_ipulinkdomains: int
    cluster_topology: GwTopology
    def __init__(self, id: _Optional[str] = ..., agent_ids: _Optional[_Iterable[str]] = ..., topology: _Optional[_Union[IldTopology, str]] = ..., num_ipulinkdomains: _Optional[int] = ..., cluster_topology: _Optional[_Union[GwTopology, str]] = ...) -> None: ...

class ListClustersReply(_message.Message):
    __slots__ = ("clusters",)
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    clusters: _containers.RepeatedCompositeFieldContainer[Cluster]
    def __init__(self, clusters: _Optional[_Iterable[_Union[Cluster, _Mapping]]] = ...) -> None: ...

class CreateAllocationRequest(_message.Message):
    __slots__ = ("id", "cluster_id", "agent_ids", "size")
    ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    id: str
    cluster_id: str
    agent_ids: _containers.RepeatedScalarFieldContainer[str]
    size: int
    def __init__(self, id: _Optional[str] = ..., cluster_id: _Optional[str] = ..., agent_ids: _Optional[_Iterable[str]] = ..., size: _Optional[int] = ...) -> None: ...

class ListAllocationsReply(_message.Message):
    __slots__ = ("allocations",)
    ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    allocations: _containers.RepeatedCompositeFieldContainer[Allocation]
    def __init__(self, allocations: _Optional[_Iterable[_Union[Allocation, _Mapping]]] = ...) -> None: ...
