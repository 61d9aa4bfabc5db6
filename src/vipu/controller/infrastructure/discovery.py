"""Listening for agents' multicast announcements on chosen network interfaces.

`vipu-server -a eth0,eth1` joins the discovery group on exactly those interfaces and keeps, for
each agent address heard, the interface it arrived on and when it was last heard. Datagrams
arriving on any other interface are ignored. An announcement naming no usable host (an agent
listening on every address) stands for the address it was sent from.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from dataclasses import dataclass

from vipu.api.announcements import DISCOVERY_GROUP, DISCOVERY_PORT, decode
from vipu.model.errors import InvalidArgument, Unavailable

log = logging.getLogger(__name__)

UNSPECIFIED_HOSTS = {"", "0.0.0.0", "::"}
IP_PKTINFO = getattr(socket, "IP_PKTINFO", 8)  # Linux's value; Python names it only from 3.12


@dataclass(frozen=True)
class Sighting:
    host: str
    port: int
    interface: str
    serial: str
    last_seen: float  # time.monotonic()

    @property
    def seconds_since_seen(self) -> float:
        return time.monotonic() - self.last_seen


class DiscoveryListener:
    def __init__(self, interfaces: list[str], group: str = DISCOVERY_GROUP, port: int = DISCOVERY_PORT):
        if not interfaces:
            raise InvalidArgument("name at least one network interface to listen on")
        known = {name: index for index, name in socket.if_nameindex()}
        unknown = [name for name in interfaces if name not in known]
        if unknown:
            raise InvalidArgument(f"there is no network interface {unknown[0]} (there are {', '.join(sorted(known))})")
        self.interfaces = {known[name]: name for name in interfaces}
        self._sightings: dict[tuple[str, int], Sighting] = {}
        self._lock = threading.Lock()
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
        try:
            self._socket.bind(("", port))
            for index in self.interfaces:
                # struct ip_mreqn: group, any local address, interface index
                request = socket.inet_aton(group) + socket.inet_aton("0.0.0.0") + struct.pack("@i", index)
                self._socket.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, request)
        except OSError as error:
            self._socket.close()
            raise Unavailable(f"cannot listen for agents on {', '.join(interfaces)}: {error.strerror}") from error
        self._thread = threading.Thread(target=self._listen, name="discovery", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _listen(self) -> None:
        while True:
            try:
                data, ancillary, _, (source, _) = self._socket.recvmsg(4096, socket.CMSG_SPACE(12))
            except OSError:
                return  # closed
            index = next(
                (struct.unpack("@i", payload[:4])[0] for level, kind, payload in ancillary
                 if level == socket.IPPROTO_IP and kind == IP_PKTINFO),
                None,
            )
            if index not in self.interfaces:
                continue
            announcement = decode(data)
            if announcement is None:
                log.debug("ignored a datagram from %s that is no agent announcement", source)
                continue
            host = source if announcement.host in UNSPECIFIED_HOSTS else announcement.host
            sighting = Sighting(host, announcement.port, self.interfaces[index], announcement.serial, time.monotonic())
            with self._lock:
                self._sightings[(sighting.host, sighting.port)] = sighting

    def sightings(self) -> list[Sighting]:
        with self._lock:
            return sorted(self._sightings.values(), key=lambda s: (s.host, s.port))

    def stop(self) -> None:
        self._socket.close()
