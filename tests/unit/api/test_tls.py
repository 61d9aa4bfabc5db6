"""A client's certificate and key are checked before connecting, so that what the server would
refuse without a reason is refused with one."""

from __future__ import annotations

import pytest

from vipu.api.tls import TlsFiles, check_client_pair, generate
from vipu.model.errors import InvalidArgument


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
