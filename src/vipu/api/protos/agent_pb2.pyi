from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetInventoryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Ipu(_message.Message):
    __slots__ = ("index", "chip_id", "attributes")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    INDEX_FIELD_NUMBER: _ClassVar[int]
    CHIP_ID_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    index: int
    chip_id: str
    attributes: _containers.ScalarMap[str, str]
    def __init__(self, index: _Optional[int] = ..., chip_id: _Optional[str] = ..., attributes: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Inventory(_message.Message):
    __slots__ = ("machine_serial", "platform", "manufacturer", "board_part_number", "versions", "backend", "backend_version", "ipuof_host", "ipuof_port", "rdma_port", "ipus", "exporter_port", "ipu_arch_id", "holder", "capabilities", "cables", "components")
    class VersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MACHINE_SERIAL_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    MANUFACTURER_FIELD_NUMBER: _ClassVar[int]
    BOARD_PART_NUMBER_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    BACKEND_VERSION_FIELD_NUMBER: _ClassVar[int]
    IPUOF_HOST_FIELD_NUMBER: _ClassVar[int]
    IPUOF_PORT_FIELD_NUMBER: _ClassVar[int]
    RDMA_PORT_FIELD_NUMBER: _ClassVar[int]
    IPUS_FIELD_NUMBER: _ClassVar[int]
    EXPORTER_PORT_FIELD_NUMBER: _ClassVar[int]
    IPU_ARCH_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    CABLES_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    machine_serial: str
    platform: str
    manufacturer: str
    board_part_number: str
    versions: _containers.ScalarMap[str, str]
    backend: str
    backend_version: str
    ipuof_host: str
    ipuof_port: int
    rdma_port: int
    ipus: _containers.RepeatedCompositeFieldContainer[Ipu]
    exporter_port: int
    ipu_arch_id: int
    holder: str
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    cables: _containers.RepeatedCompositeFieldContainer[PortCable]
    components: _containers.RepeatedCompositeFieldContainer[HardwareComponent]
    def __init__(self, machine_serial: _Optional[str] = ..., platform: _Optional[str] = ..., manufacturer: _Optional[str] = ..., board_part_number: _Optional[str] = ..., versions: _Optional[_Mapping[str, str]] = ..., backend: _Optional[str] = ..., backend_version: _Optional[str] = ..., ipuof_host: _Optional[str] = ..., ipuof_port: _Optional[int] = ..., rdma_port: _Optional[int] = ..., ipus: _Optional[_Iterable[_Union[Ipu, _Mapping]]] = ..., exporter_port: _Optional[int] = ..., ipu_arch_id: _Optional[int] = ..., holder: _Optional[str] = ..., capabilities: _Optional[_Iterable[str]] = ..., cables: _Optional[_Iterable[_Union[PortCable, _Mapping]]] = ..., components: _Optional[_Iterable[_Union[HardwareComponent, _Mapping]]] = ...) -> None: ...

class PortCable(_message.Message):
    __slots__ = ("port", "serial", "vendor", "model")
    PORT_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    port: str
    serial: str
    vendor: str
    model: str
    def __init__(self, port: _Optional[str] = ..., serial: _Optional[str] = ..., vendor: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class HardwareComponent(_message.Message):
    __slots__ = ("id", "kind", "name", "serial", "model", "manufacturer", "firmware")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MANUFACTURER_FIELD_NUMBER: _ClassVar[int]
    FIRMWARE_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: str
    name: str
    serial: str
    model: str
    manufacturer: str
    firmware: str
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[str] = ..., name: _Optional[str] = ..., serial: _Optional[str] = ..., model: _Optional[str] = ..., manufacturer: _Optional[str] = ..., firmware: _Optional[str] = ...) -> None: ...

class GetConditionRequest(_message.Message):
    __slots__ = ("after_event",)
    AFTER_EVENT_FIELD_NUMBER: _ClassVar[int]
    after_event: int
    def __init__(self, after_event: _Optional[int] = ...) -> None: ...

class ComponentStatus(_message.Message):
    __slots__ = ("component", "health", "state", "message")
    COMPONENT_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    component: str
    health: str
    state: str
    message: str
    def __init__(self, component: _Optional[str] = ..., health: _Optional[str] = ..., state: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class HealthEvent(_message.Message):
    __slots__ = ("sequence", "at", "severity", "component", "message")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    COMPONENT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    at: float
    severity: str
    component: str
    message: str
    def __init__(self, sequence: _Optional[int] = ..., at: _Optional[float] = ..., severity: _Optional[str] = ..., component: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class Condition(_message.Message):
    __slots__ = ("power_state", "health", "components", "problems", "events")
    POWER_STATE_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    power_state: str
    health: str
    components: _containers.RepeatedCompositeFieldContainer[ComponentStatus]
    problems: _containers.RepeatedScalarFieldContainer[str]
    events: _containers.RepeatedCompositeFieldContainer[HealthEvent]
    def __init__(self, power_state: _Optional[str] = ..., health: _Optional[str] = ..., components: _Optional[_Iterable[_Union[ComponentStatus, _Mapping]]] = ..., problems: _Optional[_Iterable[str]] = ..., events: _Optional[_Iterable[_Union[HealthEvent, _Mapping]]] = ...) -> None: ...

class PowerRequest(_message.Message):
    __slots__ = ("action", "timeout_seconds")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    action: str
    timeout_seconds: float
    def __init__(self, action: _Optional[str] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class PowerReply(_message.Message):
    __slots__ = ("power_state",)
    POWER_STATE_FIELD_NUMBER: _ClassVar[int]
    power_state: str
    def __init__(self, power_state: _Optional[str] = ...) -> None: ...

class PortLink(_message.Message):
    __slots__ = ("port", "peer_serial", "peer_port")
    PORT_FIELD_NUMBER: _ClassVar[int]
    PEER_SERIAL_FIELD_NUMBER: _ClassVar[int]
    PEER_PORT_FIELD_NUMBER: _ClassVar[int]
    port: int
    peer_serial: str
    peer_port: int
    def __init__(self, port: _Optional[int] = ..., peer_serial: _Optional[str] = ..., peer_port: _Optional[int] = ...) -> None: ...

class IpuSetting(_message.Message):
    __slots__ = ("index", "routing_id", "gcd_id", "ipulink_segment_id", "internal_peers")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ROUTING_ID_FIELD_NUMBER: _ClassVar[int]
    GCD_ID_FIELD_NUMBER: _ClassVar[int]
    IPULINK_SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    INTERNAL_PEERS_FIELD_NUMBER: _ClassVar[int]
    index: int
    routing_id: int
    gcd_id: int
    ipulink_segment_id: int
    internal_peers: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, index: _Optional[int] = ..., routing_id: _Optional[int] = ..., gcd_id: _Optional[int] = ..., ipulink_segment_id: _Optional[int] = ..., internal_peers: _Optional[_Iterable[int]] = ...) -> None: ...

class PartitionSettings(_message.Message):
    __slots__ = ("partition_id", "ipus", "ipulinks", "synclinks", "gwlinks", "ipulink_routing", "gw_routing", "sync_type", "reconfigurable", "attach_key", "owner", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    IPUS_FIELD_NUMBER: _ClassVar[int]
    IPULINKS_FIELD_NUMBER: _ClassVar[int]
    SYNCLINKS_FIELD_NUMBER: _ClassVar[int]
    GWLINKS_FIELD_NUMBER: _ClassVar[int]
    IPULINK_ROUTING_FIELD_NUMBER: _ClassVar[int]
    GW_ROUTING_FIELD_NUMBER: _ClassVar[int]
    SYNC_TYPE_FIELD_NUMBER: _ClassVar[int]
    RECONFIGURABLE_FIELD_NUMBER: _ClassVar[int]
    ATTACH_KEY_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    partition_id: str
    ipus: _containers.RepeatedCompositeFieldContainer[IpuSetting]
    ipulinks: _containers.RepeatedCompositeFieldContainer[PortLink]
    synclinks: _containers.RepeatedCompositeFieldContainer[PortLink]
    gwlinks: _containers.RepeatedCompositeFieldContainer[PortLink]
    ipulink_routing: str
    gw_routing: str
    sync_type: str
    reconfigurable: bool
    attach_key: str
    owner: str
    labels: _containers.ScalarMap[str, str]
    def __init__(self, partition_id: _Optional[str] = ..., ipus: _Optional[_Iterable[_Union[IpuSetting, _Mapping]]] = ..., ipulinks: _Optional[_Iterable[_Union[PortLink, _Mapping]]] = ..., synclinks: _Optional[_Iterable[_Union[PortLink, _Mapping]]] = ..., gwlinks: _Optional[_Iterable[_Union[PortLink, _Mapping]]] = ..., ipulink_routing: _Optional[str] = ..., gw_routing: _Optional[str] = ..., sync_type: _Optional[str] = ..., reconfigurable: _Optional[bool] = ..., attach_key: _Optional[str] = ..., owner: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ApplyPartitionRequest(_message.Message):
    __slots__ = ("settings",)
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    settings: PartitionSettings
    def __init__(self, settings: _Optional[_Union[PartitionSettings, _Mapping]] = ...) -> None: ...

class ApplyPartitionReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClearPartitionRequest(_message.Message):
    __slots__ = ("partition_id",)
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    partition_id: str
    def __init__(self, partition_id: _Optional[str] = ...) -> None: ...

class ClearPartitionReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPartitionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPartitionsReply(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionSettings]
    def __init__(self, partitions: _Optional[_Iterable[_Union[PartitionSettings, _Mapping]]] = ...) -> None: ...

class DiagnoseRequest(_message.Message):
    __slots__ = ("probe", "ipus", "seed")
    class IpusEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    PROBE_FIELD_NUMBER: _ClassVar[int]
    IPUS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    probe: str
    ipus: _containers.ScalarMap[int, int]
    seed: int
    def __init__(self, probe: _Optional[str] = ..., ipus: _Optional[_Mapping[int, int]] = ..., seed: _Optional[int] = ...) -> None: ...

class PortReading(_message.Message):
    __slots__ = ("kind", "port", "cable_serial", "up", "peer_serial", "peer_port", "errors")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    CABLE_SERIAL_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    PEER_SERIAL_FIELD_NUMBER: _ClassVar[int]
    PEER_PORT_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    port: int
    cable_serial: str
    up: bool
    peer_serial: str
    peer_port: int
    errors: int
    def __init__(self, kind: _Optional[str] = ..., port: _Optional[int] = ..., cable_serial: _Optional[str] = ..., up: _Optional[bool] = ..., peer_serial: _Optional[str] = ..., peer_port: _Optional[int] = ..., errors: _Optional[int] = ...) -> None: ...

class InternalLinkReading(_message.Message):
    __slots__ = ("link", "up", "errors")
    LINK_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    link: str
    up: bool
    errors: int
    def __init__(self, link: _Optional[str] = ..., up: _Optional[bool] = ..., errors: _Optional[int] = ...) -> None: ...

class PfcClasses(_message.Message):
    __slots__ = ("classes",)
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    classes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, classes: _Optional[_Iterable[int]] = ...) -> None: ...

class DiagnoseReply(_message.Message):
    __slots__ = ("ports", "internal_links", "checksums", "rnics")
    class ChecksumsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    class RnicsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: PfcClasses
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[PfcClasses, _Mapping]] = ...) -> None: ...
    PORTS_FIELD_NUMBER: _ClassVar[int]
    INTERNAL_LINKS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    RNICS_FIELD_NUMBER: _ClassVar[int]
    ports: _containers.RepeatedCompositeFieldContainer[PortReading]
    internal_links: _containers.RepeatedCompositeFieldContainer[InternalLinkReading]
    checksums: _containers.ScalarMap[int, int]
    rnics: _containers.MessageMap[str, PfcClasses]
    def __init__(self, ports: _Optional[_Iterable[_Union[PortReading, _Mapping]]] = ..., internal_links: _Optional[_Iterable[_Union[InternalLinkReading, _Mapping]]] = ..., checksums: _Optional[_Mapping[int, int]] = ..., rnics: _Optional[_Mapping[str, PfcClasses]] = ...) -> None: ...

class LinkCountersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CableIdentity(_message.Message):
    __slots__ = ("serial", "vendor", "model")
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    serial: str
    vendor: str
    model: str
    def __init__(self, serial: _Optional[str] = ..., vendor: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class LinkCounter(_message.Message):
    __slots__ = ("place", "corrected_errors", "recovery_events", "up", "cable", "peer_serial", "peer_port")
    PLACE_FIELD_NUMBER: _ClassVar[int]
    CORRECTED_ERRORS_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_EVENTS_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    CABLE_FIELD_NUMBER: _ClassVar[int]
    PEER_SERIAL_FIELD_NUMBER: _ClassVar[int]
    PEER_PORT_FIELD_NUMBER: _ClassVar[int]
    place: str
    corrected_errors: int
    recovery_events: int
    up: bool
    cable: CableIdentity
    peer_serial: str
    peer_port: int
    def __init__(self, place: _Optional[str] = ..., corrected_errors: _Optional[int] = ..., recovery_events: _Optional[int] = ..., up: _Optional[bool] = ..., cable: _Optional[_Union[CableIdentity, _Mapping]] = ..., peer_serial: _Optional[str] = ..., peer_port: _Optional[int] = ...) -> None: ...

class LinkCountersReply(_message.Message):
    __slots__ = ("links", "read_at")
    LINKS_FIELD_NUMBER: _ClassVar[int]
    READ_AT_FIELD_NUMBER: _ClassVar[int]
    links: _containers.RepeatedCompositeFieldContainer[LinkCounter]
    read_at: float
    def __init__(self, links: _Optional[_Iterable[_Union[LinkCounter, _Mapping]]] = ..., read_at: _Optional[float] = ...) -> None: ...

class ResetLinkRequest(_message.Message):
    __slots__ = ("place",)
    PLACE_FIELD_NUMBER: _ClassVar[int]
    place: str
    def __init__(self, place: _Optional[str] = ...) -> None: ...

class ResetLinkReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AttachmentsRequest(_message.Message):
    __slots__ = ("partition_ids", "fence_seconds")
    PARTITION_IDS_FIELD_NUMBER: _ClassVar[int]
    FENCE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    partition_ids: _containers.RepeatedScalarFieldContainer[str]
    fence_seconds: float
    def __init__(self, partition_ids: _Optional[_Iterable[str]] = ..., fence_seconds: _Optional[float] = ...) -> None: ...

class PartitionAttachments(_message.Message):
    __slots__ = ("partition_id", "attached_clients", "oldest_attached_at", "fenced_until")
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    ATTACHED_CLIENTS_FIELD_NUMBER: _ClassVar[int]
    OLDEST_ATTACHED_AT_FIELD_NUMBER: _ClassVar[int]
    FENCED_UNTIL_FIELD_NUMBER: _ClassVar[int]
    partition_id: str
    attached_clients: int
    oldest_attached_at: float
    fenced_until: float
    def __init__(self, partition_id: _Optional[str] = ..., attached_clients: _Optional[int] = ..., oldest_attached_at: _Optional[float] = ..., fenced_until: _Optional[float] = ...) -> None: ...

class AttachmentsReply(_message.Message):
    __slots__ = ("partitions", "read_at")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    READ_AT_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionAttachments]
    read_at: float
    def __init__(self, partitions: _Optional[_Iterable[_Union[PartitionAttachments, _Mapping]]] = ..., read_at: _Optional[float] = ...) -> None: ...

class ClaimRequest(_message.Message):
    __slots__ = ("takeover_grant",)
    TAKEOVER_GRANT_FIELD_NUMBER: _ClassVar[int]
    takeover_grant: str
    def __init__(self, takeover_grant: _Optional[str] = ...) -> None: ...

class ClaimReply(_message.Message):
    __slots__ = ("holder", "previous_holder")
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_HOLDER_FIELD_NUMBER: _ClassVar[int]
    holder: str
    previous_holder: str
    def __init__(self, holder: _Optional[str] = ..., previous_holder: _Optional[str] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReleaseReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class IpuTelemetry(_message.Message):
    __slots__ = ("index", "utilisation", "temperature", "power", "clock_mhz", "memory_used", "memory_total", "ecc_errors", "parity_errors", "link_errors")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UTILISATION_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    POWER_FIELD_NUMBER: _ClassVar[int]
    CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ECC_ERRORS_FIELD_NUMBER: _ClassVar[int]
    PARITY_ERRORS_FIELD_NUMBER: _ClassVar[int]
    LINK_ERRORS_FIELD_NUMBER: _ClassVar[int]
    index: int
    utilisation: float
    temperature: float
    power: float
    clock_mhz: float
    memory_used: int
    memory_total: int
    ecc_errors: int
    parity_errors: int
    link_errors: int
    def __init__(self, index: _Optional[int] = ..., utilisation: _Optional[float] = ..., temperature: _Optional[float] = ..., power: _Optional[float] = ..., clock_mhz: _Optional[float] = ..., memory_used: _Optional[int] = ..., memory_total: _Optional[int] = ..., ecc_errors: _Optional[int] = ..., parity_errors: _Optional[int] = ..., link_errors: _Optional[int] = ...) -> None: ...

class SensorTelemetry(_message.Message):
    __slots__ = ("name", "kind", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    value: float
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...

class MachineTelemetry(_message.Message):
    __slots__ = ("read_at", "age_seconds", "ipus", "sensors")
    READ_AT_FIELD_NUMBER: _ClassVar[int]
    AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    IPUS_FIELD_NUMBER: _ClassVar[int]
    SENSORS_FIELD_NUMBER: _ClassVar[int]
    read_at: float
    age_seconds: float
    ipus: _containers.RepeatedCompositeFieldContainer[IpuTelemetry]
    sensors: _containers.RepeatedCompositeFieldContainer[SensorTelemetry]
    def __init__(self, read_at: _Optional[float] = ..., age_seconds: _Optional[float] = ..., ipus: _Optional[_Iterable[_Union[IpuTelemetry, _Mapping]]] = ..., sensors: _Optional[_Iterable[_Union[SensorTelemetry, _Mapping]]] = ...) -> None: ...

class MachineLogLine(_message.Message):
    __slots__ = ("sequence", "at", "source", "text")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    at: float
    source: str
    text: str
    def __init__(self, sequence: _Optional[int] = ..., at: _Optional[float] = ..., source: _Optional[str] = ..., text: _Optional[str] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("after_line", "most_lines", "incarnation")
    AFTER_LINE_FIELD_NUMBER: _ClassVar[int]
    MOST_LINES_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    after_line: int
    most_lines: int
    incarnation: str
    def __init__(self, after_line: _Optional[int] = ..., most_lines: _Optional[int] = ..., incarnation: _Optional[str] = ...) -> None: ...

class WatchReply(_message.Message):
    __slots__ = ("telemetry", "lines", "missed_lines", "incarnation")
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    MISSED_LINES_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    telemetry: MachineTelemetry
    lines: _containers.RepeatedCompositeFieldContainer[MachineLogLine]
    missed_lines: int
    incarnation: str
    def __init__(self, telemetry: _Optional[_Union[MachineTelemetry, _Mapping]] = ..., lines: _Optional[_Iterable[_Union[MachineLogLine, _Mapping]]] = ..., missed_lines: _Optional[int] = ..., incarnation: _Optional[str] = ...) -> None: ...
