"""Users of secure mode: who they are, which allocations they may use, and their access keys.

An access key is shown once, when it is made, and stored only as a salted scrypt hash. Checking
one costs tens of milliseconds, so a successful check is remembered in memory by the key's
SHA-256 and the credential's version; rotating or removing a key changes the version and so
forgets it. Only a key that matches what is remembered takes that short cut: every refusal costs
a full scrypt, for an unknown user too (against a decoy credential), so that neither a user's
existence nor a wrong key shows in the time an answer takes. Refusals are logged (the user id,
never the key); keys are never logged.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import logging
import secrets
import threading
import time
import typing

from vipu.model.entities import Access, Role, User, check_id, quoted, shown
from vipu.model.errors import (
    Conflict,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
)
from vipu.store.store import Credential, Store

log = logging.getLogger(__name__)

SCRYPT = {"n": 2**14, "r": 8, "p": 1, "dklen": 32}


def new_key() -> str:
    return secrets.token_urlsafe(16)


def digest(key: str, salt: bytes) -> bytes:
    return hashlib.scrypt(key.encode(), salt=salt, **SCRYPT)


def credential_for(key: str, version: int) -> Credential:
    salt = secrets.token_bytes(16)
    return Credential(salt, digest(key, salt), version)


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
    by one: the log says when a lockout starts. `clock` is for tests."""

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

    def failed(self, address: str, user_id: str) -> None:
        if not address:
            return
        now = self.clock()
        with self._lock:
            if self.limit and self._reaches(self._failures, (address, user_id), now, self.limit):
                self._locked_until[(address, user_id)] = now + self.lockout
                log.warning("logins of user %s from %s refused for %.0f s after %d failures", quoted(user_id), address,
                            self.lockout, self.limit)
            if self.address_limit and self._reaches(self._address_failures, address, now, self.address_limit):
                self._locked_until[(address, "")] = now + self.lockout
                log.warning("logins from %s refused for %.0f s, but for users proven from there, after %d failures",
                            address, self.lockout, self.address_limit)
            if len(self._failures) + len(self._address_failures) + len(self._proven) > self.TRACKED:
                self._forget_expired(now)

    def _reaches(self, failures: dict, key, now: float, limit: int) -> bool:
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


class UserService:
    def __init__(self, store: Store, throttle: LoginThrottle | None = None,
                 count_refusal: typing.Callable[[str], None] = lambda reason: None):
        """`count_refusal(reason)` is told of each refused login, for a metric."""
        self.store = store
        self.throttle = throttle or LoginThrottle()
        self.count_refusal = count_refusal
        self._verified: dict[str, tuple[int, bytes]] = {}  # user -> (credential version, SHA-256 of its key)
        self._decoy = credential_for(new_key(), 0)  # what an unknown user's key is checked against
        self._lock = threading.Lock()

    def create(self, user_id: str, allocation_ids: tuple[str, ...] = (), admin: bool = False) -> tuple[User, str]:
        """A new user and their access key, which is shown only now."""
        check_id("user", user_id)
        key = new_key()
        user = User(user_id, Role.ADMIN if admin else Role.USER, tuple(sorted(set(allocation_ids))))
        with self.store.transaction() as tx:
            self._check_allocations(tx, allocation_ids)
            tx.add_user(user, credential_for(key, 1))
        return user, key

    def list(self) -> list[User]:
        with self.store.reading() as tx:
            return tx.list_users()

    def get(self, user_id: str) -> User:
        with self.store.reading() as tx:
            user = tx.get_user(user_id)
        if user is None:
            raise NotFound(f"user {shown(user_id)} does not exist")
        return user

    def update(self, user_id: str, give: tuple[str, ...] = (), deny: tuple[str, ...] = (), rotate: bool = False) -> tuple[User, str]:
        """Give or deny allocations and perhaps make a new key; the user, and the new key or ""."""
        both = set(give) & set(deny)
        if both:
            raise InvalidArgument(f"allocation {sorted(both)[0]} is both given and denied")
        key = ""
        with self.store.transaction() as tx:
            user = tx.get_user(user_id)
            if user is None:
                raise NotFound(f"user {shown(user_id)} does not exist")
            self._check_allocations(tx, give)
            unknown = [a for a in deny if a not in user.allocation_ids]
            if unknown:
                raise InvalidArgument(f"allocation {unknown[0]} is not given to user {user_id}")
            allocations = tuple(sorted((set(user.allocation_ids) | set(give)) - set(deny)))
            tx.set_user_allocations(user_id, allocations)
            user.allocation_ids = allocations
            if rotate:
                key = new_key()
                current = tx.get_credential(user_id)
                if current is None:  # not while the user exists: the credential is on the user's row
                    raise NotFound(f"user {shown(user_id)} does not exist")
                tx.set_credential(user_id, credential_for(key, current.version + 1))
        return user, key

    def remove(self, user_id: str) -> None:
        with self.store.transaction() as tx:
            user = tx.get_user(user_id)
            if user is None:
                raise NotFound(f"user {shown(user_id)} does not exist")
            if user.role is Role.ADMIN and sum(u.role is Role.ADMIN for u in tx.list_users()) == 1:
                raise Conflict(f"user {user_id} is the last administrator")
            tx.delete_user(user_id)
        with self._lock:
            self._verified.pop(user_id, None)

    def has_administrator(self) -> bool:
        with self.store.reading() as tx:
            return any(u.role is Role.ADMIN for u in tx.list_users())

    def authenticate(self, user_id: str, key: str, admin_only: bool = False, peer: str = "", forwarded_for: str = "") -> Access:
        """What the holder of this key may do; Unauthenticated or PermissionDenied otherwise. `peer`
        is the caller's address as gRPC gives it, for the log and the throttle of failed logins;
        `forwarded_for`, the address a trusted front end (the dashboard) made the call for, is
        counted by the throttle instead."""
        if not user_id or not key:
            self.count_refusal("no credentials")
            raise Unauthenticated("this controller runs in secure mode: give a user id and access key")
        address = LoginThrottle.address_of(forwarded_for) if forwarded_for else LoginThrottle.address(peer) if peer else ""
        caller = f"{address} through {peer}" if forwarded_for else peer or "?"
        try:
            self.throttle.check(address, user_id)
        except Unauthenticated:
            self.count_refusal("locked out")
            raise
        with self.store.reading() as tx:
            user = tx.get_user(user_id)
            credential = tx.get_credential(user_id)
        if user is None or credential is None:
            self._matches("", key, self._decoy)  # as long as a known user's wrong key takes
            self._refuse(user_id, "no such user", caller, address)
        if not self._matches(user_id, key, credential):
            self._refuse(user_id, "wrong access key", caller, address)
        self.throttle.succeeded(address, user_id)
        if user.role is Role.ADMIN:
            return Access(user.id, None)
        if admin_only:
            raise PermissionDenied(f"user {user.id} is not an administrator; the admin end-point answers administrators only")
        return Access(user.id, frozenset(user.allocation_ids))

    def _refuse(self, user_id: str, reason: str, caller: str, address: str) -> typing.NoReturn:
        log.warning("authentication of user %s from %s refused: %s", quoted(user_id), caller, reason)
        self.count_refusal("invalid credentials")  # never which: the metrics end-point checks nobody
        self.throttle.failed(address, user_id)
        raise Unauthenticated(f"invalid user id or access key for user {shown(user_id)}")

    def _matches(self, user_id: str, key: str, credential: Credential) -> bool:
        fingerprint = hashlib.sha256(key.encode()).digest()
        with self._lock:
            remembered = self._verified.get(user_id)
        if remembered is not None and remembered[0] == credential.version and hmac.compare_digest(remembered[1], fingerprint):
            return True
        if not hmac.compare_digest(digest(key, credential.salt), credential.digest):
            return False
        with self._lock:
            self._verified[user_id] = (credential.version, fingerprint)
        return True

    @staticmethod
    def _check_allocations(tx, allocation_ids) -> None:
        for allocation_id in allocation_ids:
            if tx.get_allocation(allocation_id) is None:
                raise NotFound(f"allocation {shown(allocation_id)} does not exist")
