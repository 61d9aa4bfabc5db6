"""A small IPUoF client: attach to every IPU of a partition and run the test program on them.

It reads IPUoF configuration files as `vipu create partition` writes them, attaches to each IPU
at the end-point its file names, and runs the same deterministic program the traffic test
loads. Each IPU's result must be what that chip at that place in its GCD computes, so a file
pointing at the wrong machine, a partition no longer configured, or an IPU owned by another
partition all fail, each with the reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from vipu.api.protos import ipuof_pb2, ipuof_pb2_grpc
from vipu.api.status import error_from_rpc
from vipu.ipuof import files
from vipu.model.clustertests import program_checksum
from vipu.model.configuration import ATTACH_KEY_ATTRIBUTE
from vipu.model.errors import HardwareFailure, InvalidArgument, NotFound


@dataclass(frozen=True)
class Device:
    ip: str
    server_port: int
    device_id: int
    routing_id: int
    chip_id: str

    @property
    def where(self) -> str:
        return f"IPU {self.device_id} at {self.ip}:{self.server_port}"


@dataclass(frozen=True)
class GcdFile:
    path: Path
    partition_id: str
    gcd_id: int
    devices: tuple[Device, ...]
    attach_key: str = field(default="", repr=False)


def parse(document: dict, origin: str, path: Path | None = None) -> GcdFile:
    """One GCD's IPUoF configuration from its JSON document; `origin` names it in errors."""
    try:
        attributes = document["attributes"]
        devices = tuple(
            Device(d["ip"], int(d["server_port"]), int(d["device_id"]), int(d["routing_id"]), str(d.get("chip_id", "")))
            for d in document["devices"]
        )
        return GcdFile(path or Path(origin), attributes["Partition Id"], int(attributes.get("GCD Id", 0)), devices,
                       str(attributes.get(ATTACH_KEY_ATTRIBUTE, "")))
    except (ValueError, KeyError, TypeError) as error:
        raise InvalidArgument(f"{origin} is not an IPUoF configuration ({type(error).__name__}: {error})") from error


def read(path: Path) -> GcdFile:
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise InvalidArgument(f"cannot read {path}: {error.strerror}") from error
    try:
        document = json.loads(text)
    except ValueError as error:
        raise InvalidArgument(f"{path} is not an IPUoF configuration (not JSON: {error})") from error
    return parse(document, str(path), Path(path))


def files_of(partition_id: str, directory: Path) -> list[Path]:
    """A partition's IPUoF files in a directory, in GCD order."""
    single = directory / files.file_name(partition_id, 0, 1)
    if single.exists():
        return [single]
    found = files.gcd_files(directory, partition_id)
    if not found:
        raise NotFound(f"no IPUoF configuration of partition {partition_id} in {directory}")
    return found


class Client:
    def __init__(self, timeout: float = 30.0):
        self.timeout = timeout
        self._channels: dict[str, grpc.Channel] = {}

    def _stub(self, device: Device) -> ipuof_pb2_grpc.IpuofServiceStub:
        address = f"{device.ip}:{device.server_port}"
        if address not in self._channels:
            self._channels[address] = grpc.insecure_channel(address)
        return ipuof_pb2_grpc.IpuofServiceStub(self._channels[address])

    def _call(self, device: Device, method: str, request):
        try:
            return getattr(self._stub(device), method)(request, timeout=self.timeout)
        except grpc.RpcError as error:
            failure = error_from_rpc(error)
            raise type(failure)(f"{device.where}: {failure.message}") from None

    def run(self, gcds: list[GcdFile], seed: int) -> int:
        """Attach to every IPU, then run the program on each; the number of IPUs that ran it."""
        for gcd in gcds:
            for device in gcd.devices:
                self._call(device, "Attach", ipuof_pb2.AttachRequest(
                    partition_id=gcd.partition_id, device_id=device.device_id, chip_id=device.chip_id, attach_key=gcd.attach_key))
        for gcd in gcds:
            for device in gcd.devices:
                reply = self._call(device, "Run", ipuof_pb2.RunRequest(
                    partition_id=gcd.partition_id, device_id=device.device_id, chip_id=device.chip_id,
                    routing_id=device.routing_id, seed=seed, attach_key=gcd.attach_key))
                if reply.result != program_checksum(seed, device.chip_id, device.routing_id):
                    raise HardwareFailure(f"{device.where} returned a wrong result from the test program")
        return sum(len(gcd.devices) for gcd in gcds)

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
