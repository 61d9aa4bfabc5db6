"""One leader among the vipu-server replicas that share a store (`vipu-server --ha`).

Each replica claims the store's lease again and again; the one holding it leads, the others stand
by and refuse requests, saying where the leader is. The leader renews the lease five times per
lease period, each claim bounded by a fifth of it (a stalled database fails it in time for the
next). A standby takes over once the lease has run out by the database's clock, or at once when
the leader stops cleanly and releases it.

The leader's own deadlines are counted from before the last claim that renewed it, on its own
monotonic clock, so that it stops before any standby can start:

- past ACTING_SHARE of the lease unrenewed it stops admitting requests (a database stall);
  renewed in the same term before the lease runs out, it goes on, so a stall shorter than the
  lease changes no leader;
- once the lease may have run out, or another replica holds it, it is deposed: its owners stop,
  the store refuses its writes from the moment another replica holds the lease (`Store.fence`),
  and its agents refuse its calls once the next leader has called them (the term goes with every
  agent call: `GrpcAgentGateway.epoch`);
- each claim runs on a thread of its own: one the store holds past its deadline (a paused server
  or a cut network, which no server-side timeout answers) does not hold the loop, which goes on
  waiting for it and deposes the leader only once the lease may have run out;
- a watchdog deposes it if its loop itself is held past half a lease (a starved process, a log
  that cannot be written), as the loop could not.
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
from vipu.store.leases import Lease
from vipu.store.store import Store

log = logging.getLogger(__name__)

LEASE_NAME = "vipu-server-leader"
ACTING_SHARE = 0.6  # of the lease, unrenewed, after which the leader admits no more requests until it renews
RENEWALS = 5  # claims per lease period, each bounded by one period's share
SLOW_RENEWAL_SHARE = 0.1  # a renewal taking longer than this share of the lease is warned of: the lease is short for the store


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
        self._valid_until = 0.0  # monotonic: when the lease may run out, unrenewed; 0: not leading
        self._renewed = 0.0  # monotonic: when the claim that last renewed it began
        self._beat = time.monotonic()  # when the loop last went round, which the watchdog looks at
        self._deposed = False
        self._term = 0
        self._serving = threading.Event()  # leading, and ready to serve
        self._leader_address = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="leadership", daemon=True)
        self.on_claim: Callable[[float], None] = lambda seconds: None  # told how long each claim that returned took

    @property
    def leading(self) -> bool:
        """Whether it leads and acts now: renewed within ACTING_SHARE of the lease."""
        return bool(self._valid_until) and time.monotonic() < self._renewed + ACTING_SHARE * self.lease_seconds

    @property
    def ready(self) -> bool:
        """Whether this replica leads and serves: what a load balancer's readiness check asks."""
        return self._serving.is_set() and self.leading

    def start(self) -> None:
        self._thread.start()
        threading.Thread(target=self._watch, name="leadership-watchdog", daemon=True).start()

    def _watch(self) -> None:
        """Depose a leader whose loop is held past half a lease: it can neither renew nor see it lapse."""
        while not self._stop.wait(self.lease_seconds / 10):
            held = time.monotonic() - self._beat
            if self._valid_until and not self._deposed and held > self.lease_seconds / 2:
                self._depose(f"its lease loop was held for {held:.1f} s, past half its lease of {self.lease_seconds:g} s")
                return

    def serving(self) -> None:
        """The elected leader has taken over (recovered its state) and may admit requests."""
        self._serving.set()

    def admit(self) -> None:
        """Raise `Standby` unless this replica leads and serves."""
        if self.ready:
            return
        if self.leading:
            raise Standby("this vipu-server has just been elected leader and is taking over; try again in a moment", self.address)
        if self._valid_until:
            unrenewed = time.monotonic() - self._renewed
            raise Standby(f"this vipu-server leads but has not renewed its lease for {unrenewed:.1f} s (the store is slow); "
                          "try again in a moment", self.address)
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

    def _claim(self, deadline_seconds: float) -> Lease | None:
        try:
            return self.store.claim_lease(LEASE_NAME, self.holder, self.address, self.lease_seconds, deadline_seconds)
        except VipuError as error:
            log.warning("cannot claim or renew the lead: %s", error.message)
            return None

    def _keep(self) -> None:
        renew_every = self.lease_seconds / RENEWALS
        claim: _Claim | None = None
        while not self._stop.is_set() and not self._deposed:
            self._beat = time.monotonic()
            claim = claim or _Claim(lambda: self._claim(renew_every))
            if not claim.wait(renew_every):  # held by the store, past its deadline (a paused server, a cut network)
                self._beat = time.monotonic()
                if self._valid_until and time.monotonic() >= self._valid_until:
                    self._depose(f"the lease could not be renewed within {self.lease_seconds:g} s")
                    return
                continue  # it goes on waiting for that claim: the lease holds until it may have run out
            started, lease = claim.started, claim.outcome()
            claim = None
            took = time.monotonic() - started
            self._beat = time.monotonic()
            if lease is not None:
                self.on_claim(took)
            if self._deposed:
                return  # the watchdog deposed it meanwhile
            if lease is not None and lease.holder == self.holder:
                first = self._valid_until == 0.0
                if not first and lease.term != self._term:  # it lapsed, another led, and it came back to us
                    self._depose(f"the lead changed hands while this replica could not renew it (term {self._term} to {lease.term})")
                    return
                if took > SLOW_RENEWAL_SHARE * self.lease_seconds:
                    log.warning("renewing the lead took %.2f s, over a tenth of the lease of %g s: a lease of at least %g s "
                                "suits this store (--ha-lease-seconds)", took, self.lease_seconds, 10 * took)
                self._renewed, self._valid_until, self._term = started, started + self.lease_seconds, lease.term
                self._leader_address = self.address
                if first:
                    self.store.fence(lease)
                    log.info("elected leader (term %d)", lease.term)
                    threading.Thread(target=self._on_elected, name="take-over", daemon=True).start()
            elif self._valid_until:
                if lease is not None:
                    self._depose(f"the lead passed to {lease.address or lease.holder}")
                    return
                if time.monotonic() >= self._valid_until:  # it may have run out: a standby may take over from now on
                    self._depose(f"the lease could not be renewed within {self.lease_seconds:g} s")
                    return
            elif lease is not None:
                self._leader_address = lease.address if lease.remaining > 0 else ""
            # Claims start every fifth of the lease whatever each took: a stalled claim is tried again at once.
            self._stop.wait(max(0.0, renew_every - took) if self._valid_until else min(1.0, renew_every))

    def _depose(self, reason: str) -> None:
        if self._deposed:
            return
        self._deposed = True
        self._valid_until = 0.0
        self._serving.clear()
        log.error("no longer the leader: %s", reason)
        self._on_deposed(reason)


class _Claim:
    """One claim of the lease, made on a thread of its own: a store that holds it past its deadline
    (a paused server, a network cut, where a server-side timeout cannot answer) holds that thread,
    while the lease loop goes on and sees the lease run out in time."""

    def __init__(self, claim: Callable[[], Lease | None]):
        self.started = time.monotonic()
        self._claim = claim
        self._lease: Lease | None = None
        self._error: Exception | None = None
        self._done = threading.Event()
        threading.Thread(target=self._run, name="lease-claim", daemon=True).start()

    def _run(self) -> None:
        try:
            self._lease = self._claim()
        except Exception as error:  # noqa: BLE001 - raised again in the loop, which fails as it did when it claimed itself
            self._error = error
        finally:
            self._done.set()

    def wait(self, seconds: float) -> bool:
        return self._done.wait(seconds)

    def outcome(self) -> Lease | None:
        if self._error is not None:
            raise self._error
        return self._lease
