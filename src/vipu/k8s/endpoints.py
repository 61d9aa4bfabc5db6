"""The operator's own HTTP end-points: health probes, and Prometheus metrics behind Kubernetes auth.

`/metrics` is served over TLS and only to a caller whose bearer token the API server accepts
(TokenReview) and whose identity may `get` the non-resource URL `/metrics` (SubjectAccessReview):
what the metrics-reader ClusterRole grants. This is the check kube-rbac-proxy makes in front of
controller-runtime operators, done in the process.
"""

from __future__ import annotations

import logging
import ssl
import tempfile
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from kubernetes import client
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from vipu.api import tls

log = logging.getLogger("vipu.k8s.endpoints")


def _serve(address: str, port: int, handler: type[BaseHTTPRequestHandler], context: ssl.SSLContext | None = None) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((address, port), handler)
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name=f"http {port}", daemon=True).start()
    return server


class _Quiet(BaseHTTPRequestHandler):
    def log_message(self, format, *args):
        pass

    def answer(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serve_probes(address: str, port: int, ready: Callable[[], bool]) -> ThreadingHTTPServer:
    """`/healthz` (the process answers) and `/readyz` (it has reached the API server)."""

    class Probes(_Quiet):
        def do_GET(self):
            if self.path == "/healthz":
                self.answer(200, b"ok")
            elif self.path == "/readyz":
                self.answer(*((200, b"ok") if ready() else (503, b"not ready")))
            else:
                self.answer(404, b"not found")

    return _serve(address, port, Probes)


class Authorizer:
    """Whether a bearer token may read /metrics, as the API server judges it."""

    def __init__(self, api: client.ApiClient):
        self.authentication = client.AuthenticationV1Api(api)
        self.authorization = client.AuthorizationV1Api(api)

    def __call__(self, token: str) -> int:
        """200, or 401 for a token the API server does not accept, or 403 for one without the right."""
        review = self.authentication.create_token_review(client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token)))
        if not review.status or not review.status.authenticated:
            return 401
        user = review.status.user
        if user is None:  # the API server names an authenticated token's user; the caller answers 503
            raise ValueError("the token review accepted the token but named no user")
        access = self.authorization.create_subject_access_review(client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(user=user.username, groups=user.groups, uid=user.uid, extra=user.extra,
                                                  non_resource_attributes=client.V1NonResourceAttributes(path="/metrics", verb="get"))))
        if access.status is None:  # the API server always judges; the caller answers 503
            raise ValueError("the subject access review came back without a status")
        return 200 if access.status.allowed else 403


def tls_context(cert: Path | None, key: Path | None) -> ssl.SSLContext:
    """The metrics end-point's TLS: the given certificate, or a self-signed one made now."""
    if cert is None or key is None:
        directory = Path(tempfile.mkdtemp(prefix="vipu-metrics-tls-"))
        authority_key, authority = tls.make_authority("vipu-ipu-operator metrics")
        key_pem, cert_pem = tls.issue(authority_key, authority, "vipu-ipu-operator", server_names=["localhost", "127.0.0.1"])
        cert, key = directory / "tls.crt", directory / "tls.key"
        cert.write_bytes(cert_pem + authority)
        key.write_bytes(key_pem)
        key.chmod(0o600)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    return context


def serve_metrics(address: str, port: int, registry: CollectorRegistry, authorize: Callable[[str], int],
                  context: ssl.SSLContext) -> ThreadingHTTPServer:
    class Metrics(_Quiet):
        def do_GET(self):
            if self.path.split("?")[0] != "/metrics":
                self.answer(404, b"not found")
                return
            header = self.headers.get("Authorization", "")
            if not header.startswith("Bearer "):
                self.answer(401, b"Unauthorized: a bearer token is needed")
                return
            try:
                status = authorize(header.removeprefix("Bearer ").strip())
            except Exception as error:  # noqa: BLE001 - the API server could not judge: refuse, and say why in the log
                log.warning("cannot review a metrics request: %s", error)
                status = 503
            if status != 200:
                self.answer(status, {401: b"Unauthorized", 403: b"Forbidden: may not get /metrics"}.get(status, b"Unavailable"))
                return
            self.answer(200, generate_latest(registry), CONTENT_TYPE_LATEST)

    return _serve(address, port, Metrics, context)
