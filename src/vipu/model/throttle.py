"""Failed logins counted by address, and the lockouts they lead to: what vipu-server's end-points
and vipu-vpod's REST API share (the dashboard's logins are vipu-server's)."""

from __future__ import annotations

import collections
import threading
import time
import typing

from vipu.model.entities import quoted, shown
from vipu.model.errors import Unauthenticated


class LoginThrottle:
    """Failed logins, counted by the caller's address, with two limits within `lockout` seconds:

    - `limit` failures for one user from one address: that user is refused from that address for
      `lockout` seconds without the key being checked, so guessing one user's key is slowed while
      other users behind the same address (a NAT, the Kubernetes proxy) go on; the dashboard
      forwards each browser's address, so there the count is the browser's, not the dashboard's;
    - `address_limit` failures from one address, whatever users they named: the address is
      refused for `lockout` seconds for every user not proven from it (who logged in from it in
      the last PROVEN_SECONDS, as this process remembers), so trying many users' keys is slowed
      too. Off unless asked for: at an address many users share (a NAT, a proxy) anyone
      could lock out every user not proven there, and after a restart nobody is.

    Addresses are as `address` makes them of gRPC's peer, or `address_of` of one a front end
    forwarded; "" for none (nothing is counted). A success forgets that user's failures at that
    address. A limit of 0 turns it off. Refusals by a lockout cost no scrypt and are not logged one
    by one: `failed` says when a lockout starts, for the log. `clock` is for tests."""

    TRACKED = 10_000  # beyond this many entries, those whose time has passed are forgotten
    PROVEN_SECONDS = 24 * 3600.0

    def __init__(self, limit: int = 10, lockout: float = 60.0, address_limit: int = 0,
                 clock: typing.Callable[[], float] = time.monotonic):
        self.limit, self.lockout, self.address_limit, self.clock = limit, lockout, address_limit, clock
        self._failures: dict[tuple[str, str], collections.deque[float]] = {}  # (address, user) -> when
        self._address_failures: dict[str, collections.deque[float]] = {}
        self._locked_until: dict[tuple[str, str], float] = {}  # (address, user or "" for the whole address) -> until
        self._proven: dict[tuple[str, str], float] = {}  # (address, user) -> last success
        self._lock = threading.Lock()

    @staticmethod
    def address(peer: str) -> str:
        """gRPC's peer ('ipv4:10.0.0.5:51234', 'ipv6:[::1]:51234') without its port."""
        return peer.rpartition(":")[0] or peer

    @staticmethod
    def address_of(ip: str) -> str:
        """An IP address as `address` gives it ('ipv4:10.0.0.5', 'ipv6:[::1]'): one host, one count."""
        return f"ipv6:[{ip}]" if ":" in ip else f"ipv4:{ip}"

    def check(self, address: str, user_id: str) -> None:
        if not address:
            return
        now = self.clock()
        with self._lock:
            user_wait = self._locked_until.get((address, user_id), 0.0) - now
            address_wait = self._locked_until.get((address, ""), 0.0) - now
            proven = self._proven.get((address, user_id), -self.PROVEN_SECONDS) > now - self.PROVEN_SECONDS
        if user_wait > 0:
            raise Unauthenticated(f"too many failed logins for user {shown(user_id)} from this address; "
                                  f"try again in {user_wait:.0f} s")
        if address_wait > 0 and not proven:
            raise Unauthenticated(f"too many failed logins from this address; try again in {address_wait:.0f} s")

    def failed(self, address: str, user_id: str) -> list[str]:
        """Count a failed login; the lockouts it starts, as lines for the caller's log."""
        if not address:
            return []
        now = self.clock()
        started = []
        with self._lock:
            if self.limit and self._reaches(self._failures, (address, user_id), now, self.limit):
                self._locked_until[(address, user_id)] = now + self.lockout
                started.append(f"logins of user {quoted(user_id)} from {address} refused for {self.lockout:.0f} s "
                               f"after {self.limit} failures")
            if self.address_limit and self._reaches(self._address_failures, address, now, self.address_limit):
                self._locked_until[(address, "")] = now + self.lockout
                started.append(f"logins from {address} refused for {self.lockout:.0f} s, but for users proven from there, "
                               f"after {self.address_limit} failures")
            if len(self._failures) + len(self._address_failures) + len(self._proven) > self.TRACKED:
                self._forget_expired(now)
        return started

    def _reaches(self, failures: dict[typing.Any, collections.deque[float]], key: typing.Hashable, now: float, limit: int) -> bool:
        """Record a failure under `key`: does it make `limit` within the lockout? Then the count
        starts again, so that a lockout starts (and is logged) once per `limit` failures."""
        recent = failures.setdefault(key, collections.deque())
        recent.append(now)
        while recent and recent[0] <= now - self.lockout:
            recent.popleft()
        if len(recent) < limit:
            return False
        recent.clear()
        return True

    def succeeded(self, address: str, user_id: str) -> None:
        if not address:
            return
        with self._lock:
            self._failures.pop((address, user_id), None)
            if self.address_limit:  # who is proven where matters only to the address lockout
                self._proven[(address, user_id)] = self.clock()

    def _forget_expired(self, now: float) -> None:
        stale = now - self.lockout
        self._failures = {key: times for key, times in self._failures.items() if times and times[-1] > stale}
        self._address_failures = {key: times for key, times in self._address_failures.items() if times and times[-1] > stale}
        self._locked_until = {key: until for key, until in self._locked_until.items() if until > now}
        self._proven = {key: when for key, when in self._proven.items() if when > now - self.PROVEN_SECONDS}
