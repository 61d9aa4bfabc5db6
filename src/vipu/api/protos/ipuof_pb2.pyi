from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class AttachRequest(_message.Message):
    __slots__ = ("partition_id", "device_id", "chip_id", "attach_key", "session", "hold_seconds")
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    CHIP_ID_FIELD_NUMBER: _ClassVar[int]
    ATTACH_KEY_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    HOLD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    partition_id: str
    device_id: int
    chip_id: str
    attach_key: str
    session: str
    hold_seconds: float
    def __init__(self, partition_id: _Optional[str] = ..., device_id: _Optional[int] = ..., chip_id: _Optional[str] = ..., attach_key: _Optional[str] = ..., session: _Optional[str] = ..., hold_seconds: _Optional[float] = ...) -> None: ...

class AttachReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RunRequest(_message.Message):
    __slots__ = ("partition_id", "device_id", "chip_id", "routing_id", "seed", "attach_key", "session")
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    CHIP_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTING_ID_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    ATTACH_KEY_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    partition_id: str
    device_id: int
    chip_id: str
    routing_id: int
    seed: int
    attach_key: str
    session: str
    def __init__(self, partition_id: _Optional[str] = ..., device_id: _Optional[int] = ..., chip_id: _Optional[str] = ..., routing_id: _Optional[int] = ..., seed: _Optional[int] = ..., attach_key: _Optional[str] = ..., session: _Optional[str] = ...) -> None: ...

class RunReply(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: int
    def __init__(self, result: _Optional[int] = ...) -> None: ...

class DetachRequest(_message.Message):
    __slots__ = ("partition_id", "device_id", "session")
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    partition_id: str
    device_id: int
    session: str
    def __init__(self, partition_id: _Optional[str] = ..., device_id: _Optional[int] = ..., session: _Optional[str] = ...) -> None: ...

class DetachReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
