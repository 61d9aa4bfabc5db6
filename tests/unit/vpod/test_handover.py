"""The controller VM's secrets handed over once (vipu.vpod.handover): over TLS that the site's
authority vouches for, for the token its user data carried, never a second time."""

from __future__ import annotations

import socket
import time

import pytest

from tests.ports import free_port
from vipu.api.listening import listening_socket
from vipu.api.tls import TlsFiles, generate
from vipu.model.errors import PermissionDenied, Unavailable
from vipu.vpod import handover
from vipu.vpod.handover import PATH_PREFIX, HandoverServer, fetch, issue_token, server_tls, spending

SECRETS = {"certs/server/server-key.pem": b"-----BEGIN PRIVATE KEY-----\n", "store-url": b"postgresql://t:secret@db/t"}


@pytest.fixture
def site(tmp_path) -> TlsFiles:
    files = TlsFiles(tmp_path / "site-certs")
    generate(files, ["localhost"])
    return files


class Vpods:
    """The orchestrator's side for one vPOD, acme-1: its token's place and its files, which can be
    made to fail (its store not known yet, say)."""

    def __init__(self, directory):
        self.directory, self.failing = directory, False

    def token_path(self, vpod_id: str):
        return self.directory / f"{vpod_id}.handover"

    def secrets(self, vpod_id: str) -> dict[str, bytes]:
        if self.failing:
            raise Unavailable(f"the store of vPOD {vpod_id} is not known")
        return SECRETS


@pytest.fixture
def vpods(tmp_path) -> Vpods:
    return Vpods(tmp_path)


@pytest.fixture
def served(site, tmp_path, vpods):
    """A hand-over on loopback for vPOD acme-1, its token kept in tmp_path; (URL, token)."""
    token = issue_token(vpods.token_path("acme-1"))
    port = free_port()
    server = HandoverServer(listening_socket("127.0.0.1", port), server_tls(site, "127.0.0.1", tmp_path / "orchestrator"),
                            vpods.token_path, vpods.secrets)
    server.start()
    yield f"https://127.0.0.1:{port}{PATH_PREFIX}acme-1", token
    server.stop()


def spend(path, token: str) -> None:
    with spending(path, token):
        pass


def test_a_token_is_good_once_and_only_for_its_own_file(tmp_path):
    token = issue_token(tmp_path / "handover")
    with pytest.raises(PermissionDenied, match="not the one given"):
        spend(tmp_path / "handover", token + "x")
    spend(tmp_path / "handover", token)  # a wrong guess did not use it up
    with pytest.raises(PermissionDenied, match="used already, or never given"):
        spend(tmp_path / "handover", token)


def test_a_token_is_not_spent_by_a_hand_over_that_fails_on_the_orchestrators_side_nor_twice_at_once(tmp_path):
    token = issue_token(tmp_path / "handover")
    with pytest.raises(OSError), spending(tmp_path / "handover", token):
        raise OSError("the answer could not be sent")
    with spending(tmp_path / "handover", token), pytest.raises(PermissionDenied, match="used already"):
        spend(tmp_path / "handover", token)  # set aside while the first is being answered: not a second time
    assert not list(tmp_path.iterdir())


def test_an_expired_token_is_refused_and_gone(tmp_path):
    token = issue_token(tmp_path / "handover", now=0.0)
    with pytest.raises(PermissionDenied, match="expired"):
        spend(tmp_path / "handover", token)
    assert not (tmp_path / "handover").exists()


def test_a_vm_whose_orchestrator_failed_to_answer_fetches_its_files_once_it_can(served, site, vpods, tmp_path):
    url, token = served
    vpods.failing = True
    with pytest.raises(Unavailable, match="could not give the controller's secrets within 0 s: the store of vPOD acme-1 is not known"):
        fetch(url, site.ca_cert, token, tmp_path / "vm", deadline_seconds=0)
    vpods.failing = False
    assert fetch(url, site.ca_cert, token, tmp_path / "vm")  # the failure cost no token


def test_a_call_that_says_nothing_is_ended_after_its_time(served, monkeypatch):
    url, _ = served
    monkeypatch.setattr(handover, "CALL_SECONDS", 1.0)
    host, port = url.split("/")[2].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as silent:  # not even a TLS handshake
        began = time.monotonic()
        assert silent.recv(1) == b""
        assert time.monotonic() - began < 5  # its call's deadline, not the socket's 30 s wait for each read


def test_the_hand_over_closes_calls_beyond_its_limit(served):
    url, _ = served
    host, port = url.split("/")[2].split(":")
    idle = [socket.create_connection((host, int(port)), timeout=10) for _ in range(handover.MOST_CALLS)]
    try:
        extra = socket.create_connection((host, int(port)), timeout=10)
        assert extra.recv(1) == b""  # closed at once: every place is taken
        extra.close()
    finally:
        for connection in idle:
            connection.close()


def test_the_vm_fetches_its_files_once_and_a_second_fetch_is_refused_in_a_line(served, site, tmp_path):
    url, token = served
    into = tmp_path / "vm"
    written = fetch(url, site.ca_cert, token, into)
    assert {path.relative_to(into).as_posix(): path.read_bytes() for path in written} == SECRETS
    assert all(path.stat().st_mode & 0o777 == 0o600 for path in written)
    with pytest.raises(PermissionDenied) as refused:
        fetch(url, site.ca_cert, token, tmp_path / "again")
    assert refused.value.message == (f"vipu-vpod at {url} refused the controller's secrets: no controller secrets are waiting "
                                     "for this token: it was used already, or never given")
    assert not (tmp_path / "again").exists()


def test_a_server_the_site_did_not_certify_is_not_given_the_token(served, tmp_path):
    url, token = served
    other = TlsFiles(tmp_path / "other-site")
    generate(other, ["localhost"])
    with pytest.raises(PermissionDenied, match="is not the site's vipu-vpod"):
        fetch(url, other.ca_cert, token, tmp_path / "vm")
    assert fetch(url, TlsFiles(tmp_path / "site-certs").ca_cert, token, tmp_path / "vm")  # the token was not spent
