"""Which controller holds a machine: the agent obeys that one only.

On a mutual-TLS link a controller is known by the name in its certificate, which the site's
agent-link authority signed. The first controller to claim a machine (registering its agent, or
configuring it while nobody holds it) holds it. Every other controller of the site may read the
machine's inventory but is refused anything else, in one line naming the holder, until the
holder releases the machine or a takeover grant signed by the site's authority
(`vipu.api.grants`) hands it over. A free machine may be listed, cleared and tested by any
controller of the site; only configuring it claims it.

A takeover waits for the operations under way to end (refusing new ones meanwhile), then clears
every partition of the machine, so nothing the old holder applied stays configured; each grant
is used once (and expires within a minute).

The holder, and the grants used that have not expired, are kept in a file so that a restarted
agent still knows them. On a plaintext link nobody is known, so nothing is held or refused: that
is what secure mode is for.

Fencing, on any link: replicas of a highly available controller send their lease's term with
every call (the epoch). A call of an older epoch than the newest this machine has obeyed comes
from a deposed leader (sent before it knew, or raced its stop) and is refused, in one line in the
log: it must not land after the new leader's clear. The newest epoch is kept in the same file. A
call with no epoch (a controller without replicas) is not fenced.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc

from vipu.api import grants
from vipu.api.atomic import write_file
from vipu.api.channels import LEADER_EPOCH_KEY
from vipu.model.errors import InvalidArgument, PermissionDenied, Unavailable

log = logging.getLogger(__name__)

TAKEOVER_WAIT_SECONDS = 30.0  # for the holder's operations under way to end before a takeover clears the machine


def caller_of(context: grpc.ServicerContext) -> str:
    """The name in the calling controller's certificate; "" on a plaintext link."""
    names = context.auth_context().get("x509_common_name") or [b""]
    name = names[0]
    return name.decode(errors="replace") if isinstance(name, bytes) else str(name)


def epoch_of(context: grpc.ServicerContext) -> int:
    """The calling leader's lease term, from the call's metadata; 0 when none is sent (or it is no number)."""
    for key, value in context.invocation_metadata() or ():
        if key == LEADER_EPOCH_KEY:
            return int(value) if str(value).isdigit() else 0
    return 0


class MachineHold:
    """The holder of one machine, kept in `path`. `authority` is the agent link's authority
    certificate (PEM), which takeover grants must be signed by; None on a plaintext link."""

    def __init__(self, machine_name: str, path: Path | None, authority: bytes | None):
        self.machine_name = machine_name
        self.path = path
        self.authority = authority
        self._changed = threading.Condition()
        self._holder, self._used_grants, self._epoch = self._load()  # used grants: their SHA-256 -> when they expire
        self._active = 0  # operations under way, which a takeover waits for
        self._taking = False  # a takeover is under way: nothing new starts

    @property
    def enforced(self) -> bool:
        return self.authority is not None

    @property
    def holder(self) -> str:
        with self._changed:
            return self._holder

    def _load(self) -> tuple[str, dict[str, float], int]:
        if self.path is None or not self.path.exists():
            return "", {}, 0
        try:
            kept = json.loads(self.path.read_text())
            holder, used, epoch = kept["holder"], kept.get("used_grants", {}), int(kept.get("epoch", 0))
            if not isinstance(holder, str):
                raise TypeError(f"the holder is {holder!r}, not a name")
            return holder, {str(grant): float(expires) for grant, expires in used.items()}, epoch
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise InvalidArgument(f"cannot read the holder of machine {self.machine_name} from {self.path} ({error}); "
                                  "remove the file only if no controller should keep the machine") from None

    def _keep(self, holder: str) -> None:
        """Record the holder and the grants used, on disk first: a holder the agent would forget on
        restart is no holder, and a used grant it would forget could be used again."""
        if self.path is not None:
            try:
                write_file(self.path, (json.dumps({"holder": holder, "used_grants": self._used_grants, "epoch": self._epoch})
                                       + "\n").encode())
            except OSError as error:
                raise Unavailable(f"cannot record the holder of machine {self.machine_name} in {self.path}: "
                                  f"{error.strerror or error}") from None
        self._holder = holder

    def _refusal(self, caller: str) -> PermissionDenied:
        return PermissionDenied(
            f"machine {self.machine_name} is held by controller {self._holder}, not {caller}; it is handed over when that "
            "controller removes its agent, or by a takeover with the site's agent-link authority")

    def _admit(self, caller: str, claim: bool) -> None:
        """Under the lock: may `caller` go on (claiming a free machine if `claim`)?"""
        if not caller:
            raise PermissionDenied("a controller whose certificate names nobody is obeyed by no machine")
        if self._taking:
            raise Unavailable(f"machine {self.machine_name} is being handed to another controller; try again")
        if self._holder == caller:
            return
        if self._holder:
            raise self._refusal(caller)
        if claim:
            self._keep(caller)
            log.info("machine %s is now held by controller %s", self.machine_name, caller)

    def _fence(self, epoch: int, caller: str) -> None:
        """Under the lock: refuse a call of a leader older than the newest obeyed; remember a newer one."""
        if not epoch or epoch == self._epoch:
            return
        if epoch < self._epoch:
            log.warning("machine %s: refused a call of controller %s from leader epoch %d: epoch %d leads now (a deposed leader's "
                        "late call)", self.machine_name, caller or "(plaintext)", epoch, self._epoch)
            raise PermissionDenied(f"machine {self.machine_name} obeys the leader of epoch {self._epoch} now, not one of epoch {epoch} "
                                   "(this controller was deposed)")
        self._epoch = epoch
        self._keep(self._holder)
        log.info("machine %s: obeys the leader of epoch %d from now on", self.machine_name, epoch)

    @contextmanager
    def obeying(self, caller: str, claim: bool = False, epoch: int = 0) -> Iterator[None]:
        """Around one operation of `caller` (leader of `epoch`, 0 if it has no replicas): refused
        if a newer leader was obeyed, or, on a mutual-TLS link, unless it holds the machine or the
        machine is free (which `claim` then makes it hold). A takeover waits for the operation to end."""
        if not self.enforced:
            with self._changed:
                self._fence(epoch, caller)
            yield
            return
        with self._changed:
            self._fence(epoch, caller)
            self._admit(caller, claim)
            self._active += 1
        try:
            yield
        finally:
            with self._changed:
                self._active -= 1
                self._changed.notify_all()

    def claim(self, caller: str, grant: str, serial: str, clear_all: Callable[[], None]) -> str:
        """Hold the machine for `caller`; with a grant, take it from its holder, clearing every
        partition first. The previous holder after a takeover, else ""."""
        if not self.enforced:
            return ""
        if not grant:
            with self._changed:
                self._admit(caller, claim=True)
            return ""
        assert self.authority is not None
        expires = grants.check(grant, self.authority, serial, caller)
        used = hashlib.sha256(grant.encode()).hexdigest()
        with self._changed:
            now = time.time()
            self._used_grants = {g: e for g, e in self._used_grants.items() if e > now}
            if used in self._used_grants:
                raise PermissionDenied("the takeover grant was used already; each grant hands a machine over once")
            if self._taking:
                raise Unavailable(f"machine {self.machine_name} is being handed to another controller; try again")
            self._taking = True
        try:
            with self._changed:
                if not self._changed.wait_for(lambda: self._active == 0, timeout=TAKEOVER_WAIT_SECONDS):
                    raise Unavailable(f"machine {self.machine_name} is busy with {self._active} operation(s) of controller "
                                      f"{self._holder}; try the takeover again")
                previous = self._holder
            clear_all()  # outside the lock, nothing else admitted meanwhile
            with self._changed:
                self._used_grants[used] = expires
                try:
                    self._keep(caller)
                except Unavailable:  # not recorded: the machine is cleared, but the grant may take it yet
                    del self._used_grants[used]
                    raise
        finally:
            with self._changed:
                self._taking = False
                self._changed.notify_all()
        log.warning("machine %s taken over by controller %s from %s with the site's grant; its partitions were cleared",
                    self.machine_name, caller, previous or "nobody")
        return "" if previous == caller else previous

    def release(self, caller: str) -> None:
        if not self.enforced:
            return
        with self._changed:
            if not self._holder:
                return
            if self._holder != caller:
                raise self._refusal(caller)
            self._keep("")
        log.info("machine %s released by controller %s", self.machine_name, caller)
