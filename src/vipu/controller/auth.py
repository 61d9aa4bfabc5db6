"""Who is calling: checked once per call by the end-points' interceptor, read by the servicers.

In open mode every caller may do everything. In secure mode the caller's user id and access key
(`vipu.api.credentials`) must match a user; the admin end-point answers administrators only.
The version service answers anyone who got through mutual TLS. A call that proves it comes from
a holder of the server key (the dashboard) may say whose address it is made for; failed logins
are then counted against that address.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

from vipu.api.credentials import ACCESS_KEY_KEY, FORWARDED_FOR_KEY, FORWARDING_PROOF_KEY, USER_ID_KEY, forwarded_for
from vipu.api.status import RateLimitedLog
from vipu.controller.usecases.users import UserService
from vipu.model.entities import OPEN_ACCESS, Access

_caller: ContextVar[Access] = ContextVar("vipu_caller", default=OPEN_ACCESS)

UNAUTHENTICATED_METHODS = ("/virmgrpc.VersionService/GetVersion",)


def caller() -> Access:
    """The caller of the request being handled."""
    return _caller.get()


class Authenticator:
    def __init__(self, users: UserService | None, admin_only: bool, forwarding_proof: str | None = None):
        self.users = users  # None: open mode
        self.admin_only = admin_only
        self.forwarding_proof = forwarding_proof  # None: no caller may speak for another address
        self.unproven_log = RateLimitedLog()

    @contextmanager
    def __call__(self, method: str, metadata: Mapping[str, str], peer: str = "") -> Iterator[None]:
        if self.users is None or method in UNAUTHENTICATED_METHODS:
            access = OPEN_ACCESS
        else:
            access = self.users.authenticate(metadata.get(USER_ID_KEY, ""), metadata.get(ACCESS_KEY_KEY, ""), self.admin_only,
                                             peer, self._forwarded_for(metadata, peer))
        token = _caller.set(access)
        try:
            yield
        finally:
            _caller.reset(token)

    def _forwarded_for(self, metadata: Mapping[str, str], peer: str) -> str:
        """The address the call is made for, if it proves it may say so. A call saying so without
        the proof counts by its own address, and is logged: a forgery, or a dashboard given another
        server key than this controller's."""
        address = forwarded_for(dict(metadata), self.forwarding_proof)
        if not address and (FORWARDED_FOR_KEY in metadata or FORWARDING_PROOF_KEY in metadata):
            self.unproven_log.warning("a call from %s said whose address it was made for, without this controller's proof "
                                      "or a valid address; its logins count by its own address", peer or "?")
        return address
