"""The patch jobs' command: the certificate carries the Service's names and is kept once made;
the webhook configurations get its authority; an API server's refusal is one line and exit 1."""

from __future__ import annotations

import base64

import pytest
from click.testing import CliRunner
from cryptography import x509
from kubernetes.client.exceptions import ApiException

from vipu.k8s import webhook_certs


class Secrets:
    """A CoreV1Api's Secrets, kept in a dict: the neighbour the command writes to."""

    def __init__(self):
        self.stored = {}

    def create_namespaced_secret(self, namespace, body):
        key = (namespace, body.metadata.name)
        if key in self.stored:
            raise ApiException(status=409, reason="Conflict")
        self.stored[key] = body

    def read_namespaced_secret(self, name, namespace):
        return self.stored[(namespace, name)]


def test_the_certificate_names_the_service_and_is_made_once():
    secrets = Secrets()
    assert webhook_certs.create(secrets, "gc-webhook-tls", "ipu", "gc-webhook") is True
    made = secrets.stored[("ipu", "gc-webhook-tls")]
    certificate = x509.load_pem_x509_certificate(base64.b64decode(made.data["tls.crt"]))
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert names == ["gc-webhook", "gc-webhook.ipu", "gc-webhook.ipu.svc", "gc-webhook.ipu.svc.cluster.local"]
    authority = x509.load_pem_x509_certificate(base64.b64decode(made.data["ca.crt"]))
    assert certificate.issuer == authority.subject and made.type == "kubernetes.io/tls"
    assert webhook_certs.create(secrets, "gc-webhook-tls", "ipu", "gc-webhook") is False  # an upgrade keeps it
    assert secrets.stored[("ipu", "gc-webhook-tls")] is made


def test_every_webhook_of_the_named_configurations_trusts_the_authority():
    secrets, patched = Secrets(), []
    webhook_certs.create(secrets, "tls", "ipu", "svc")

    class Hook:
        def __init__(self, name):
            self.name = name

    class Admission:
        def read_mutating_webhook_configuration(self, name):
            return type("Configuration", (), {"webhooks": [Hook("a"), Hook("b")]})

        read_validating_webhook_configuration = read_mutating_webhook_configuration

        def patch_mutating_webhook_configuration(self, name, body, _content_type):
            patched.append(("mutating", name, body, _content_type))

        def patch_validating_webhook_configuration(self, name, body, _content_type):
            patched.append(("validating", name, body, _content_type))

    webhook_certs.patch(secrets, Admission(), "tls", "ipu", ["m1"], ["v1"])
    bundle = secrets.stored[("ipu", "tls")].data["ca.crt"]
    hooks = [{"name": "a", "clientConfig": {"caBundle": bundle}}, {"name": "b", "clientConfig": {"caBundle": bundle}}]
    merge = "application/strategic-merge-patch+json"  # by name: the rest of each webhook is kept
    assert patched == [("mutating", "m1", {"webhooks": hooks}, merge), ("validating", "v1", {"webhooks": hooks}, merge)]


def test_an_api_servers_refusal_is_one_line(monkeypatch):
    def refused(*args):
        raise ApiException(status=403, reason="Forbidden")

    monkeypatch.setattr(webhook_certs, "create", refused)
    monkeypatch.setattr(webhook_certs.kube, "api_client", lambda: None)
    result = CliRunner().invoke(webhook_certs.main, ["create", "--secret", "s", "--service", "svc", "--namespace", "ipu"])
    assert result.exit_code == 1
    assert result.output.strip() == "vipu-ipu-webhook-certs: create certificate (secret ipu/s): failed: 403 Forbidden."


@pytest.mark.parametrize("missing", [["--secret", "s"], ["--service", "svc"]])
def test_create_needs_the_secret_and_the_service(missing):
    assert CliRunner().invoke(webhook_certs.main, ["create", *missing]).exit_code == 2
