from vipu.api.protos import agent_pb2 as _agent_pb2
from vipu.api.protos import vipuuser_pb2 as _vipuuser_pb2
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
    __slots__ = ("id", "host", "port", "status", "cluster_id", "allocation_id", "inventory", "ipus", "discovery_mode", "last_error", "condition", "drain")
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
    CONDITION_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
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
    condition: _agent_pb2.Condition
    drain: AgentDrain
    def __init__(self, id: _Optional[str] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., status: _Optional[str] = ..., cluster_id: _Optional[str] = ..., allocation_id: _Optional[str] = ..., inventory: _Optional[_Union[_agent_pb2.Inventory, _Mapping]] = ..., ipus: _Optional[_Iterable[_Union[AgentIpuUse, _Mapping]]] = ..., discovery_mode: _Optional[str] = ..., last_error: _Optional[str] = ..., condition: _Optional[_Union[_agent_pb2.Condition, _Mapping]] = ..., drain: _Optional[_Union[AgentDrain, _Mapping]] = ...) -> None: ...

class AgentDrain(_message.Message):
    __slots__ = ("reason", "by", "since", "partition_ids", "deadline")
    REASON_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_IDS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    reason: str
    by: str
    since: float
    partition_ids: _containers.RepeatedScalarFieldContainer[str]
    deadline: float
    def __init__(self, reason: _Optional[str] = ..., by: _Optional[str] = ..., since: _Optional[float] = ..., partition_ids: _Optional[_Iterable[str]] = ..., deadline: _Optional[float] = ...) -> None: ...

class DrainAgentsRequest(_message.Message):
    __slots__ = ("agent_ids", "reason", "deadline")
    AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    agent_ids: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    deadline: float
    def __init__(self, agent_ids: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ..., deadline: _Optional[float] = ...) -> None: ...

class CreateReservationRequest(_message.Message):
    __slots__ = ("name", "agent_ids", "size", "allocation_id", "start", "end", "reason", "maintenance", "users", "accounts")
    NAME_FIELD_NUMBER: _ClassVar[int]
    AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MAINTENANCE_FIELD_NUMBER: _ClassVar[int]
    USERS_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    agent_ids: _containers.RepeatedScalarFieldContainer[str]
    size: int
    allocation_id: str
    start: float
    end: float
    reason: str
    maintenance: bool
    users: _containers.RepeatedScalarFieldContainer[str]
    accounts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., agent_ids: _Optional[_Iterable[str]] = ..., size: _Optional[int] = ..., allocation_id: _Optional[str] = ..., start: _Optional[float] = ..., end: _Optional[float] = ..., reason: _Optional[str] = ..., maintenance: _Optional[bool] = ..., users: _Optional[_Iterable[str]] = ..., accounts: _Optional[_Iterable[str]] = ...) -> None: ...

class ResumeAgentsRequest(_message.Message):
    __slots__ = ("agent_ids",)
    AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    agent_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, agent_ids: _Optional[_Iterable[str]] = ...) -> None: ...

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
    __slots__ = ("id", "host", "port", "take_over", "takeover_grant")
    ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    TAKE_OVER_FIELD_NUMBER: _ClassVar[int]
    TAKEOVER_GRANT_FIELD_NUMBER: _ClassVar[int]
    id: str
    host: str
    port: int
    take_over: bool
    takeover_grant: str
    def __init__(self, id: _Optional[str] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., take_over: _Optional[bool] = ..., takeover_grant: _Optional[str] = ...) -> None: ...

class CreateAgentReply(_message.Message):
    __slots__ = ("agent",)
    AGENT_FIELD_NUMBER: _ClassVar[int]
    agent: Agent
    def __init__(self, agent: _Optional[_Union[Agent, _Mapping]] = ...) -> None: ...

class PowerAgentRequest(_message.Message):
    __slots__ = ("agent_id", "action", "force")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    action: str
    force: bool
    def __init__(self, agent_id: _Optional[str] = ..., action: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class PowerAgentReply(_message.Message):
    __slots__ = ("power_state", "failed_partitions")
    POWER_STATE_FIELD_NUMBER: _ClassVar[int]
    FAILED_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    power_state: str
    failed_partitions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, power_state: _Optional[str] = ..., failed_partitions: _Optional[_Iterable[str]] = ...) -> None: ...

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

class CompactRequest(_message.Message):
    __slots__ = ("allocation_id", "dry_run")
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    allocation_id: str
    dry_run: bool
    def __init__(self, allocation_id: _Optional[str] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class CompactionMove(_message.Message):
    __slots__ = ("partition_id", "to", "moved")
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    MOVED_FIELD_NUMBER: _ClassVar[int]
    partition_id: str
    to: str
    moved: bool
    def __init__(self, partition_id: _Optional[str] = ..., to: _Optional[str] = ..., moved: _Optional[bool] = ..., **kwargs) -> None: ...

class CompactReply(_message.Message):
    __slots__ = ("allocation_id", "moves", "frees_ipus", "frees_at", "no_plan", "stopped", "dry_run")
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    MOVES_FIELD_NUMBER: _ClassVar[int]
    FREES_IPUS_FIELD_NUMBER: _ClassVar[int]
    FREES_AT_FIELD_NUMBER: _ClassVar[int]
    NO_PLAN_FIELD_NUMBER: _ClassVar[int]
    STOPPED_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    allocation_id: str
    moves: _containers.RepeatedCompositeFieldContainer[CompactionMove]
    frees_ipus: int
    frees_at: str
    no_plan: str
    stopped: str
    dry_run: bool
    def __init__(self, allocation_id: _Optional[str] = ..., moves: _Optional[_Iterable[_Union[CompactionMove, _Mapping]]] = ..., frees_ipus: _Optional[int] = ..., frees_at: _Optional[str] = ..., no_plan: _Optional[str] = ..., stopped: _Optional[str] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class ApplyTemplateRequest(_message.Message):
    __slots__ = ("template", "allocation_id", "prefix", "dry_run", "account")
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    ACCOUNT_FIELD_NUMBER: _ClassVar[int]
    template: str
    allocation_id: str
    prefix: str
    dry_run: bool
    account: str
    def __init__(self, template: _Optional[str] = ..., allocation_id: _Optional[str] = ..., prefix: _Optional[str] = ..., dry_run: _Optional[bool] = ..., account: _Optional[str] = ...) -> None: ...

class ApplyTemplateReply(_message.Message):
    __slots__ = ("partitions", "dry_run")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[_vipuuser_pb2.Partition]
    dry_run: bool
    def __init__(self, partitions: _Optional[_Iterable[_Union[_vipuuser_pb2.Partition, _Mapping]]] = ..., dry_run: _Optional[bool] = ...) -> None: ...

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

class TestClusterRequest(_message.Message):
    __slots__ = ("cluster_id", "tests", "wait", "agent_ids")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    TESTS_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    tests: _containers.RepeatedScalarFieldContainer[str]
    wait: bool
    agent_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, cluster_id: _Optional[str] = ..., tests: _Optional[_Iterable[str]] = ..., wait: _Optional[bool] = ..., agent_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ClusterTestResult(_message.Message):
    __slots__ = ("test", "status", "passed", "total", "summary", "duration_seconds")
    TEST_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    test: str
    status: str
    passed: int
    total: int
    summary: _containers.RepeatedScalarFieldContainer[str]
    duration_seconds: float
    def __init__(self, test: _Optional[str] = ..., status: _Optional[str] = ..., passed: _Optional[int] = ..., total: _Optional[int] = ..., summary: _Optional[_Iterable[str]] = ..., duration_seconds: _Optional[float] = ...) -> None: ...

class ClusterTestReport(_message.Message):
    __slots__ = ("cluster_id", "state", "results", "running_test", "planned")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_TEST_FIELD_NUMBER: _ClassVar[int]
    PLANNED_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    state: str
    results: _containers.RepeatedCompositeFieldContainer[ClusterTestResult]
    running_test: str
    planned: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, cluster_id: _Optional[str] = ..., state: _Optional[str] = ..., results: _Optional[_Iterable[_Union[ClusterTestResult, _Mapping]]] = ..., running_test: _Optional[str] = ..., planned: _Optional[_Iterable[str]] = ...) -> None: ...

class StopClusterTestReply(_message.Message):
    __slots__ = ("cluster_id",)
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    def __init__(self, cluster_id: _Optional[str] = ...) -> None: ...

class DiscoverAgentsRequest(_message.Message):
    __slots__ = ("auto_add",)
    AUTO_ADD_FIELD_NUMBER: _ClassVar[int]
    auto_add: bool
    def __init__(self, auto_add: _Optional[bool] = ...) -> None: ...

class DiscoveredAgent(_message.Message):
    __slots__ = ("host", "port", "interface", "seconds_since_seen", "auto_add_id", "registered_as")
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    INTERFACE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_SINCE_SEEN_FIELD_NUMBER: _ClassVar[int]
    AUTO_ADD_ID_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AS_FIELD_NUMBER: _ClassVar[int]
    host: str
    port: int
    interface: str
    seconds_since_seen: float
    auto_add_id: str
    registered_as: str
    def __init__(self, host: _Optional[str] = ..., port: _Optional[int] = ..., interface: _Optional[str] = ..., seconds_since_seen: _Optional[float] = ..., auto_add_id: _Optional[str] = ..., registered_as: _Optional[str] = ...) -> None: ...

class DiscoverAgentsReply(_message.Message):
    __slots__ = ("agents", "added", "failures")
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    ADDED_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    agents: _containers.RepeatedCompositeFieldContainer[DiscoveredAgent]
    added: _containers.RepeatedScalarFieldContainer[str]
    failures: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, agents: _Optional[_Iterable[_Union[DiscoveredAgent, _Mapping]]] = ..., added: _Optional[_Iterable[str]] = ..., failures: _Optional[_Iterable[str]] = ...) -> None: ...

class User(_message.Message):
    __slots__ = ("id", "admin", "allocation_ids")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADMIN_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_IDS_FIELD_NUMBER: _ClassVar[int]
    id: str
    admin: bool
    allocation_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., admin: _Optional[bool] = ..., allocation_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class CreateUserRequest(_message.Message):
    __slots__ = ("id", "allocation_ids", "admin")
    ID_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_IDS_FIELD_NUMBER: _ClassVar[int]
    ADMIN_FIELD_NUMBER: _ClassVar[int]
    id: str
    allocation_ids: _containers.RepeatedScalarFieldContainer[str]
    admin: bool
    def __init__(self, id: _Optional[str] = ..., allocation_ids: _Optional[_Iterable[str]] = ..., admin: _Optional[bool] = ...) -> None: ...

class UserKeyReply(_message.Message):
    __slots__ = ("user", "access_key", "user_port")
    USER_FIELD_NUMBER: _ClassVar[int]
    ACCESS_KEY_FIELD_NUMBER: _ClassVar[int]
    USER_PORT_FIELD_NUMBER: _ClassVar[int]
    user: User
    access_key: str
    user_port: int
    def __init__(self, user: _Optional[_Union[User, _Mapping]] = ..., access_key: _Optional[str] = ..., user_port: _Optional[int] = ...) -> None: ...

class UpdateUserRequest(_message.Message):
    __slots__ = ("id", "give_allocations", "deny_allocations", "rotate_key")
    ID_FIELD_NUMBER: _ClassVar[int]
    GIVE_ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    DENY_ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    ROTATE_KEY_FIELD_NUMBER: _ClassVar[int]
    id: str
    give_allocations: _containers.RepeatedScalarFieldContainer[str]
    deny_allocations: _containers.RepeatedScalarFieldContainer[str]
    rotate_key: bool
    def __init__(self, id: _Optional[str] = ..., give_allocations: _Optional[_Iterable[str]] = ..., deny_allocations: _Optional[_Iterable[str]] = ..., rotate_key: _Optional[bool] = ...) -> None: ...

class ListUsersReply(_message.Message):
    __slots__ = ("users",)
    USERS_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedCompositeFieldContainer[User]
    def __init__(self, users: _Optional[_Iterable[_Union[User, _Mapping]]] = ...) -> None: ...

class Cable(_message.Message):
    __slots__ = ("kind", "lower_agent_id", "lower_port", "upper_agent_id", "upper_port", "verdict", "failures")
    KIND_FIELD_NUMBER: _ClassVar[int]
    LOWER_AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    LOWER_PORT_FIELD_NUMBER: _ClassVar[int]
    UPPER_AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    UPPER_PORT_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    kind: str
    lower_agent_id: str
    lower_port: int
    upper_agent_id: str
    upper_port: int
    verdict: str
    failures: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, kind: _Optional[str] = ..., lower_agent_id: _Optional[str] = ..., lower_port: _Optional[int] = ..., upper_agent_id: _Optional[str] = ..., upper_port: _Optional[int] = ..., verdict: _Optional[str] = ..., failures: _Optional[_Iterable[str]] = ...) -> None: ...

class Cabling(_message.Message):
    __slots__ = ("cluster_id", "cables", "test_state")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CABLES_FIELD_NUMBER: _ClassVar[int]
    TEST_STATE_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    cables: _containers.RepeatedCompositeFieldContainer[Cable]
    test_state: str
    def __init__(self, cluster_id: _Optional[str] = ..., cables: _Optional[_Iterable[_Union[Cable, _Mapping]]] = ..., test_state: _Optional[str] = ...) -> None: ...

class ListLinksRequest(_message.Message):
    __slots__ = ("agent_id", "unhealthy", "since", "partition_id")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    UNHEALTHY_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    unhealthy: bool
    since: float
    partition_id: str
    def __init__(self, agent_id: _Optional[str] = ..., unhealthy: _Optional[bool] = ..., since: _Optional[float] = ..., partition_id: _Optional[str] = ...) -> None: ...

class LinkCable(_message.Message):
    __slots__ = ("serial", "vendor", "model", "first_seen", "replaced")
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEEN_FIELD_NUMBER: _ClassVar[int]
    REPLACED_FIELD_NUMBER: _ClassVar[int]
    serial: str
    vendor: str
    model: str
    first_seen: float
    replaced: str
    def __init__(self, serial: _Optional[str] = ..., vendor: _Optional[str] = ..., model: _Optional[str] = ..., first_seen: _Optional[float] = ..., replaced: _Optional[str] = ...) -> None: ...

class LinkSample(_message.Message):
    __slots__ = ("at", "corrected_errors", "recovery_events", "up")
    AT_FIELD_NUMBER: _ClassVar[int]
    CORRECTED_ERRORS_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_EVENTS_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    at: float
    corrected_errors: int
    recovery_events: int
    up: bool
    def __init__(self, at: _Optional[float] = ..., corrected_errors: _Optional[int] = ..., recovery_events: _Optional[int] = ..., up: _Optional[bool] = ...) -> None: ...

class LinkSummary(_message.Message):
    __slots__ = ("start", "end", "samples", "down", "corrected_growth", "recovery_growth")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DOWN_FIELD_NUMBER: _ClassVar[int]
    CORRECTED_GROWTH_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_GROWTH_FIELD_NUMBER: _ClassVar[int]
    start: float
    end: float
    samples: int
    down: int
    corrected_growth: int
    recovery_growth: int
    def __init__(self, start: _Optional[float] = ..., end: _Optional[float] = ..., samples: _Optional[int] = ..., down: _Optional[int] = ..., corrected_growth: _Optional[int] = ..., recovery_growth: _Optional[int] = ...) -> None: ...

class LinkEvent(_message.Message):
    __slots__ = ("at", "health", "reason", "partitions")
    AT_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    at: float
    health: str
    reason: str
    partitions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, at: _Optional[float] = ..., health: _Optional[str] = ..., reason: _Optional[str] = ..., partitions: _Optional[_Iterable[str]] = ...) -> None: ...

class Link(_message.Message):
    __slots__ = ("name", "kind", "health", "reason", "changed_at", "cable", "last", "samples", "summaries", "events", "cables", "quarantined", "breaker", "samples_left_out", "events_left_out")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CHANGED_AT_FIELD_NUMBER: _ClassVar[int]
    CABLE_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SUMMARIES_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    CABLES_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_FIELD_NUMBER: _ClassVar[int]
    BREAKER_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_LEFT_OUT_FIELD_NUMBER: _ClassVar[int]
    EVENTS_LEFT_OUT_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    health: str
    reason: str
    changed_at: float
    cable: LinkCable
    last: LinkSample
    samples: _containers.RepeatedCompositeFieldContainer[LinkSample]
    summaries: _containers.RepeatedCompositeFieldContainer[LinkSummary]
    events: _containers.RepeatedCompositeFieldContainer[LinkEvent]
    cables: _containers.RepeatedCompositeFieldContainer[LinkCable]
    quarantined: bool
    breaker: str
    samples_left_out: int
    events_left_out: int
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., health: _Optional[str] = ..., reason: _Optional[str] = ..., changed_at: _Optional[float] = ..., cable: _Optional[_Union[LinkCable, _Mapping]] = ..., last: _Optional[_Union[LinkSample, _Mapping]] = ..., samples: _Optional[_Iterable[_Union[LinkSample, _Mapping]]] = ..., summaries: _Optional[_Iterable[_Union[LinkSummary, _Mapping]]] = ..., events: _Optional[_Iterable[_Union[LinkEvent, _Mapping]]] = ..., cables: _Optional[_Iterable[_Union[LinkCable, _Mapping]]] = ..., quarantined: _Optional[bool] = ..., breaker: _Optional[str] = ..., samples_left_out: _Optional[int] = ..., events_left_out: _Optional[int] = ...) -> None: ...

class ListLinksReply(_message.Message):
    __slots__ = ("links",)
    LINKS_FIELD_NUMBER: _ClassVar[int]
    links: _containers.RepeatedCompositeFieldContainer[Link]
    def __init__(self, links: _Optional[_Iterable[_Union[Link, _Mapping]]] = ...) -> None: ...

class GetLinkRequest(_message.Message):
    __slots__ = ("name", "history", "since", "before", "limit")
    NAME_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    name: str
    history: bool
    since: float
    before: float
    limit: int
    def __init__(self, name: _Optional[str] = ..., history: _Optional[bool] = ..., since: _Optional[float] = ..., before: _Optional[float] = ..., limit: _Optional[int] = ...) -> None: ...

class AccountQuota(_message.Message):
    __slots__ = ("allocation_id", "ipus", "limits")
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    IPUS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    allocation_id: str
    ipus: int
    limits: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, allocation_id: _Optional[str] = ..., ipus: _Optional[int] = ..., limits: _Optional[_Iterable[str]] = ...) -> None: ...

class AccountUse(_message.Message):
    __slots__ = ("allocation_id", "ipus", "partitions", "borrowed_ipus", "waiting", "used_share", "entitled_share")
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    IPUS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    BORROWED_IPUS_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    USED_SHARE_FIELD_NUMBER: _ClassVar[int]
    ENTITLED_SHARE_FIELD_NUMBER: _ClassVar[int]
    allocation_id: str
    ipus: int
    partitions: int
    borrowed_ipus: int
    waiting: int
    used_share: float
    entitled_share: float
    def __init__(self, allocation_id: _Optional[str] = ..., ipus: _Optional[int] = ..., partitions: _Optional[int] = ..., borrowed_ipus: _Optional[int] = ..., waiting: _Optional[int] = ..., used_share: _Optional[float] = ..., entitled_share: _Optional[float] = ...) -> None: ...

class Account(_message.Message):
    __slots__ = ("name", "users", "cohort", "quotas", "use")
    NAME_FIELD_NUMBER: _ClassVar[int]
    USERS_FIELD_NUMBER: _ClassVar[int]
    COHORT_FIELD_NUMBER: _ClassVar[int]
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    USE_FIELD_NUMBER: _ClassVar[int]
    name: str
    users: _containers.RepeatedScalarFieldContainer[str]
    cohort: str
    quotas: _containers.RepeatedCompositeFieldContainer[AccountQuota]
    use: _containers.RepeatedCompositeFieldContainer[AccountUse]
    def __init__(self, name: _Optional[str] = ..., users: _Optional[_Iterable[str]] = ..., cohort: _Optional[str] = ..., quotas: _Optional[_Iterable[_Union[AccountQuota, _Mapping]]] = ..., use: _Optional[_Iterable[_Union[AccountUse, _Mapping]]] = ...) -> None: ...

class CreateAccountRequest(_message.Message):
    __slots__ = ("account",)
    ACCOUNT_FIELD_NUMBER: _ClassVar[int]
    account: Account
    def __init__(self, account: _Optional[_Union[Account, _Mapping]] = ...) -> None: ...

class UpdateAccountRequest(_message.Message):
    __slots__ = ("account", "fields")
    ACCOUNT_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    account: Account
    fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, account: _Optional[_Union[Account, _Mapping]] = ..., fields: _Optional[_Iterable[str]] = ...) -> None: ...

class ListAccountsReply(_message.Message):
    __slots__ = ("accounts",)
    ACCOUNTS_FIELD_NUMBER: _ClassVar[int]
    accounts: _containers.RepeatedCompositeFieldContainer[Account]
    def __init__(self, accounts: _Optional[_Iterable[_Union[Account, _Mapping]]] = ...) -> None: ...

class RemoveAccountRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class UsageReportRequest(_message.Message):
    __slots__ = ("by", "since", "until", "allocation_id")
    BY_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    by: str
    since: float
    until: float
    allocation_id: str
    def __init__(self, by: _Optional[str] = ..., since: _Optional[float] = ..., until: _Optional[float] = ..., allocation_id: _Optional[str] = ...) -> None: ...

class UsageRow(_message.Message):
    __slots__ = ("key", "ipu_seconds", "partitions")
    KEY_FIELD_NUMBER: _ClassVar[int]
    IPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    key: str
    ipu_seconds: float
    partitions: int
    def __init__(self, key: _Optional[str] = ..., ipu_seconds: _Optional[float] = ..., partitions: _Optional[int] = ...) -> None: ...

class UsageReportReply(_message.Message):
    __slots__ = ("rows",)
    ROWS_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[UsageRow]
    def __init__(self, rows: _Optional[_Iterable[_Union[UsageRow, _Mapping]]] = ...) -> None: ...

class ReadMachineLogRequest(_message.Message):
    __slots__ = ("agent_id", "after", "since", "grep", "limit", "wait_seconds")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    GREP_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    after: int
    since: float
    grep: str
    limit: int
    wait_seconds: float
    def __init__(self, agent_id: _Optional[str] = ..., after: _Optional[int] = ..., since: _Optional[float] = ..., grep: _Optional[str] = ..., limit: _Optional[int] = ..., wait_seconds: _Optional[float] = ...) -> None: ...

class ReadMachineLogReply(_message.Message):
    __slots__ = ("lines", "last")
    LINES_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    lines: _containers.RepeatedCompositeFieldContainer[_agent_pb2.MachineLogLine]
    last: int
    def __init__(self, lines: _Optional[_Iterable[_Union[_agent_pb2.MachineLogLine, _Mapping]]] = ..., last: _Optional[int] = ...) -> None: ...

class AgentTelemetry(_message.Message):
    __slots__ = ("agent_id", "telemetry", "partitions")
    class PartitionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: str
        def __init__(self, key: _Optional[int] = ..., value: _Optional[str] = ...) -> None: ...
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    telemetry: _agent_pb2.MachineTelemetry
    partitions: _containers.ScalarMap[int, str]
    def __init__(self, agent_id: _Optional[str] = ..., telemetry: _Optional[_Union[_agent_pb2.MachineTelemetry, _Mapping]] = ..., partitions: _Optional[_Mapping[int, str]] = ...) -> None: ...

class ListTelemetryReply(_message.Message):
    __slots__ = ("agents",)
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    agents: _containers.RepeatedCompositeFieldContainer[AgentTelemetry]
    def __init__(self, agents: _Optional[_Iterable[_Union[AgentTelemetry, _Mapping]]] = ...) -> None: ...
