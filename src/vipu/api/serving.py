"""Starting a gRPC server: the one way both vipu-server and vipu-agent listen."""

from __future__ import annotations

from collections.abc import Callable
from concurrent import futures

import grpc

from vipu.api.status import GuardInterceptor
from vipu.model.errors import VipuError


def serve(register: Callable[[grpc.Server], None], host: str, port: int, guard: GuardInterceptor,
          workers: int = 8, credentials: grpc.ServerCredentials | None = None) -> grpc.Server:
    """A started server with the servicers `register` adds, behind `guard`; TLS when given credentials."""
    # Without SO_REUSEPORT (gRPC's default on Linux) a second server on a taken port fails here
    # instead of silently sharing the port's connections with the first.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"rpc-{port}"),
                         interceptors=[guard], options=[("grpc.so_reuseport", 0)])
    register(server)
    try:
        if credentials is None:
            server.add_insecure_port(f"{host}:{port}")
        else:
            server.add_secure_port(f"{host}:{port}", credentials)
    except RuntimeError as error:
        raise VipuError(f"cannot listen on {host}:{port} (is the port taken?)") from error
    server.start()
    return server
