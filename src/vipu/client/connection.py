"""Calls to one end-point of vipu-server, over its replicas, with the caller's credentials."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from vipu.api import credentials
from vipu.api.channels import RECONNECT_PROMPTLY
from vipu.api.protos import version_pb2, version_pb2_grpc
from vipu.api.status import error_from_rpc, never_reached
from vipu.client.retry import RetryPolicy
from vipu.client.settings import ClientSettings
from vipu.model.errors import ConcurrentUpdate, InvalidArgument, OutcomeUnknown, Standby, Unavailable, VipuError

PROBE_SECONDS = 2.0  # how long a look at whether a server that closed a connection still listens may take
PROBE_GAP_SECONDS = 0.3  # between two looks: a killed server is gone by the second


def answers(address: str) -> bool:
    """Whether something listens at `host:port`, now and a moment later: a server that closed a
    connection and still listens refused how it was spoken to (plaintext to a secure server); one
    that does not, went. A killed process closes its connections before its listening socket may
    be gone, so one probe right after the close can still find it."""
    host, _, port = address.rpartition(":")
    for probe in range(2):
        if probe:
            time.sleep(PROBE_GAP_SECONDS)
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_SECONDS):
                pass
        except (OSError, ValueError):
            return False
    return True


class Stream:
    """The messages of a server-streaming call as they come; `cancel()` ends it from any thread."""

    def __init__(self, call, explained: Callable[[grpc.RpcError], VipuError]):
        self._call = call
        self._explained = explained
        self._cancelled = False

    def __iter__(self) -> Iterator:
        try:
            yield from self._call
        except grpc.RpcError as error:
            if self._cancelled:
                return
            raise self._explained(error) from None

    @property
    def cancelled(self) -> bool:
        """Whether `cancel()` ended it (its iteration then simply stops)."""
        return self._cancelled

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()


class Connection:
    """Lazily opened channels to one end-point of vipu-server, with the caller's credentials.

    With several addresses (the replicas of a highly available controller) a call goes to the
    one that answered last, and moves on to the next when a replica says it stands by or cannot
    be connected to at all. A call that reached a server and then lost it is not sent again: it
    may have been carried out. One that lost a race with another request (ConcurrentUpdate) was
    refused before it changed anything, and is tried again as `retry` says.
    """

    def __init__(self, settings: ClientSettings, timeout: float, retry: RetryPolicy | None = None):
        self.settings = settings
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.addresses = settings.addresses
        self._current = 0
        self._channels: dict[str, grpc.Channel] = {}
        self._opening = threading.Lock()  # a client may be shared by threads (vipu-slurm-service, the proxy)
        self._metadata = credentials.metadata(settings.user_id, settings.access_key) + settings.forwarded

    @property
    def address(self) -> str:
        """The address of the replica that answered last (the first, before any call)."""
        return self.addresses[self._current]

    def _open(self, address: str) -> grpc.Channel:
        with self._opening:
            return self._channels.get(address) or self._new_channel(address)

    def _new_channel(self, address: str) -> grpc.Channel:
        s = self.settings
        if s.server_cert is not None:  # s.tls
            if s.client_cert is None or s.client_key is None:  # client_settings refuses this; a hand-built one might not
                raise InvalidArgument("mutual TLS needs a client certificate and its key besides the server's certificate authority")
            from vipu.api.tls import client_credentials  # cryptography: only for TLS, a tenth of a plain command's start

            transport = client_credentials(s.server_cert, s.client_cert, s.client_key)
            channel = grpc.secure_channel(address, transport, options=RECONNECT_PROMPTLY)
        else:
            channel = grpc.insecure_channel(address, options=RECONNECT_PROMPTLY)
        self._channels[address] = channel
        return channel

    def call(self, stub_class, method: str, request, no_deadline: bool = False, at_least: float = 0.0):
        """Call a method within the connection's deadline (each try), or `at_least` seconds if
        longer (a call the server bounds itself), or as long as it takes."""
        for delay in self.retry.delays():
            try:
                return self._call_a_replica(stub_class, method, request, no_deadline, at_least)
            except ConcurrentUpdate:
                time.sleep(delay)
        return self._call_a_replica(stub_class, method, request, no_deadline, at_least)

    def _call_a_replica(self, stub_class, method: str, request, no_deadline: bool, at_least: float = 0.0):
        passed_over = []
        for step in range(len(self.addresses)):
            index = (self._current + step) % len(self.addresses)
            address = self.addresses[index]
            try:
                reply = getattr(stub_class(self._open(address)), method)(
                    request, timeout=None if no_deadline else max(self.timeout, at_least),
                    metadata=self._metadata,
                )
            except grpc.RpcError as error:
                failure = self._explained(error, address)
                if len(self.addresses) == 1 or not (isinstance(failure, Standby) or never_reached(error)):
                    raise failure from None
                passed_over.append(failure.message if failure.message.startswith("vipu-server at") else f"{address}: {failure.message}")
                continue
            self._current = index
            return reply
        raise Unavailable(f"no vipu-server of {', '.join(self.addresses)} serves: {'; '.join(passed_over)}")

    def stream(self, stub_class, method: str, request) -> Stream:
        """A server-streaming call, without deadline, to the replica that answered last. A failure
        raises its VipuError from the iteration; after a replica standing by or out of reach, the
        next call goes to the next replica."""
        address = self.address
        call = getattr(stub_class(self._open(address)), method)(
            request, metadata=self._metadata)
        return Stream(call, lambda error: self._stream_failed(error, address))

    def _stream_failed(self, error: grpc.RpcError, address: str) -> VipuError:
        failure = self._explained(error, address)
        if len(self.addresses) > 1 and (isinstance(failure, Standby) or never_reached(error)) and self.address == address:
            self._current = (self._current + 1) % len(self.addresses)
        return failure

    def _explained(self, error: grpc.RpcError, address: str) -> VipuError:
        """The error, with the likely cause when the TLS set-ups of client and server disagree."""
        where = f"vipu-server at {address}"
        failure = error_from_rpc(error, where)
        details = (error.details() or "") if hasattr(error, "details") else ""
        if "CERTIFICATE_VERIFY_FAILED" in details:
            return Unavailable(f"{where}: its certificate is not signed by the certificate authority in {self.settings.server_cert}")
        if "Socket closed" in details or "Connection reset" in details:
            if self.settings.tls:
                return Unavailable(f"{where} closed the TLS connection: it does not accept the client certificate "
                                   f"{self.settings.client_cert} (not signed by its certificate authority?)")
            if not answers(address):
                return OutcomeUnknown(f"{where} closed the connection and no longer answers (stopped, or killed): whether the "
                                      "call was carried out is unknown; look (a get or list) before asking again")
            return Unavailable(f"{where} closed the connection: it runs in secure mode and needs mutual TLS "
                               "(give --tls-server-cert, --tls-client-cert and --tls-client-key, or a --config file with them)")
        return failure

    def server_version(self) -> str:
        return self.call(version_pb2_grpc.VersionServiceStub, "GetVersion", version_pb2.VersionRequest()).version

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
