"""Errors keep their family across the wire; transport failures name the far end."""

from __future__ import annotations

import grpc
import pytest

from vipu.api.status import SERVICE_ERROR_KEY, code_for, error_from_rpc
from vipu.model import errors


class FailedCall(grpc.RpcError):
    def __init__(self, code, details, service=True, family="1"):
        self._code, self._details = code, details
        self._metadata = ((SERVICE_ERROR_KEY, family),) if service else ()

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


def test_a_lost_race_comes_back_as_a_concurrent_update_which_may_be_retried():
    """The trailer names the family where the status code, kept as the vendor's clients expect it, cannot."""
    back = error_from_rpc(FailedCall(grpc.StatusCode.FAILED_PRECONDITION, "p1 changed meanwhile", family="ConcurrentUpdate"))
    assert type(back) is errors.ConcurrentUpdate and back.temporary
    older_server = error_from_rpc(FailedCall(grpc.StatusCode.FAILED_PRECONDITION, "p1 changed meanwhile"))
    assert type(older_server) is errors.Conflict and not older_server.temporary


def test_a_family_name_that_contradicts_the_status_code_is_not_believed():
    back = error_from_rpc(FailedCall(grpc.StatusCode.NOT_FOUND, "no p1", family="Unavailable"))
    assert type(back) is errors.NotFound
