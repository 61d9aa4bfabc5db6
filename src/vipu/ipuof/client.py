"""A small IPUoF client: attach to every IPU of a partition and run the test program on them.

It reads IPUoF configuration files as `vipu create partition` writes them, attaches to each IPU
at the end-point its file names, and runs the same deterministic program the traffic test
loads. Each IPU's result must be what that chip at that place in its GCD computes, so a file
pointing at the wrong machine, a partition no longer configured, or an IPU owned by another
partition all fail, each with the reason.

A client is one session: what it attaches stays attached (the controller does not move a partition
a client is attached to) until it detaches, or its hold lapses if it cannot. `run` detaches what it
attached when it ends, however it ends.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from vipu import textfiles
from vipu.api.protos import ipuof_pb2, ipuof_pb2_grpc
from vipu.api.status import error_from_rpc
from vipu.ipuof import files
from vipu.model.clustertests import program_checksum
from vipu.model.errors import HardwareFailure, InvalidArgument, NotFound, Unavailable, VipuError
from vipu.model.ipuof_attributes import ATTACH_KEY_ATTRIBUTE

CONFIG_LIMIT_BYTES = 1 << 20  # a 64-IPU partition's configuration is a few KiB; anything this long is not one
DETACH_TIMEOUT = 5.0  # seconds for each detach that cleans up: an IPU that does not answer lets its hold lapse instead


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
    text = textfiles.read_text(Path(path), CONFIG_LIMIT_BYTES, "an IPUoF configuration")
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
    """One IPUoF client session: `session` names its attachments to the IPUs."""

    def __init__(self, timeout: float = 30.0):
        self.timeout = timeout
        self.session = secrets.token_hex(16)
        self._channels: dict[str, grpc.Channel] = {}

    def _stub(self, device: Device) -> ipuof_pb2_grpc.IpuofServiceStub:
        address = f"{device.ip}:{device.server_port}"
        if address not in self._channels:
            self._channels[address] = grpc.insecure_channel(address)
        return ipuof_pb2_grpc.IpuofServiceStub(self._channels[address])

    def _call(self, device: Device, method: str, request, timeout: float | None = None):
        try:
            return getattr(self._stub(device), method)(request, timeout=timeout or self.timeout)
        except grpc.RpcError as error:
            failure = error_from_rpc(error)
            raise type(failure)(f"{device.where}: {failure.message}") from None

    def attach(self, gcds: list[GcdFile], hold_seconds: float = 0.0) -> int:
        """Attach to every IPU for `hold_seconds` (0: the machine's default) unless detached first;
        the number of IPUs attached. If one refuses, those already attached are detached again."""
        attached: list[tuple[GcdFile, Device]] = []
        try:
            for gcd in gcds:
                for device in gcd.devices:
                    self._call(device, "Attach", ipuof_pb2.AttachRequest(
                        partition_id=gcd.partition_id, device_id=device.device_id, chip_id=device.chip_id,
                        attach_key=gcd.attach_key, session=self.session, hold_seconds=hold_seconds))
                    attached.append((gcd, device))
        except BaseException:
            self._detach_quietly(attached)
            raise
        return len(attached)

    def detach(self, gcds: list[GcdFile]) -> int:
        """End this session's attachment of every IPU; the number of IPUs. What is no longer
        attached (lapsed, or its partition cleared) is no error; an IPU that fails to answer is,
        once every other has been detached."""
        failures = self._detach_each([(gcd, device) for gcd in gcds for device in gcd.devices], self.timeout)
        if failures:
            raise failures[0]
        return sum(len(gcd.devices) for gcd in gcds)

    def _detach_quietly(self, attached: list[tuple[GcdFile, Device]]) -> None:
        """Detach what a failed or finished step attached, as far as the machines answer: the
        step's own outcome is what the caller hears, and an attachment left behind lapses."""
        self._detach_each(attached, min(DETACH_TIMEOUT, self.timeout))

    def _detach_each(self, attached: list[tuple[GcdFile, Device]], timeout: float) -> list[VipuError]:
        """Detach every IPU, skipping the rest of an end-point that cannot be reached; the failures."""
        failures: list[VipuError] = []
        unreachable: set[tuple[str, int]] = set()
        for gcd, device in attached:
            if (device.ip, device.server_port) in unreachable:
                continue
            try:
                self._call(device, "Detach", ipuof_pb2.DetachRequest(
                    partition_id=gcd.partition_id, device_id=device.device_id, session=self.session), timeout)
            except VipuError as failure:
                failures.append(failure)
                if isinstance(failure, Unavailable):
                    unreachable.add((device.ip, device.server_port))
        return failures

    def run(self, gcds: list[GcdFile], seed: int) -> int:
        """Attach to every IPU, then run the program on each; the number of IPUs that ran it. What
        it attached is detached when it ends, also when it fails."""
        self.attach(gcds)
        try:
            for gcd in gcds:
                for device in gcd.devices:
                    reply = self._call(device, "Run", ipuof_pb2.RunRequest(
                        partition_id=gcd.partition_id, device_id=device.device_id, chip_id=device.chip_id,
                        routing_id=device.routing_id, seed=seed, attach_key=gcd.attach_key, session=self.session))
                    if reply.result != program_checksum(seed, device.chip_id, device.routing_id):
                        raise HardwareFailure(f"{device.where} returned a wrong result from the test program")
        finally:
            self._detach_quietly([(gcd, device) for gcd in gcds for device in gcd.devices])
        return sum(len(gcd.devices) for gcd in gcds)

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
