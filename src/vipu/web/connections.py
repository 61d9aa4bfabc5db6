"""The dashboard's connections, bounded: uvicorn's HTTP/1.1 protocol with three guards it lacks.

uvicorn closes a keep-alive connection that sends nothing after a response, but never one that
sends nothing, or a request's head a byte at a time, from the start; each open TLS connection
costs the process about 300 KB. So:

- a connection has HEAD_SECONDS to send a whole request head, from its start and again after
  each response, or it is closed;
- one address holds at most PER_ADDRESS connections; more are closed at once;
- the process holds at most MOST connections; one more closes the connection that has waited
  longest for a head (idle, or slow), and only if none waits, the new one, so that idle
  connections cannot keep a browser out.

A request under way (the live view's stream, a page being sent) is never cut by these.
"""

from __future__ import annotations

import asyncio
import logging
import time

from uvicorn.protocols.http.h11_impl import H11Protocol

from vipu.api.status import RateLimitedLog

log = logging.getLogger(__name__)

HEAD_SECONDS = 10.0
PER_ADDRESS = 32
MOST = 256
REFUSALS_LOGGED_EVERY_SECONDS = 10.0


REFUSALS_LOG = RateLimitedLog(REFUSALS_LOGGED_EVERY_SECONDS, logger=log)


class GuardedH11Protocol(H11Protocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.head_since: float | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        host = _address(self)
        if sum(1 for other in self.connections if _address(other) == host) > PER_ADDRESS:
            self.refuse(f"{host} holds {PER_ADDRESS} connections already")
            return
        self._await_head()
        if len(self.connections) > MOST:
            waiting = [c for c in self.connections if isinstance(c, GuardedH11Protocol) and c.head_since is not None and c is not self]
            longest = min(waiting, key=lambda c: c.head_since or 0.0, default=self)
            longest.refuse(f"{MOST} connections are open; this one waited longest for a request")

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request's head came whole: it is served, however long it takes
            self._cancel_head_timer()
            self.head_since = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._await_head()  # the next request's head is due as the first's was

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _await_head(self) -> None:
        self._cancel_head_timer()
        self.head_since = time.monotonic()
        self._head_timer = self.loop.call_later(HEAD_SECONDS, self._head_late)

    def _cancel_head_timer(self) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.abort()  # at once: a TLS close would wait for the peer to answer it

    def refuse(self, why: str) -> None:
        """Close this connection at once, saying why in the log (at a bounded rate)."""
        self._cancel_head_timer()
        self.head_since = None
        self.transport.abort()
        REFUSALS_LOG.warning("a connection from %s closed: %s", _address(self) or "?", why)

def _address(connection: object) -> str:
    """The address a connection comes from ('' when the transport does not say)."""
    client = getattr(connection, "client", None)
    return str(client[0]) if client else ""
