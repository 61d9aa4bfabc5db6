"""A controller VM's secrets, handed over once (issue 4 of the OpenStack vPOD flow).

Nova keeps a server's user data where its administrators, and every process in the VM (through
the metadata service), can read it; so the controller's user data carries no secret of its own:
only a one-time token and the site's certificate authority. At first boot the VM presents the
token to vipu-vpod's handover end-point, over HTTPS whose certificate the site's authority issued
(so the VM knows it speaks to its orchestrator, and nobody on the way reads the answer), and is
given its files once: its certificates' keys, the store's URL with its password. The token is then
gone: a second use, or a use after HANDOVER_SECONDS, is refused in one line.

The token is kept, as its SHA-256 with its expiry, in the vPOD's directory, so that an orchestrator
started again still hands over to a VM booted before it died. Who may be handed what is the
caller's (`redeem`'s) business; this module holds the token, the end-point and the VM's side.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import secrets
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from socket import socket

from vipu.api.atomic import write_file
from vipu.api.tls import TlsFiles, issue
from vipu.model.entities import check_id
from vipu.model.errors import PermissionDenied, Unavailable, VipuError

log = logging.getLogger(__name__)

HANDOVER_SECONDS = 3600.0  # a token unused this long after its server was made is refused
FETCH_DEADLINE_SECONDS = 300.0  # the VM's tries to reach its orchestrator (still starting, say)
FETCH_RETRY_SECONDS = 2.0
PATH_PREFIX = "/v1/controller-secrets/"
_lock = threading.Lock()  # one redemption at a time: a token is never handed over twice


def issue_token(path: Path, now: float | None = None) -> str:
    """A new token for the VM about to be made, replacing any earlier one (its server is gone)."""
    token = secrets.token_urlsafe(32)
    expires = (time.time() if now is None else now) + HANDOVER_SECONDS
    write_file(path, f"{hashlib.sha256(token.encode()).hexdigest()} {expires:.0f}\n".encode(), 0o600)
    return token


def redeem_token(path: Path, token: str) -> None:
    """Use the token up: PermissionDenied, in one line, unless it is the one kept there, unused and
    not expired. Once it is, it is no more."""
    with _lock:
        try:
            digest, expires = path.read_text().split()
        except (OSError, ValueError):
            raise PermissionDenied("no controller secrets are waiting for this token: it was used already, or never given") from None
        if not hmac.compare_digest(digest, hashlib.sha256(token.encode()).hexdigest()):
            raise PermissionDenied("the token is not the one given to this vPOD's controller")
        path.unlink()
        if float(expires) < time.time():
            raise PermissionDenied(f"the token expired before its VM asked for its secrets ({HANDOVER_SECONDS / 3600:.0f} h after "
                                   "its server was made)")


def server_tls(site: TlsFiles, address: str, directory: Path) -> ssl.SSLContext:
    """The end-point's TLS: a certificate for `address`, issued by the site's authority at each
    start (the VMs are given that authority's certificate, which is not a secret)."""
    key, certificate = issue(site.ca_key.read_bytes(), site.ca_cert.read_bytes(), "vipu-vpod handover", server_names=[address])
    write_file(directory / "handover-key.pem", key, 0o600)
    write_file(directory / "handover.pem", certificate)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(directory / "handover.pem", directory / "handover-key.pem")
    return context


class HandoverServer:
    """`POST /v1/controller-secrets/<vPOD id>` with `Authorization: Bearer TOKEN`: the vPOD's
    files as JSON (`{"files": {path: base64}}`), or `{"error": ...}` with 403 (the token is refused)
    or 400; `redeem(vpod_id, token)` checks the token and gives the files. Served on its own thread."""

    def __init__(self, listening: socket, context: ssl.SSLContext, redeem: Callable[[str, str], dict[str, bytes]]):
        class Handler(BaseHTTPRequestHandler):
            timeout = 30  # a VM that stops halfway holds a thread no longer

            def setup(self) -> None:
                super().setup()
                self.connection.do_handshake()  # here, in the call's own thread, not in the one accepting calls

            def do_POST(self) -> None:
                status: int = 200
                body: dict[str, object] = {}
                try:
                    if not self.path.startswith(PATH_PREFIX):
                        raise PermissionDenied(f"vipu-vpod hands controllers their secrets at {PATH_PREFIX}<vPOD id> only")
                    vpod_id = check_id("vPOD", self.path[len(PATH_PREFIX):])
                    scheme, _, token = self.headers.get("Authorization", "").partition(" ")
                    if scheme != "Bearer" or not token.strip():
                        raise PermissionDenied("give the controller's one-time token (Authorization: Bearer TOKEN)")
                    files = redeem(vpod_id, token.strip())
                    body = {"files": {path: base64.b64encode(data).decode() for path, data in files.items()}}
                    log.info("vPOD %s: its controller's secrets handed over to %s", vpod_id, self.client_address[0])
                except PermissionDenied as error:
                    status, body = 403, {"error": error.message}
                    log.warning("a call for controller secrets from %s refused: %s", self.client_address[0], error.message)
                except VipuError as error:
                    status, body = 400, {"error": error.message}
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args) -> None:
                """Each call is logged once, above, as vipu-vpod's own."""

        class Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address) -> None:
                """A caller that is not a VM of the site's (no TLS, say, or gone halfway): a line, not a traceback."""
                log.warning("a call for controller secrets from %s failed: %s", client_address[0], sys.exc_info()[1])

        self.server = Server(listening.getsockname()[:2], Handler, bind_and_activate=False)
        self.server.socket.close()
        self.server.socket = context.wrap_socket(listening, server_side=True, do_handshake_on_connect=False)  # in each call's thread
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="handover", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def fetch(url: str, authority: Path, token: str, into: Path, deadline_seconds: float = FETCH_DEADLINE_SECONDS) -> list[Path]:
    """The VM's side: ask `url` for the files, the server's certificate checked against
    `authority`, and write each under `into`, readable by its owner only; the paths written. An
    orchestrator that does not answer (yet) is asked again until the deadline; a refusal is final."""
    context = ssl.create_default_context(cafile=str(authority))
    request = urllib.request.Request(url, method="POST", data=b"", headers={"Authorization": f"Bearer {token}"})
    deadline = time.monotonic() + deadline_seconds
    while True:
        try:
            with urllib.request.urlopen(request, timeout=30, context=context) as answer:
                files = json.loads(answer.read())["files"]
            break
        except urllib.error.HTTPError as error:
            try:
                reason = json.loads(error.read())["error"]
            except (ValueError, KeyError, TypeError):
                reason = f"HTTP {error.code}"
            raise PermissionDenied(f"vipu-vpod at {url} refused the controller's secrets: {reason}") from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            if isinstance(reason, ssl.SSLCertVerificationError):
                raise PermissionDenied(f"{url} is not the site's vipu-vpod: {reason}") from None
            if time.monotonic() > deadline:
                raise Unavailable(f"cannot reach vipu-vpod at {url} for the controller's secrets within "
                                  f"{deadline_seconds:.0f} s: {reason}") from None
            time.sleep(FETCH_RETRY_SECONDS)
    written = []
    root = into.resolve()
    for relative, content in sorted(files.items()):
        path = (root / relative).resolve()
        if not path.is_relative_to(root) or path == root:
            raise PermissionDenied(f"vipu-vpod at {url} named a file outside {into}: {relative}")
        write_file(path, base64.b64decode(content), 0o600)
        written.append(path)
    return written
