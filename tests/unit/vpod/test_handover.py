"""The controller VM's secrets handed over once (vipu.vpod.handover): over TLS that the site's
authority vouches for, for the token its user data carried, never a second time."""

from __future__ import annotations

import pytest

from tests.ports import free_port
from vipu.api.listening import listening_socket
from vipu.api.tls import TlsFiles, generate
from vipu.model.errors import PermissionDenied
from vipu.vpod.handover import PATH_PREFIX, HandoverServer, fetch, issue_token, redeem_token, server_tls

SECRETS = {"certs/server/server-key.pem": b"-----BEGIN PRIVATE KEY-----\n", "store-url": b"postgresql://t:secret@db/t"}


@pytest.fixture
def site(tmp_path) -> TlsFiles:
    files = TlsFiles(tmp_path / "site-certs")
    generate(files, ["localhost"])
    return files


@pytest.fixture
def served(site, tmp_path):
    """A hand-over on loopback for vPOD acme-1, its token kept in tmp_path; (URL, token)."""
    token = issue_token(tmp_path / "handover")

    def redeem(vpod_id: str, given: str) -> dict[str, bytes]:
        if vpod_id != "acme-1":
            raise PermissionDenied(f"no vPOD {vpod_id}")
        redeem_token(tmp_path / "handover", given)
        return SECRETS

    port = free_port()
    server = HandoverServer(listening_socket("127.0.0.1", port), server_tls(site, "127.0.0.1", tmp_path / "orchestrator"), redeem)
    server.start()
    yield f"https://127.0.0.1:{port}{PATH_PREFIX}acme-1", token
    server.stop()


def test_a_token_is_good_once_and_only_for_its_own_file(tmp_path):
    token = issue_token(tmp_path / "handover")
    with pytest.raises(PermissionDenied, match="not the one given"):
        redeem_token(tmp_path / "handover", token + "x")
    redeem_token(tmp_path / "handover", token)  # a wrong guess did not use it up
    with pytest.raises(PermissionDenied, match="used already, or never given"):
        redeem_token(tmp_path / "handover", token)


def test_an_expired_token_is_refused_and_gone(tmp_path):
    token = issue_token(tmp_path / "handover", now=0.0)
    with pytest.raises(PermissionDenied, match="expired"):
        redeem_token(tmp_path / "handover", token)
    assert not (tmp_path / "handover").exists()


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
