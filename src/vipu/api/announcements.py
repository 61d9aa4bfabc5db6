"""The agents' multicast announcement: one small JSON datagram, shared by agent and controller."""

from __future__ import annotations

import json
from dataclasses import dataclass

from vipu import __version__

DISCOVERY_GROUP = "239.255.77.77"
DISCOVERY_PORT = 5707
KIND = "vipu-agent"


@dataclass(frozen=True)
class Announcement:
    host: str  # where the agent listens; empty or 0.0.0.0 when it listens on every address
    port: int
    serial: str


def encode(announcement: Announcement) -> bytes:
    return json.dumps({"kind": KIND, "host": announcement.host, "port": announcement.port,
                       "serial": announcement.serial, "version": __version__}).encode()


def decode(data: bytes) -> Announcement | None:
    """The announcement in a datagram, or None if it is not a well-formed one."""
    try:
        message = json.loads(data)
        if not isinstance(message, dict) or message.get("kind") != KIND:
            return None
        port = message["port"]
        if not isinstance(port, int) or not 1 <= port <= 65535:
            return None
        return Announcement(str(message.get("host", "")), port, str(message.get("serial", "")))
    except (ValueError, KeyError, TypeError):
        return None
