"""Tenants' controllers as Kubernetes Deployments, when vipu-vpod is given a namespace.

Each vPOD gets three objects in that namespace, all named `vpod-<slug>-<hash>` (a DNS label made
from its id, which may hold characters a label may not) and labelled with that name:

- a Secret: the controller's certificates, which the orchestrator prepared in the vPOD's
  directory as for a local controller, and the URL of its store;
- a Deployment of one replica running `vipu-server --secure` from the site's image. Its strategy
  is Recreate, so that two controllers never serve one store, and its store is a PostgreSQL
  database of its own (`vipu.store.databases`), since nothing in a pod outlives it;
- a Service in front of its user, admin and metrics ports.

Kubernetes starts the controller again when its pod dies, and the orchestrator's supervisor makes
the Deployment again if someone deletes it. The orchestrator and the tenant's users reach each
controller at its Service's name (`NAME.NAMESPACE.svc`), or at `controller_host` where the
Services are exposed some other way.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import time
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from vipu.api.tls import TlsFiles
from vipu.k8s.kube import api_client
from vipu.model.errors import Unavailable
from vipu.store.databases import database_url, make_database, server_url
from vipu.store.vpods import Vpod
from vipu.vpod.tenants import SERVER_PROGRAM, STOP_DEADLINE_SECONDS, TenantControllers, controller_name

log = logging.getLogger(__name__)

NAME_LABEL = "vipu.graphcore.ai/vpod"
ID_ANNOTATION = "vipu.graphcore.ai/vpod-id"
CERTS_PATH = "/etc/vipu/certs"
DATA_PATH = "/var/lib/vipu"
STORE_KEY = "store-url"
GRACE_SECONDS = 30
PORT_NAMES = ("user", "admin", "metrics")


def object_name(vpod_id: str) -> str:
    """The name of a vPOD's objects: a DNS label, the same for the same id, different for others."""
    slug = re.sub(r"[^a-z0-9-]+", "-", vpod_id.lower()).strip("-")[:40].rstrip("-")
    digest = hashlib.sha256(vpod_id.encode()).hexdigest()[:8]
    return f"vpod-{slug}-{digest}" if slug else f"vpod-{digest}"


def secret_key(relative: Path) -> str:
    """A certificate file's key in the Secret, which holds no '/'."""
    return "__".join(relative.parts)


class KubernetesControllers(TenantControllers):
    def __init__(self, root: Path, site: TlsFiles, namespace: str, image: str, store_server: str,
                 controller_host: str | None = None, api: client.ApiClient | None = None):
        """`store_server`: a PostgreSQL server URL whose user may create databases; `controller_host`:
        where every controller is reached instead of its Service's name."""
        super().__init__(root, site)
        self.namespace = namespace
        self.image = image
        self.store_server = server_url(store_server)
        self.controller_host = controller_host
        api = api or api_client()
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)

    # Where things are

    def host(self, vpod_id: str) -> str:
        return self.controller_host or f"{object_name(vpod_id)}.{self.namespace}.svc"

    def tls_hosts(self, vpod_id: str) -> str:
        name, namespace = object_name(vpod_id), self.namespace
        names = ["localhost", "127.0.0.1", name, f"{name}.{namespace}", f"{name}.{namespace}.svc",
                 f"{name}.{namespace}.svc.cluster.local", self.host(vpod_id)]
        return ",".join(dict.fromkeys(names))

    def db_url(self, vpod_id: str) -> str:
        return database_url(self.store_server, controller_name(vpod_id))

    def _fresh_store(self, vpod_id: str) -> None:
        make_database(self.store_server, controller_name(vpod_id))

    # Life

    def alive(self, vpod_id: str) -> bool:
        """Whether its Deployment is there (Kubernetes keeps it running); an API server that does
        not answer counts as alive, so that nothing is made again blindly."""
        try:
            deployment = self.apps.read_namespaced_deployment(object_name(vpod_id), self.namespace)
        except ApiException as error:
            if error.status == 404:
                return False
            log.warning("vPOD %s: cannot read its Deployment: %s", vpod_id, error.reason)
            return True
        return deployment.metadata is None or deployment.metadata.deletion_timestamp is None

    def _why_not_ready(self, vpod_id: str) -> str | None:
        return None if self.alive(vpod_id) else "has no Deployment"

    def _launch(self, vpod: Vpod) -> None:
        name = object_name(vpod.id)
        metadata = {"name": name, "namespace": self.namespace, "labels": {NAME_LABEL: name},
                    "annotations": {ID_ANNOTATION: vpod.id}}
        certificates = self.tls(vpod.id).root
        files = sorted(path.relative_to(certificates) for path in certificates.rglob("*") if path.is_file())
        data = {secret_key(f): (certificates / f).read_bytes() for f in files} | {STORE_KEY: self.db_url(vpod.id).encode()}
        self._apply(self.core.create_namespaced_secret, self.core.patch_namespaced_secret, name, {
            "apiVersion": "v1", "kind": "Secret", "metadata": metadata, "type": "Opaque",
            "data": {key: base64.b64encode(value).decode() for key, value in data.items()}})
        ports = [{"name": port_name, "port": port, "targetPort": port} for port_name, port in zip(PORT_NAMES, vpod.ports, strict=True)]
        self._apply(self.core.create_namespaced_service, self.core.patch_namespaced_service, name, {
            "apiVersion": "v1", "kind": "Service", "metadata": metadata,
            "spec": {"selector": {NAME_LABEL: name}, "ports": ports}})
        self._apply(self.apps.create_namespaced_deployment, self.apps.patch_namespaced_deployment, name,
                    self._deployment(vpod, metadata, [secret_key(f) for f in files], files))
        log.info("vPOD %s: Deployment %s/%s made (user port %d, admin port %d)", vpod.id, self.namespace, name, *vpod.ports[:2])

    def _deployment(self, vpod: Vpod, metadata: dict, keys: list[str], files: list[Path]) -> dict:
        user_port, admin_port, metrics_port = vpod.ports
        container = {
            "name": "vipu-server", "image": self.image,
            "command": [SERVER_PROGRAM, "--secure", "--tls-dir", CERTS_PATH, "--data-dir", DATA_PATH, "--listen-address", "0.0.0.0",
                        "--port", str(user_port), "--admin-port", str(admin_port), "--metrics-port", str(metrics_port)],
            "env": [{"name": "VIPU_SERVER_DB", "valueFrom": {"secretKeyRef": {"name": metadata["name"], "key": STORE_KEY}}}],
            "ports": [{"name": port_name, "containerPort": port} for port_name, port in zip(PORT_NAMES, vpod.ports, strict=True)],
            "volumeMounts": [{"name": "certs", "mountPath": CERTS_PATH, "readOnly": True}, {"name": "data", "mountPath": DATA_PATH}],
            "readinessProbe": {"tcpSocket": {"port": admin_port}, "periodSeconds": 5},
        }
        pod = {"containers": [container], "terminationGracePeriodSeconds": GRACE_SECONDS, "automountServiceAccountToken": False,
               "volumes": [{"name": "certs", "secret": {"secretName": metadata["name"], "defaultMode": 0o400,
                                                         "items": [{"key": k, "path": str(f)} for k, f in zip(keys, files, strict=True)]}},
                           {"name": "data", "emptyDir": {}}]}
        return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata,
                "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": metadata["labels"]},
                         "template": {"metadata": {"labels": metadata["labels"], "annotations": metadata["annotations"]},
                                      "spec": pod}}}

    def _apply(self, create, patch, name: str, body: dict) -> None:
        """Make the object, or bring the one of its name an earlier attempt made up to date."""
        try:
            try:
                create(self.namespace, body)
            except ApiException as error:
                if error.status != 409:
                    raise
                patch(name, self.namespace, body)
        except ApiException as error:
            raise Unavailable(f"cannot make {body['kind']} {self.namespace}/{name}: {_reason(error)}") from None

    def _halt(self, vpod_id: str) -> None:
        """Delete the Deployment, wait for its pods to end, then delete the Service and the Secret."""
        name = object_name(vpod_id)
        selector = f"{NAME_LABEL}={name}"
        try:
            self.apps.delete_namespaced_deployment(name, self.namespace, propagation_policy="Foreground")
        except ApiException as error:
            if error.status != 404:
                raise Unavailable(f"cannot delete Deployment {self.namespace}/{name}: {_reason(error)}") from None
        deadline = time.monotonic() + STOP_DEADLINE_SECONDS + GRACE_SECONDS
        while self.alive(vpod_id) or self.core.list_namespaced_pod(self.namespace, label_selector=selector).items:
            if time.monotonic() > deadline:
                raise Unavailable(f"the pods of Deployment {self.namespace}/{name} did not end within "
                                  f"{STOP_DEADLINE_SECONDS + GRACE_SECONDS:.0f} s")
            time.sleep(0.2)
        for delete in (self.core.delete_namespaced_service, self.core.delete_namespaced_secret):
            try:
                delete(name, self.namespace)
            except ApiException as error:
                if error.status != 404:
                    raise Unavailable(f"cannot delete {name} in {self.namespace}: {_reason(error)}") from None

    def _reap(self) -> None:
        """Kubernetes collects its pods."""


def _reason(error: ApiException) -> str:
    """The API server's message, else its reason."""
    try:
        return json.loads(error.body or "{}").get("message") or str(error.reason)
    except ValueError:
        return str(error.reason)
