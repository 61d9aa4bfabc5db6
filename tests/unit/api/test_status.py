"""Errors keep their family across the wire; transport failures name the far end."""

from __future__ import annotations

import grpc
import pytest

from vipu.api.status import SERVICE_ERROR_KEY, code_for, error_from_rpc
from vipu.model import errors


class FailedCall(grpc.RpcError):
    def __init__(self, code, details, service=True):
        self._code, self._details = code, details
        self._metadata = ((SERVICE_ERROR_KEY, "1"),) if service else ()

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._metadata


@pytest.mark.parametrize("family", [errors.InvalidArgument, errors.NotFound, errors.AlreadyExists, errors.Conflict,
                                    errors.Unavailable, errors.HardwareFailure, errors.PermissionDenied, errors.Unauthenticated])
def test_a_service_error_comes_back_as_its_family_with_its_message(family):
    back = error_from_rpc(FailedCall(code_for(family("x")), "agent ag1: unreachable (connection refused)"), "vipu-server at h:1")
    assert type(back) is family and back.message == "agent ag1: unreachable (connection refused)"


def test_a_transport_failure_names_the_peer_and_keeps_the_useful_part():
    details = ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
               "Failed to connect to remote host: Connection refused")
    back = error_from_rpc(FailedCall(grpc.StatusCode.UNAVAILABLE, details, service=False), "vipu-server at h:1")
    assert isinstance(back, errors.Unavailable) and back.message == "vipu-server at h:1: unreachable (connection refused)"
    late = error_from_rpc(FailedCall(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", service=False), "agent")
    assert late.message == "agent: no answer before the deadline" and late.temporary


def test_a_conflict_of_a_concurrent_update_is_still_a_conflict():
    assert code_for(errors.ConcurrentUpdate("x")) == grpc.StatusCode.FAILED_PRECONDITION
