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

import hashlib
import hmac
import logging
import secrets
import threading
import typing

from vipu.model.entities import Access, Role, User, check_id, quoted, shown
from vipu.model.errors import (
    Conflict,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
)
from vipu.model.throttle import LoginThrottle
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
        for lockout in self.throttle.failed(address, user_id):
            log.warning("%s", lockout)
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
