"""`vipu-ipu-webhook-certs`: the admission webhooks' TLS certificate, made by the chart's patch jobs.

The API server calls the webhooks over TLS and trusts them by the authority named in each webhook
configuration's `caBundle`. As the seed's chart does with its patch image, two jobs of the Helm
release do this, so that no key is ever in Helm's manifests or its release history:

- `create`, before the install: makes an authority and a server certificate for the webhook
  Service's names and stores them in a Secret (kept if it is there already, so that upgrades and
  re-runs change nothing);
- `patch`, after the install or an upgrade: writes the Secret's authority into the `caBundle` of
  every webhook of the named configurations.
"""

from __future__ import annotations

import base64
import logging
import sys

import click
import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from vipu.api import tls
from vipu.k8s import kube

log = logging.getLogger("vipu.k8s.webhook_certs")
AUTHORITY_KEY = "ca.crt"


def service_names(service: str, namespace: str) -> list[str]:
    """The names the API server may use for a Service: short, with namespace, and the cluster's."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def certificate_secret(name: str, namespace: str, service: str) -> client.V1Secret:
    """A new `kubernetes.io/tls` Secret: the server's certificate and key, and the authority's certificate."""
    authority_key, authority = tls.make_authority(f"{service} webhook authority")
    key, certificate = tls.issue(authority_key, authority, service, server_names=service_names(service, namespace))
    data = {"tls.crt": certificate, "tls.key": key, AUTHORITY_KEY: authority}
    return client.V1Secret(metadata=client.V1ObjectMeta(name=name, namespace=namespace), type="kubernetes.io/tls",
                           data={key: base64.b64encode(value).decode() for key, value in data.items()})


def create(core: client.CoreV1Api, name: str, namespace: str, service: str) -> bool:
    """Store a new certificate in the Secret unless it exists; True when one was made."""
    try:
        core.create_namespaced_secret(namespace, certificate_secret(name, namespace, service))
    except ApiException as error:
        if error.status == 409:
            return False
        raise
    return True


def patch(core: client.CoreV1Api, admission: client.AdmissionregistrationV1Api, name: str, namespace: str,
          mutating: list[str], validating: list[str]) -> None:
    """Put the Secret's authority into every webhook of the named configurations."""
    bundle = (core.read_namespaced_secret(name, namespace).data or {}).get(AUTHORITY_KEY)
    if not bundle:
        raise click.ClickException(f"secret {namespace}/{name} holds no {AUTHORITY_KEY}: it is not the create job's")
    kinds = ((mutating, admission.read_mutating_webhook_configuration, admission.patch_mutating_webhook_configuration),
             (validating, admission.read_validating_webhook_configuration, admission.patch_validating_webhook_configuration))
    for names, read, write in kinds:
        for configuration in names:
            hooks = read(configuration).webhooks or []
            # A strategic merge: the webhooks list merges by name, so only each one's caBundle changes
            write(configuration, {"webhooks": [{"name": hook.name, "clientConfig": {"caBundle": bundle}} for hook in hooks]},
                  _content_type="application/strategic-merge-patch+json")
            log.info("webhook configuration %s trusts the authority of Secret %s/%s", configuration, namespace, name)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """The admission webhooks' TLS certificate (the chart's patch jobs)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@main.command("create")
@click.option("--secret", required=True, help="The Secret to hold the certificate.")
@click.option("--service", required=True, help="The webhooks' Service, whose names the certificate carries.")
@click.option("--namespace", default=None, help="Of both. Default: this pod's.")
def create_command(secret, service, namespace):
    """Make the certificate and its authority into SECRET, unless it exists."""
    namespace = namespace or kube.namespace_of_this_pod()
    made = _reporting(lambda: create(client.CoreV1Api(kube.api_client()), secret, namespace, service),
                      f"create certificate (secret {namespace}/{secret})")
    log.info("secret %s/%s %s", namespace, secret, "made" if made else "exists: kept")


@main.command("patch")
@click.option("--secret", required=True, help="The Secret holding the authority (ca.crt).")
@click.option("--namespace", default=None, help="The Secret's. Default: this pod's.")
@click.option("--mutating", multiple=True, help="A MutatingWebhookConfiguration to patch (repeatable).")
@click.option("--validating", multiple=True, help="A ValidatingWebhookConfiguration to patch (repeatable).")
def patch_command(secret, namespace, mutating, validating):
    """Make the webhook configurations trust SECRET's authority."""
    namespace = namespace or kube.namespace_of_this_pod()
    api = kube.api_client()
    _reporting(lambda: patch(client.CoreV1Api(api), client.AdmissionregistrationV1Api(api), secret, namespace,
                             list(mutating), list(validating)), f"patch webhook configurations (secret {namespace}/{secret})")


def _reporting(action, what: str):
    """The action's result; an API server's refusal in one line and exit status 1."""
    try:
        return action()
    except ApiException as error:
        reason = f"{error.status} {error.reason}"
    except (urllib3.exceptions.HTTPError, config.ConfigException) as error:  # no API server, or no credentials for it
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    print(f"vipu-ipu-webhook-certs: {what}: failed: {reason}.", file=sys.stderr)
    sys.exit(1)
