"""A controller VM's secrets, handed over once (issue 4 of the OpenStack vPOD flow).

Nova keeps a server's user data where its administrators, and every process in the VM (through
the metadata service), can read it; so the controller's user data carries no secret of its own:
only a one-time token and the site's certificate authority. At first boot the VM presents the
token to vipu-vpod's handover end-point, over HTTPS whose certificate the site's authority issued
(so the VM knows it speaks to its orchestrator, and nobody on the way reads the answer), and is
given its files once: its certificates' keys, the store's URL with its password. The token is then
gone: a second use, or a use after HANDOVER_SECONDS, is refused in one line.

The token is kept, as its SHA-256 with its expiry, in the vPOD's directory, so that an orchestrator
started again still hands over to a VM booted before it died; it is spent only once its answer is
sent, so that a failure on vipu-vpod's side costs none. Where a vPOD's token lives and what its
files are is the caller's business; this module holds the token, the end-point and the VM's side.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import http.client
import json
import logging
import secrets
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from socket import SHUT_RDWR, socket

from vipu.api.atomic import write_file
from vipu.api.tls import TlsFiles, issue
from vipu.model.entities import check_id
from vipu.model.errors import PermissionDenied, Unavailable, VipuError

log = logging.getLogger(__name__)

HANDOVER_SECONDS = 3600.0  # a token unused this long after its server was made is refused
FETCH_DEADLINE_SECONDS = 300.0  # the VM's tries to reach its orchestrator (still starting, say)
FETCH_RETRY_SECONDS = 2.0
TOKEN_FILE_BYTES = 128  # a digest and an expiry: read no more, whatever the file holds
MOST_ANSWER_BYTES = 1 << 20  # a controller's keys and store URL are a few kilobytes
CALL_SECONDS = 30.0  # one call to the hand-over, from its first byte to its answer
MOST_CALLS = 16  # calls the hand-over serves at once: VMs at first boot are few, and a flood takes no more threads
PATH_PREFIX = "/v1/controller-secrets/"
_lock = threading.Lock()  # one redemption at a time: a token is never handed over twice


def issue_token(path: Path, now: float | None = None) -> str:
    """A new token for the VM about to be made, replacing any earlier one (its server is gone)."""
    token = secrets.token_urlsafe(32)
    expires = (time.time() if now is None else now) + HANDOVER_SECONDS
    with _lock:  # not beneath a hand-over of the old one, which would take this one away
        write_file(path, f"{hashlib.sha256(token.encode()).hexdigest()} {expires:.0f}\n".encode(), 0o600)
    return token


@contextmanager
def spending(path: Path, token: str) -> Iterator[None]:
    """Spend the token while the block hands its files over: PermissionDenied, in one line, unless
    it is the one kept at `path`, unused and not expired. It is set aside first, so that no other
    call can spend it meanwhile; gone once the block ends, and back should the block fail (the
    files could not be read, the answer not be sent), so that a failure of ours costs no token."""
    sending = path.with_name(f"{path.name}.sending")
    with _lock:
        try:
            with open(path) as kept:
                digest, expires = kept.read(TOKEN_FILE_BYTES).split()
        except (OSError, ValueError):
            raise PermissionDenied("no controller secrets are waiting for this token: it was used already, or never given") from None
        if not hmac.compare_digest(digest, hashlib.sha256(token.encode()).hexdigest()):
            raise PermissionDenied("the token is not the one given to this vPOD's controller")
        if float(expires) < time.time():
            path.unlink()
            raise PermissionDenied(f"the token expired before its VM asked for its secrets ({HANDOVER_SECONDS / 3600:.0f} h after "
                                   "its server was made)")
        path.rename(sending)
    try:
        yield
    except BaseException:
        with _lock:
            if not path.exists():  # unless a new token was issued meanwhile
                sending.rename(path)
        raise
    sending.unlink(missing_ok=True)


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
    files as JSON (`{"files": {path: base64}}`), or `{"error": ...}` with 403 (the token is refused),
    503 (its files cannot be given now: asked again) or 400. `token_path(vpod_id)` is where its
    token is kept, `secrets(vpod_id)` gives its files. Served on its own thread; at most MOST_CALLS
    calls at once, each ended after CALL_SECONDS."""

    def __init__(self, listening: socket, context: ssl.SSLContext, token_path: Callable[[str], Path],
                 secrets: Callable[[str], dict[str, bytes]]):
        class Handler(BaseHTTPRequestHandler):
            timeout = CALL_SECONDS  # a VM that stops halfway holds a thread no longer

            def setup(self) -> None:
                super().setup()
                self.connection.do_handshake()  # here, in the call's own thread, not in the one accepting calls

            def do_POST(self) -> None:
                try:
                    if not self.path.startswith(PATH_PREFIX):
                        raise PermissionDenied(f"vipu-vpod hands controllers their secrets at {PATH_PREFIX}<vPOD id> only")
                    vpod_id = check_id("vPOD", self.path[len(PATH_PREFIX):])
                    scheme, _, token = self.headers.get("Authorization", "").partition(" ")
                    if scheme != "Bearer" or not token.strip():
                        raise PermissionDenied("give the controller's one-time token (Authorization: Bearer TOKEN)")
                    with spending(token_path(vpod_id), token.strip()):
                        files = secrets(vpod_id)
                        self._answer(200, {"files": {path: base64.b64encode(data).decode() for path, data in files.items()}})
                    log.info("vPOD %s: its controller's secrets handed over to %s", vpod_id, self.client_address[0])
                except PermissionDenied as error:
                    log.warning("a call for controller secrets from %s refused: %s", self.client_address[0], error.message)
                    self._answer(403, {"error": error.message})
                except Unavailable as error:  # ours, for now: the VM asks again (its token is still there)
                    log.warning("a call for controller secrets from %s not answered: %s", self.client_address[0], error.message)
                    self._answer(503, {"error": error.message})
                except VipuError as error:
                    self._answer(400, {"error": error.message})

            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                self.wfile.flush()

            def log_message(self, format: str, *args) -> None:
                """Each call is logged once, above, as vipu-vpod's own."""

        calls = threading.BoundedSemaphore(MOST_CALLS)

        class Server(ThreadingHTTPServer):
            def process_request(self, request, client_address) -> None:
                if not calls.acquire(blocking=False):  # as many calls as it serves already: this one is closed at once
                    log.warning("a call for controller secrets from %s refused: %d calls are under way", client_address[0], MOST_CALLS)
                    self.shutdown_request(request)
                    return
                super().process_request(request, client_address)

            def process_request_thread(self, request, client_address) -> None:
                ending = threading.Timer(CALL_SECONDS, _cut, (request,))  # however slowly it trickles in
                ending.start()
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    ending.cancel()
                    calls.release()

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
        if self._thread.is_alive():  # shutdown waits for serve_forever, which never ran otherwise
            self.server.shutdown()
        self.server.server_close()


def _cut(connection: socket) -> None:
    """End a call that has had its time: what its thread waits on fails at once."""
    with contextlib.suppress(OSError):
        connection.shutdown(SHUT_RDWR)


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
                body = answer.read(MOST_ANSWER_BYTES + 1)
            if len(body) > MOST_ANSWER_BYTES:
                raise ValueError(f"an answer of more than {MOST_ANSWER_BYTES} bytes")
            files = json.loads(body)["files"]
            break
        except urllib.error.HTTPError as error:
            try:
                reason = json.loads(error.read(MOST_ANSWER_BYTES))["error"]
            except (ValueError, KeyError, TypeError):
                reason = f"HTTP {error.code}"
            if error.code != 503:
                raise PermissionDenied(f"vipu-vpod at {url} refused the controller's secrets: {reason}") from None
            if time.monotonic() > deadline:  # it cannot give them yet (its store not known, say): asked again until the deadline
                raise Unavailable(f"vipu-vpod at {url} could not give the controller's secrets within {deadline_seconds:.0f} s: "
                                  f"{reason}") from None
            time.sleep(FETCH_RETRY_SECONDS)
        except urllib.error.URLError as error:  # before the call was sent whole: asked again
            if isinstance(error.reason, ssl.SSLCertVerificationError):
                raise PermissionDenied(f"{url} is not the site's vipu-vpod: {error.reason}") from None
            if time.monotonic() > deadline:
                raise Unavailable(f"cannot reach vipu-vpod at {url} for the controller's secrets within "
                                  f"{deadline_seconds:.0f} s: {error.reason}") from None
            time.sleep(FETCH_RETRY_SECONDS)
        except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError) as error:
            # After the call was sent: its token may be spent, and asking again would only hide why.
            raise Unavailable(f"the answer of vipu-vpod at {url} with the controller's secrets was lost or malformed "
                              f"({type(error).__name__}: {error}); the token may be spent: stop the controller's server to "
                              "have it made again") from None
    written = []
    root = into.resolve()
    for relative, content in sorted(files.items()):
        path = (root / relative).resolve()
        if not path.is_relative_to(root) or path == root:
            raise PermissionDenied(f"vipu-vpod at {url} named a file outside {into}: {relative}")
        write_file(path, base64.b64decode(content), 0o600)
        written.append(path)
    return written
