"""Error families <-> gRPC status codes, in both directions, in one place.

Servers run every handler behind `GuardInterceptor`, which turns a `VipuError` into the status
code of its family (and anything else into INTERNAL, logged) and reports each call's method,
code and duration to an observer (the controller's metrics). Clients turn a failed call back
into the same family with `error_from_rpc`, so a CLI or the controller's agent client sees the
error a service raised, whatever process it came from.
"""

from __future__ import annotations

import logging
import threading
import time
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager

import grpc

from vipu.model import errors
from vipu.model.errors import one_line

log = logging.getLogger(__name__)

_CODES: list[tuple[type[errors.VipuError], grpc.StatusCode]] = [
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND),
    (errors.AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (errors.Conflict, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
    (errors.HardwareFailure, grpc.StatusCode.ABORTED),
    (errors.PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
]


def service_and_method(method_path: str) -> tuple[str, str]:
    """gRPC's '/package.Service/Method' as the labels of a metric: ('package.Service', 'Method')."""
    service, _, method = method_path.lstrip("/").partition("/")
    return service, method


# A refusal's message travels in a trailer, which HTTP/2 bounds (8 KB by default, after gRPC
# percent-encodes every byte beyond ASCII): a longer one would turn the refusal into
# RESOURCE_EXHAUSTED. Messages quoting what a caller sent are cut here, by their UTF-8 bytes.
MAX_DETAILS_BYTES = 1000


def bounded(message: str) -> str:
    """The message as one line of at most MAX_DETAILS_BYTES bytes of UTF-8."""
    line = one_line(message)
    encoded = line.encode()
    if len(encoded) <= MAX_DETAILS_BYTES:
        return line
    return f"{encoded[:MAX_DETAILS_BYTES].decode(errors='ignore')}... (shortened from {len(line)} characters)"


def code_for(error: errors.VipuError) -> grpc.StatusCode:
    for family, code in _CODES:
        if isinstance(error, family):
            return code
    return grpc.StatusCode.INTERNAL


# Trailing metadata marking an error a vipu service raised, as opposed to one of the transport;
# its value names the error's family, which a status code alone does not always tell (a lost race
# and a refusal are both FAILED_PRECONDITION, for the vendor's clients' sake). Older servers send "1".
SERVICE_ERROR_KEY = "vipu-error"
_FAMILIES = {family.__name__: family for family in (
    errors.InvalidArgument, errors.NotFound, errors.AlreadyExists, errors.Conflict, errors.ConcurrentUpdate,
    errors.Unavailable, errors.OutcomeUnknown, errors.HardwareFailure, errors.PermissionDenied, errors.Unauthenticated)}
# Trailing metadata of a standby replica's refusal: where the leader is, if it knows.
STANDBY_KEY = "vipu-standby-leader"
# grpc's metadata are (key, value) pairs, which types-grpcio declares as a class that is not one; ours have str values.
_Pairs = Iterable[tuple[str, str]]


def _trailers(error: errors.VipuError) -> tuple[tuple[str, str], ...]:
    family = next((f for f in type(error).__mro__ if f.__name__ in _FAMILIES), errors.VipuError).__name__
    if isinstance(error, errors.Standby):
        return ((SERVICE_ERROR_KEY, family), (STANDBY_KEY, error.leader))
    return ((SERVICE_ERROR_KEY, family),)


def error_from_rpc(error: grpc.RpcError, peer: str = "") -> errors.VipuError:
    """The VipuError a failed call stands for; `peer` names the far end in transport errors."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = (error.details() if hasattr(error, "details") else "") or str(code)
    metadata = dict(typing.cast(_Pairs, error.trailing_metadata() or ())) if hasattr(error, "trailing_metadata") else {}
    if not metadata.get(SERVICE_ERROR_KEY):
        where = f"{peer}: " if peer else ""
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return errors.Unavailable(f"{where}no answer before the deadline")
        if code == grpc.StatusCode.UNAVAILABLE:
            return errors.Unavailable(f"{where}unreachable ({_transport_reason(details)})")
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return errors.Unavailable(f"{where}does not offer this service ({details})")
    if STANDBY_KEY in metadata:
        return errors.Standby(details, metadata[STANDBY_KEY])
    named = _FAMILIES.get(metadata.get(SERVICE_ERROR_KEY, ""))
    if named is not None and code_for(named("")) == code:  # the name refines the code; it never contradicts it
        return named(details)
    family = next((f for f, c in _CODES if c == code), errors.VipuError)
    return family(details)


def never_reached(error: grpc.RpcError) -> bool:
    """The call failed before any server saw it (no connection could be made), so sending it elsewhere is safe."""
    if not hasattr(error, "code") or error.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    if dict(typing.cast(_Pairs, error.trailing_metadata() or ())).get(SERVICE_ERROR_KEY):
        return False
    details = (error.details() or "").lower()
    return any(marker in details for marker in ("failed to connect", "connection refused", "name resolution", "dns resolution"))


def _transport_reason(details: str) -> str:
    """gRPC's transport messages are long; keep the part a person can act on."""
    lowered = details.lower()
    for marker, reason in (
        ("connection refused", "connection refused"),
        ("name resolution", "unknown host"),
        ("dns resolution", "unknown host"),
        ("timeout", "timed out"),
        ("ssl", "TLS handshake failed"),
    ):
        if marker in lowered:
            return reason
    return details.splitlines()[0][:200]


Observer = Callable[[str, str, float], None]
# Given the method, the call's metadata and the caller's address, a context manager inside which
# the call is handled; entering it raises a VipuError for a caller who may not make the call.
Authenticate = Callable[[str, Mapping[str, str], str], AbstractContextManager]


class _Malformed:
    """What a request whose bytes are not its message deserializes to, so that the call is refused
    as INVALID_ARGUMENT in one line rather than failing inside gRPC with a logged traceback."""

    def __init__(self, size: int, reason: str):
        self.size, self.reason = size, reason


def _tolerant(deserializer):
    if deserializer is None:
        return None

    def parse(data: bytes):
        try:
            return deserializer(data)
        except Exception as error:  # noqa: BLE001 - whatever the bytes make the parser raise, the caller is told
            return _Malformed(len(data), type(error).__name__)

    return parse


class RateLimitedLog:
    """A warning at most once per `interval` seconds, saying how many were left out meanwhile: a
    storm of bad requests from one client must not fill the log."""

    def __init__(self, interval: float = 10.0, logger: logging.Logger = log):
        self.interval = interval
        self.logger = logger
        self._lock = threading.Lock()
        self._next = 0.0
        self._left_out = 0

    def warning(self, message: str, *args) -> None:
        with self._lock:
            now = time.monotonic()
            if now < self._next:
                self._left_out += 1
                return
            left_out, self._left_out, self._next = self._left_out, 0, now + self.interval
        suffix = f" ({left_out} more like it in the last {self.interval:.0f} s not logged)" if left_out else ""
        self.logger.warning(message + suffix, *args)


class GuardInterceptor(grpc.ServerInterceptor):
    """Checks the caller, maps service errors to status codes, and reports (method, code, seconds).
    A request whose bytes are not a valid message is refused as INVALID_ARGUMENT, before any
    credential is looked at, and logged at a bounded rate. Unary and server-streaming methods are
    guarded alike; a method of another kind is not served at all, rather than served unguarded."""

    def __init__(self, observe: Observer | None = None, authenticate: Authenticate | None = None,
                 count_malformed: Callable[[str], None] | None = None):
        """`count_malformed(method_path)` is told of each malformed request, for a metric."""
        self.observe = observe
        self.authenticate = authenticate
        self.count_malformed = count_malformed
        self.malformed_log = RateLimitedLog()

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            def guarded(request, context):
                with self._guarding(method, request, context):
                    return inner(request, context)

            return grpc.unary_unary_rpc_method_handler(
                guarded, request_deserializer=_tolerant(handler.request_deserializer), response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            streamed = handler.unary_stream

            def guarded_stream(request, context):
                with self._guarding(method, request, context):
                    yield from streamed(request, context)

            return grpc.unary_stream_rpc_method_handler(
                guarded_stream, request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer)
        log.error("%s is neither unary nor server-streaming, which the guard does not check: not served", method)
        return None

    @contextmanager
    def _guarding(self, method: str, request, context) -> Iterator[None]:
        """The call's handling (a stream's, to its end) under the guard."""
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            if isinstance(request, _Malformed):
                if self.count_malformed is not None:
                    self.count_malformed(method)
                self.malformed_log.warning("%s: a malformed request of %d bytes from %s (%s)", method, request.size,
                                           context.peer(), request.reason)
                raise errors.InvalidArgument(f"malformed request: its {request.size} bytes are not a {method} request")
            if self.authenticate is None:
                yield
            else:
                with self.authenticate(method, dict(context.invocation_metadata()), context.peer()):
                    yield
        except errors.VipuError as error:
            code = code_for(error)
            context.set_trailing_metadata(_trailers(error))
            context.abort(code, bounded(error.message))
        except Exception:
            code = grpc.StatusCode.INTERNAL
            log.exception("%s failed", method)
            context.abort(code, "internal error; the server log has the details")
        finally:
            if self.observe is not None:
                self.observe(method, code.name, time.perf_counter() - started)
