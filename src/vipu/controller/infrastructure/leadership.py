"""One leader among the vipu-server replicas that share a store (`vipu-server --ha`).

Each replica claims the store's lease again and again; the one holding it leads, the others stand
by and refuse requests, saying where the leader is. The leader renews the lease three times per
lease period. If it cannot renew in time (the store is unreachable, or another replica took
over) it is deposed: it stops admitting requests at once, and the store refuses its writes from
the moment another replica holds the lease (`Store.fence`). A standby takes over once the lease
has run out by the database's clock, or at once when the leader stops cleanly and releases it.

The leader's own deadline is counted from before the claim that won it, on its own monotonic
clock, so it always stops leading before any standby can start.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable

from vipu.model.errors import Standby, VipuError
from vipu.store.store import Store

log = logging.getLogger(__name__)

LEASE_NAME = "vipu-server-leader"


class Leadership:
    def __init__(self, store: Store, address: str, lease_seconds: float,
                 on_elected: Callable[[], None], on_deposed: Callable[[str], None]):
        """`on_elected` runs in a thread of its own once the lease is won; `on_deposed(reason)` once it is lost."""
        self.store = store
        self.address = address
        self.lease_seconds = lease_seconds
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self._valid_until = 0.0  # monotonic; 0: not leading
        self._term = 0
        self._serving = threading.Event()  # leading, and ready to serve
        self._leader_address = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="leadership", daemon=True)

    @property
    def leading(self) -> bool:
        return time.monotonic() < self._valid_until

    @property
    def ready(self) -> bool:
        """Whether this replica leads and serves: what a load balancer's readiness check asks."""
        return self._serving.is_set() and self.leading

    def start(self) -> None:
        self._thread.start()

    def serving(self) -> None:
        """The elected leader has taken over (recovered its state) and may admit requests."""
        self._serving.set()

    def admit(self) -> None:
        """Raise `Standby` unless this replica leads and serves."""
        if self.ready:
            return
        if self.leading:
            raise Standby("this vipu-server has just been elected leader and is taking over; try again in a moment", self.address)
        where = f"the leader is at {self._leader_address}" if self._leader_address else "no leader is known yet"
        raise Standby(f"this vipu-server is a standby replica; {where}", self._leader_address)

    def stop(self) -> None:
        """Stop claiming; a leader releases the lease so that a standby takes over without waiting."""
        self._stop.set()
        self._thread.join(timeout=self.lease_seconds)
        if self.leading:
            self._valid_until = 0.0
            try:
                self.store.release_lease(LEASE_NAME, self.holder)
                log.info("released the lead")
            except VipuError as error:
                log.warning("could not release the lead: %s", error.message)

    def _keep(self) -> None:
        renew_every = self.lease_seconds / 3
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                lease = self.store.claim_lease(LEASE_NAME, self.holder, self.address, self.lease_seconds)
            except VipuError as error:
                lease = None
                log.warning("cannot claim or renew the lead: %s", error.message)
            if lease is not None and lease.holder == self.holder:
                first = self._valid_until == 0.0
                if not first and lease.term != self._term:  # it lapsed, another led, and it came back to us
                    self._depose(f"the lead changed hands while this replica could not renew it (term {self._term} to {lease.term})")
                    return
                self._valid_until, self._term = started + self.lease_seconds, lease.term
                self._leader_address = self.address
                if first:
                    self.store.fence(lease)
                    log.info("elected leader (term %d)", lease.term)
                    threading.Thread(target=self._on_elected, name="take-over", daemon=True).start()
            elif self._valid_until:
                reason = (f"the lead passed to {lease.address or lease.holder}" if lease is not None
                          else "the lease could not be renewed")
                if lease is not None or not self.leading:
                    self._depose(reason)
                    return
            elif lease is not None:
                self._leader_address = lease.address if lease.remaining > 0 else ""
            self._stop.wait(renew_every if self._valid_until else min(1.0, renew_every))

    def _depose(self, reason: str) -> None:
        self._valid_until = 0.0
        self._serving.clear()
        log.error("no longer the leader: %s", reason)
        self._on_deposed(reason)
