"""A client's certificate and key are checked before connecting, so that what the server would
refuse without a reason is refused with one."""

from __future__ import annotations

import pytest
from cryptography import x509

from vipu.api.tls import TlsFiles, check_client_pair, common_name, generate, issue_link_certificate, link_authority
from vipu.model.errors import AlreadyExists, InvalidArgument


@pytest.fixture
def files(tmp_path):
    files = TlsFiles(tmp_path / "certs")
    generate(files, ["localhost"])
    return files


def test_a_client_certificate_and_its_own_key_pass(files):
    check_client_pair(files.client_cert, files.client_key)


def test_a_key_that_is_not_the_certificates_is_named(files):
    with pytest.raises(InvalidArgument, match=f"the client key {files.server_key} does not belong to the client certificate"):
        check_client_pair(files.client_cert, files.server_key)


def test_a_certificate_not_made_for_client_authentication_is_named(files):
    with pytest.raises(InvalidArgument, match=r"is not made for client authentication \(its extended key usage lacks clientAuth\)"):
        check_client_pair(files.server_cert, files.server_key)


def test_a_key_that_is_not_a_key_is_named(files, tmp_path):
    garbage = tmp_path / "key.pem"
    garbage.write_text("not a key\n")
    with pytest.raises(InvalidArgument, match="is not an unencrypted PEM private key"):
        check_client_pair(files.client_cert, garbage)


def test_further_certificates_come_from_the_agent_link_authority_and_each_controller_name_once(tmp_path):
    files = TlsFiles(tmp_path / "site")
    generate(files, ["localhost"])
    issue_link_certificate(files, "tenant-a", tmp_path / "a")
    assert common_name(tmp_path / "a" / "controller.pem", "certificate") == "tenant-a"
    assert link_authority(tmp_path / "a") == link_authority(files.agents_dir)
    for name in ("tenant-a", "vipu-controller"):  # issued already; the site controller's own
        with pytest.raises(AlreadyExists, match=f"a controller named {name} has a certificate of this site already"):
            issue_link_certificate(files, name, tmp_path / f"again-{name}")
    agent = issue_link_certificate(files, "m01", tmp_path / "m01", hosts=["m01.rack1", "10.1.0.11"])
    names = x509.load_pem_x509_certificate(agent[0].read_bytes()).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert names.value.get_values_for_type(x509.DNSName) == ["m01.rack1"]
    (tmp_path / "users" / "ca.pem").parent.mkdir()
    (tmp_path / "users" / "ca.pem").write_bytes(files.ca_cert.read_bytes())  # another authority's, kept
    with pytest.raises(AlreadyExists, match="holds another authority's certificate"):
        issue_link_certificate(files, "tenant-b", tmp_path / "users")
    assert not (tmp_path / "users" / "controller.pem").exists()
