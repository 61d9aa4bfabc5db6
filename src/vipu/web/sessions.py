"""Who is looking: in open mode everyone sees everything, as the open API lets them; in secure
mode a person logs in with a user id and access key, which the controller checks.

The dashboard holds no users of its own. A login is accepted when the controller accepts the
key on the user end-point (a wrong one is refused there, costs its scrypt, and counts towards the
controller's lockout of that user from the browser's address, which the dashboard forwards with
the proof that it holds the server key), and the viewer is an
administrator when the admin end-point answers them too. The session's id, 256 random bits, is
the browser's only token; the key stays in this process's memory with the viewer's `Source`,
which the sessions of one user and key share, and is forgotten when their last session ends; a
key the controller refuses (replaced, or its user removed) ends its sessions at once.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
from dataclasses import dataclass, replace

from vipu.api.credentials import forwarded
from vipu.client import AdminClient, PermissionDenied, UserClient, VipuError
from vipu.client.settings import ClientSettings
from vipu.web.sources import TIMEOUT_SECONDS, Source, Viewer

log = logging.getLogger(__name__)

SESSION_SECONDS = 8 * 3600
COOKIE = "vipu_session"


@dataclass
class Session:
    source: Source
    expires: float


class Sessions:
    """Every viewer's `Source`: the one of open mode, or one per user logged in."""

    def __init__(self, settings: ClientSettings, admin_port: int, secure: bool, forwarding_proof: str = ""):
        """`forwarding_proof` (`vipu.api.tls.forwarding_proof`): logins say whose address they are for."""
        self.settings = settings
        self.admin_port = admin_port
        self.secure = secure
        self.forwarding_proof = forwarding_proof
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}
        self._sources: dict[tuple[str, bytes], Source] = {}  # (user id, key digest) -> their source
        self.open_source = None if secure else Source(settings, admin_port, Viewer("", admin=True))

    def source(self, session_id: str | None) -> Source | None:
        """The viewer's source: open mode's, or the live session's; None when they must log in."""
        if self.open_source is not None:
            return self.open_source
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            session = self._sessions.get(session_id or "")
        return session.source if session is not None and not session.source.refused else None

    def login(self, user_id: str, access_key: str, browser_address: str = "") -> str:
        """A new session's id, once the controller accepts the key; its refusal (Unauthenticated,
        or any error reaching it) otherwise."""
        settings = replace(self.settings, user_id=user_id, access_key=access_key)
        logging_in = settings
        if self.forwarding_proof and browser_address:
            logging_in = replace(settings, forwarded=forwarded(browser_address, self.forwarding_proof))
        with UserClient(logging_in, timeout=TIMEOUT_SECONDS) as user:
            user.list_allocations()
        try:
            with AdminClient(replace(logging_in, port=self.admin_port), timeout=TIMEOUT_SECONDS) as admin:
                admin.list_clusters()
            is_admin = True
        except PermissionDenied:
            is_admin = False
        except VipuError as error:  # the admin end-point fenced off from here, say: the pages of a user
            log.warning("user %s logged in, but the admin end-point did not answer: %s", user_id, error.message)
            is_admin = False
        key = (user_id, hashlib.sha256(access_key.encode()).digest())
        session_id = secrets.token_urlsafe(32)
        with self._lock:
            source = self._sources.get(key)
            if source is None or source.refused or source.viewer.admin != is_admin:
                if source is not None:
                    source.close()
                source = self._sources[key] = Source(settings, self.admin_port, Viewer(user_id, is_admin), on_refused=self._forget)
            self._sessions[session_id] = Session(source, time.monotonic() + SESSION_SECONDS)
        return session_id

    def logout(self, session_id: str | None) -> None:
        with self._lock:
            self._sessions.pop(session_id or "", None)
            self._expire(time.monotonic())

    def _forget(self, source: Source) -> None:
        """End the sessions of a source whose key the controller refuses (the source stops itself)."""
        with self._lock:
            for session_id in [s for s, session in self._sessions.items() if session.source is source]:
                del self._sessions[session_id]
            for key in [k for k, kept in self._sources.items() if kept is source]:
                del self._sources[key]

    def _expire(self, now: float) -> None:
        """Forget ended sessions, and the sources no session uses any more (the caller holds the lock)."""
        for session_id in [s for s, session in self._sessions.items() if session.expires <= now]:
            del self._sessions[session_id]
        used = {id(session.source) for session in self._sessions.values()}
        for key in [k for k, source in self._sources.items() if id(source) not in used]:
            self._sources.pop(key).close()

    def close(self) -> None:
        with self._lock:
            sources = list(self._sources.values())
            self._sessions.clear()
            self._sources.clear()
        for source in sources + ([self.open_source] if self.open_source is not None else []):
            source.close()
