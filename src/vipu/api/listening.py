"""The listening socket of an HTTP end-point (the dashboard, the vPOD API), bound before its server
starts, so that a taken port is the program's own one-line error rather than the server's exit."""

from __future__ import annotations

import errno
import socket

from vipu.model.errors import VipuError


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port`, as uvicorn binds its own (address reuse on, so a restart
    does not wait for old connections); VipuError naming the address if that cannot be done."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise VipuError(f"cannot listen on {host}:{port}: {error.strerror}") from None
    family, kind, protocol, _, address = infos[0]
    sock = socket.socket(family, kind, protocol)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as error:
        sock.close()
        reason = "the port is taken" if error.errno == errno.EADDRINUSE else error.strerror
        raise VipuError(f"cannot listen on {host}:{port}: {reason}") from None
    return sock
