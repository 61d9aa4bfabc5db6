"""Agents announce themselves by multicast, so a controller listening for them can add them.

Every `interval` seconds each machine this process serves sends one small JSON datagram to the
discovery group: the host and port its agent listens on and the machine's serial. A machine
that is playing dead (a simulated fault) stays quiet.
"""

from __future__ import annotations

import logging
import socket
import threading

from vipu.api.announcements import DISCOVERY_GROUP, DISCOVERY_PORT, Announcement, encode
from vipu.backends.base import MachineBackend
from vipu.model.errors import VipuError

log = logging.getLogger(__name__)


class Announcer(threading.Thread):
    def __init__(self, machines: list[tuple[MachineBackend, str, int]], interval: float, group: str = DISCOVERY_GROUP,
                 port: int = DISCOVERY_PORT, source: str | None = None):
        super().__init__(name="announcer", daemon=True)
        self.machines = machines  # (backend, host, port)
        self.interval = interval
        self.target = (group, port)
        self.stopping = threading.Event()
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
        self.socket.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
        self.socket.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        if source:
            # Send from this interface address rather than the one of the default route.
            self.socket.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(source))

    def run(self) -> None:
        while True:
            for backend, host, port in self.machines:
                try:
                    if not backend.silent():
                        self.socket.sendto(encode(Announcement(host, port, backend.inventory().serial)), self.target)
                except (OSError, VipuError) as error:  # a lost announcement is retried at the next interval
                    log.warning("announcement of %s:%s failed: %s", host, port, error)
            if self.stopping.wait(self.interval):
                return

    def stop(self) -> None:
        self.stopping.set()
        self.socket.close()
