"""vipu-vpod's REST API served by uvicorn on a real port in a thread, for tests that call it over HTTP."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from tests.functional.harness import wait_until
from tests.ports import free_port
from vipu.vpod.api import server_config


@contextmanager
def serving(app, trusted_proxies: tuple[str, ...] = ()) -> Iterator[int]:
    """The app served as vipu-vpod serves it, on a free port of the loopback until the block ends; the port."""
    port = free_port()
    server = uvicorn.Server(server_config(app, "127.0.0.1", port, trusted_proxies, log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), timeout=10, what="the API to start")
    assert server.started, "the API did not start"
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)
