"""Which controller holds a machine: the agent obeys that one only.

On a mutual-TLS link a controller is known by the name in its certificate, which the site's
agent-link authority signed. The first controller to claim a machine (or to configure it while
nobody holds it) holds it; every other controller of the site may read its inventory but is
refused anything else, in one line naming the holder, until the holder releases the machine or
a takeover grant signed by the site's authority (`vipu.api.grants`) hands it over. A takeover
clears every partition of the machine, so nothing of the old holder stays configured.

The holder is kept in a small file so that a restarted agent still knows it. On a plaintext link
nobody is known, so nothing is held or refused: that is what secure mode is for.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import grpc

from vipu.api import grants
from vipu.model.errors import InvalidArgument, PermissionDenied

log = logging.getLogger(__name__)


def caller_of(context: grpc.ServicerContext) -> str:
    """The name in the calling controller's certificate; "" on a plaintext link."""
    names = context.auth_context().get("x509_common_name") or [b""]
    name = names[0]
    return name.decode(errors="replace") if isinstance(name, bytes) else str(name)


class MachineHold:
    """The holder of one machine, kept in `path`. `authority` is the agent link's authority
    certificate (PEM), which takeover grants must be signed by; None on a plaintext link."""

    def __init__(self, machine_name: str, path: Path | None, authority: bytes | None):
        self.machine_name = machine_name
        self.path = path
        self.authority = authority
        self._lock = threading.Lock()
        self._holder = self._load()

    @property
    def enforced(self) -> bool:
        return self.authority is not None

    @property
    def holder(self) -> str:
        with self._lock:
            return self._holder

    def _load(self) -> str:
        if self.path is None or not self.path.exists():
            return ""
        try:
            return str(json.loads(self.path.read_text())["holder"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise InvalidArgument(f"cannot read the holder of machine {self.machine_name} from {self.path} ({error}); "
                                  "remove the file only if no controller should keep the machine") from None

    def _keep(self, holder: str) -> None:
        """Record the holder, on disk first: a holder the agent would forget on restart is no holder."""
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.path.with_name(f".{self.path.name}.tmp")
            temporary.write_text(json.dumps({"holder": holder}) + "\n")
            os.replace(temporary, self.path)
        self._holder = holder

    def _refusal(self, caller: str) -> PermissionDenied:
        return PermissionDenied(
            f"machine {self.machine_name} is held by controller {self._holder}, not {caller}; it is handed over when that "
            "controller removes its agent, or by a takeover with the site's agent-link authority")

    def require(self, caller: str) -> None:
        """Let `caller` configure the machine: its holder, or the first to ask while nobody holds it."""
        if not self.enforced:
            return
        with self._lock:
            if self._holder == caller:
                return
            if self._holder:
                raise self._refusal(caller)
            self._keep(caller)
        log.info("machine %s is now held by controller %s", self.machine_name, caller)

    def claim(self, caller: str, grant: str, serial: str, clear_all: Callable[[], None]) -> str:
        """Hold the machine for `caller`; with a grant, take it from its holder, clearing every
        partition first. The previous holder after a takeover, else ""."""
        if not self.enforced:
            return ""
        if not grant:
            self.require(caller)
            return ""
        assert self.authority is not None
        grants.check(grant, self.authority, serial, caller)
        with self._lock:
            previous = self._holder
            if previous == caller:
                return ""
            clear_all()
            self._keep(caller)
        log.warning("machine %s taken over by controller %s from %s with the site's grant; its partitions were cleared",
                    self.machine_name, caller, previous or "nobody")
        return previous

    def release(self, caller: str) -> None:
        if not self.enforced:
            return
        with self._lock:
            if not self._holder:
                return
            if self._holder != caller:
                raise self._refusal(caller)
            self._keep("")
        log.info("machine %s released by controller %s", self.machine_name, caller)
