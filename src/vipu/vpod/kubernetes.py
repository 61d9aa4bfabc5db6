"""Tenants' controllers as Kubernetes Deployments, when vipu-vpod is given a namespace.

Each vPOD gets three objects in that namespace, all named `vpod-<slug>-<hash>` (a DNS label made
from its id, which may hold characters a label may not) and labelled with that name:

- a Secret: the URL of its store and the certificates its controller serves with (its server's
  and its agent-link certificate, not the key of its users' authority, which stays with the
  orchestrator);
- a Deployment of one replica running `vipu-server --secure --ha` from the site's image, as a user
  that is not root. Kubernetes may start a pod's replacement before the old pod has ended (an
  eviction, a node cut off): with `--ha` the two share the store's lease, so only one serves and
  writes, and the readiness probe (`/readyz`) sends clients to that one;
- a Service in front of its user, admin and metrics ports.

Its store is a PostgreSQL database and role of its own (`vipu.store.databases`), since nothing
in a pod outlives it. Kubernetes starts the controller again when its pod dies, and the
orchestrator's supervisor makes the Deployment again if someone deletes it; each start applies
the objects again, so that a new image reaches every tenant when vipu-vpod starts with it. The
orchestrator and the tenant's users reach each controller at its Service's name
(`NAME.NAMESPACE.svc`), or at `controller_host` where the Services are exposed another way.
Every call to the API server has a deadline, and one that fails is Unavailable, as is a store
that does not answer.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from vipu.api.tls import TlsFiles
from vipu.k8s import kube
from vipu.model.errors import InvalidArgument, Unavailable
from vipu.store.databases import server_url
from vipu.vpod.store import Vpod
from vipu.vpod.tenants import SERVER_PROGRAM, STOP_DEADLINE_SECONDS, DatabasePerVpod

log = logging.getLogger(__name__)

NAME_LABEL = "vipu.graphcore.ai/vpod"
ID_ANNOTATION = "vipu.graphcore.ai/vpod-id"
CERTS_PATH = "/etc/vipu/certs"
DATA_PATH = "/var/lib/vipu"
STORE_KEY = "store-url"
RUN_AS = 10001  # the controller's user and group in its container; the Secret's files are readable by that group
GRACE_SECONDS = 30
API_DEADLINE = (5, 30)  # seconds to connect to the API server, and for its answer
PORT_NAMES = ("user", "admin", "metrics")
# Why a pod's container does not start, as the kubelet reports it: waiting longer will not help.
STUCK = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError",
         "CrashLoopBackOff", "RunContainerError"}

T = TypeVar("T")


def object_name(vpod_id: str) -> str:
    """The name of a vPOD's objects: a DNS label, the same for the same id, different for others."""
    slug = re.sub(r"[^a-z0-9-]+", "-", vpod_id.lower()).strip("-")[:40].rstrip("-")
    digest = hashlib.sha256(vpod_id.encode()).hexdigest()[:8]
    return f"vpod-{slug}-{digest}" if slug else f"vpod-{digest}"


def secret_key(relative: Path) -> str:
    """A certificate file's key in the Secret, which holds no '/'."""
    return "__".join(relative.parts)


def _api_client() -> client.ApiClient:
    """The API server, as every Kubernetes part of vipu finds it; a one-line refusal without one."""
    try:
        return kube.api_client()
    except (config.ConfigException, OSError) as error:
        raise InvalidArgument(f"cannot reach Kubernetes: {error}; set KUBECONFIG, or run vipu-vpod in a pod") from None


class KubernetesControllers(DatabasePerVpod):
    start_deadline_seconds = 300.0  # a first image pull takes a while

    def __init__(self, root: Path, site: TlsFiles, site_id: str, namespace: str, image: str, store_server: str,
                 controller_host: str | None = None, api: client.ApiClient | None = None):
        """`site_id`: this orchestrator's, marking the databases it makes; `store_server`: a
        PostgreSQL server URL whose user may create databases and roles; `controller_host`: where
        every controller is reached instead of its Service's name."""
        super().__init__(root, site)
        self.site_id = site_id
        self.namespace = namespace
        self.image = image
        self.store_server = server_url(store_server)
        self.controller_host = controller_host
        api = api or _api_client()
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)

    def _call(self, what: str, call: Callable[..., T], *args, missing_ok: bool = False, **kwargs) -> T | None:
        """One API call with a deadline; None if the object is missing and that is fine; Unavailable
        when the API server refuses or cannot be reached."""
        try:
            return call(*args, _request_timeout=API_DEADLINE, **kwargs)
        except ApiException as error:
            if missing_ok and error.status == 404:
                return None
            raise Unavailable(f"cannot {what} in namespace {self.namespace}: {_reason(error)}") from None
        except urllib3.exceptions.HTTPError as error:
            raise Unavailable(f"cannot {what}: the Kubernetes API server does not answer ({error})") from None

    # Where things are

    def host(self, vpod_id: str) -> str:
        return self.controller_host or f"{object_name(vpod_id)}.{self.namespace}.svc"

    def tls_hosts(self, vpod_id: str) -> str:
        name, namespace = object_name(vpod_id), self.namespace
        names = ["localhost", "127.0.0.1", name, f"{name}.{namespace}", f"{name}.{namespace}.svc",
                 f"{name}.{namespace}.svc.cluster.local", self.host(vpod_id)]
        return ",".join(dict.fromkeys(names))

    # Life

    def _deployment(self, vpod_id: str):
        """The vPOD's Deployment, or None; Unavailable if the API server cannot tell."""
        return self._call("read a Deployment", self.apps.read_namespaced_deployment, object_name(vpod_id), self.namespace,
                          missing_ok=True)

    def alive(self, vpod_id: str) -> bool:
        """Whether its Deployment is there (Kubernetes keeps it running); an API server that does
        not answer counts as alive, so that nothing is made again blindly."""
        try:
            deployment = self._deployment(vpod_id)
        except Unavailable as error:
            log.warning("vPOD %s: %s", vpod_id, error.message)
            return True
        return deployment is not None and (deployment.metadata is None or deployment.metadata.deletion_timestamp is None)

    def start(self, vpod: Vpod) -> None:
        """Apply the vPOD's objects whether its controller runs or not (a new image or certificate
        reaches it so), then wait until it answers."""
        with self._lock(vpod.id):
            self._stopping.discard(vpod.id)
            self._launch(vpod)
        self.wait_ready(vpod.id)

    def _why_not_ready(self, vpod_id: str) -> str | None:
        if not self.alive(vpod_id):
            return "has no Deployment"
        for pod in self._pods(vpod_id):
            for status in pod.get("status", {}).get("containerStatuses") or []:
                waiting = status.get("state", {}).get("waiting") or {}
                if waiting.get("reason") in STUCK:
                    return (f"cannot start in pod {pod['metadata']['name']}: {waiting['reason']}: "
                            f"{waiting.get('message') or 'no message'}")
        return None

    def _pods(self, vpod_id: str) -> list[dict]:
        """The vPOD's pods, as the API server's JSON."""
        listed = self._call("list pods", self.core.list_namespaced_pod, self.namespace,
                            label_selector=f"{NAME_LABEL}={object_name(vpod_id)}")
        return self.core.api_client.sanitize_for_serialization(listed)["items"] if listed is not None else []

    def _launch(self, vpod: Vpod) -> None:
        name = object_name(vpod.id)
        metadata = {"name": name, "namespace": self.namespace, "labels": {NAME_LABEL: name},
                    "annotations": {ID_ANNOTATION: vpod.id}}
        tls = self.tls(vpod.id)
        files = sorted(path.relative_to(tls.root) for directory in (tls.server_dir, tls.controller_dir)
                       for path in directory.iterdir() if path.is_file())
        data = {secret_key(f): (tls.root / f).read_bytes() for f in files} | {STORE_KEY: self.db_url(vpod.id).encode()}
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "type": "Opaque",
                  "data": {key: base64.b64encode(value).decode() for key, value in data.items()}}
        if self._call("read a Secret", self.core.read_namespaced_secret, name, self.namespace, missing_ok=True) is None:
            self._call("make a Secret", self.core.create_namespaced_secret, self.namespace, secret)
        else:  # replaced whole: a key left from before must not linger
            self._call("replace a Secret", self.core.replace_namespaced_secret, name, self.namespace, secret)
        ports = [{"name": port_name, "port": port, "targetPort": port} for port_name, port in zip(PORT_NAMES, vpod.ports, strict=True)]
        self._apply("Service", self.core.create_namespaced_service, self.core.patch_namespaced_service, name, {
            "apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": {"selector": {NAME_LABEL: name}, "ports": ports}})
        self._apply("Deployment", self.apps.create_namespaced_deployment, self.apps.patch_namespaced_deployment, name,
                    self._deployment_of(vpod, metadata, files))
        log.info("vPOD %s: Deployment %s/%s applied (user port %d, admin port %d)", vpod.id, self.namespace, name, *vpod.ports[:2])

    def _deployment_of(self, vpod: Vpod, metadata: dict, files: list[Path]) -> dict:
        user_port, admin_port, metrics_port = vpod.ports
        container = {
            "name": "vipu-server", "image": self.image,
            "command": [SERVER_PROGRAM, "--secure", "--ha", "--tls-dir", CERTS_PATH, "--data-dir", DATA_PATH,
                        "--listen-address", "0.0.0.0", "--advertise-address", self.host(vpod.id), "--port", str(user_port),
                        "--admin-port", str(admin_port), "--metrics-port", str(metrics_port)],
            "env": [{"name": "VIPU_SERVER_DB", "valueFrom": {"secretKeyRef": {"name": metadata["name"], "key": STORE_KEY}}}],
            "ports": [{"name": port_name, "containerPort": port} for port_name, port in zip(PORT_NAMES, vpod.ports, strict=True)],
            "volumeMounts": [{"name": "certs", "mountPath": CERTS_PATH, "readOnly": True}, {"name": "data", "mountPath": DATA_PATH}],
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": metrics_port}, "periodSeconds": 2},
            "livenessProbe": {"tcpSocket": {"port": metrics_port}, "periodSeconds": 10, "failureThreshold": 6},
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        }
        pod = {"containers": [container], "terminationGracePeriodSeconds": GRACE_SECONDS, "automountServiceAccountToken": False,
               "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS},
               "volumes": [{"name": "certs", "secret": {"secretName": metadata["name"], "defaultMode": 0o440,
                                                         "items": [{"key": secret_key(f), "path": str(f)} for f in files]}},
                           {"name": "data", "emptyDir": {}}]}
        return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata,
                "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": metadata["labels"]},
                         "template": {"metadata": {"labels": metadata["labels"], "annotations": metadata["annotations"]},
                                      "spec": pod}}}

    def _apply(self, kind: str, create, patch, name: str, body: dict) -> None:
        """Make the object, or bring the one of its name an earlier start made up to date."""
        try:
            create(self.namespace, body, _request_timeout=API_DEADLINE)
        except ApiException as error:
            if error.status != 409:
                raise Unavailable(f"cannot make {kind} {self.namespace}/{name}: {_reason(error)}") from None
            self._call(f"update {kind} {name}", patch, name, self.namespace, body)
        except urllib3.exceptions.HTTPError as error:
            raise Unavailable(f"cannot make {kind} {self.namespace}/{name}: the Kubernetes API server does not answer ({error})") from None

    def _halt(self, vpod_id: str) -> None:
        """Delete the Deployment, wait for its pods to end, delete the Service and the Secret, and
        close the tenant's database (kept, its role no longer able to log in)."""
        name = object_name(vpod_id)
        self._call("delete a Deployment", self.apps.delete_namespaced_deployment, name, self.namespace,
                   propagation_policy="Foreground", missing_ok=True)
        deadline = time.monotonic() + STOP_DEADLINE_SECONDS + GRACE_SECONDS
        while self._deployment(vpod_id) is not None or self._pods(vpod_id):
            if time.monotonic() > deadline:
                raise Unavailable(f"the pods of Deployment {self.namespace}/{name} did not end within "
                                  f"{STOP_DEADLINE_SECONDS + GRACE_SECONDS:.0f} s")
            time.sleep(0.2)
        self._call("delete a Service", self.core.delete_namespaced_service, name, self.namespace, missing_ok=True)
        self._call("delete a Secret", self.core.delete_namespaced_secret, name, self.namespace, missing_ok=True)
        self._close_store(vpod_id)

    def _reap(self) -> None:
        """Kubernetes collects its pods."""


def _reason(error: ApiException) -> str:
    """The API server's message, else its reason."""
    try:
        return json.loads(error.body or "{}").get("message") or str(error.reason)
    except ValueError:
        return str(error.reason)
