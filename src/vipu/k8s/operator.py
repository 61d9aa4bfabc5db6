"""`vipu-ipu-operator`: the IPUJob controller, written with kopf.

Every change to an IPUJob or to one of its pods, and a periodic resync, leads to one idempotent
reconciliation of that job (`reconcile`): read the job and its pods, let `jobs.decide` say what to
do, create and delete pods, write the status. Deleting a job runs the finaliser
`ipu.finalizers.graphcore.ai`: the proxy releases the job's partition (the finaliser stays until it
has), then the job's pods and objects are removed.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict

import click
import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from vipu.k8s import jobs, kube
from vipu.model.errors import InvalidArgument

log = logging.getLogger("vipu.k8s.operator")


class Operator:
    def __init__(self, api: client.ApiClient, wiring: jobs.Wiring, restart_backoff: float):
        self.core = client.CoreV1Api(api)
        self.rbac = client.RbacAuthorizationV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.wiring = wiring
        self.restart_backoff = restart_backoff
        self._locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)

    # Reconciliation

    def reconcile(self, namespace: str, name: str) -> None:
        with self._locks[f"{namespace}/{name}"]:
            try:
                job = self.custom.get_namespaced_custom_object(jobs.GROUP, jobs.VERSION, namespace, jobs.PLURAL, name)
            except ApiException as error:
                if error.status == 404:
                    return
                raise
            if job["metadata"].get("deletionTimestamp"):
                return
            status = job.get("status") or {}
            now = time.time()
            try:
                spec = jobs.parse(job)
            except InvalidArgument as error:
                self._write_status(namespace, name, status, {
                    **status, "conditions": jobs.with_condition(status, "Failed", "IPUJobInvalid",
                                                                f"IPUJob {namespace}/{name} has an invalid specification: {error.message}",
                                                                jobs.rfc3339(now))})
                return
            pods = {p.metadata.name: self.core.api_client.sanitize_for_serialization(p)
                    for p in self.core.list_namespaced_pod(namespace, label_selector=f"{jobs.JOB_LABEL}={name}").items}
            decision = jobs.decide(spec, status, pods, now, self.restart_backoff)
            for pod in decision.delete:
                self._ignore(404, self.core.delete_namespaced_pod, pod, namespace)
                log.info("job %s: pod %s deleted", spec.key, pod)
            if decision.create:
                self._ensure_job_objects(spec)
            for pod in decision.create:
                body = jobs.launcher_pod(spec, self.wiring) if pod == spec.launcher_name else \
                    jobs.worker_pod(spec, int(pod.rsplit("-", 1)[1]), self.wiring)
                self._ignore(409, self.core.create_namespaced_pod, namespace, body)
                log.info("job %s: pod %s created", spec.key, pod)
            self._write_status(namespace, name, status, decision.status)

    def _ensure_job_objects(self, spec: jobs.JobSpec) -> None:
        """The ConfigMap and the launcher's service account, role and binding, made once."""
        self._ignore(409, self.core.create_namespaced_config_map, spec.namespace, jobs.config_map(spec))
        account, role, binding = jobs.launcher_rbac(spec)
        self._ignore(409, self.core.create_namespaced_service_account, spec.namespace, account)
        self._ignore(409, self.rbac.create_namespaced_role, spec.namespace, role)
        self._ignore(409, self.rbac.create_namespaced_role_binding, spec.namespace, binding)

    def _write_status(self, namespace: str, name: str, before: dict, after: dict) -> None:
        if after == before:
            return
        gone = {key: None for key in before if key not in after}  # a merge patch removes keys set to null
        self._ignore(404, self.custom.patch_namespaced_custom_object_status, jobs.GROUP, jobs.VERSION, namespace,
                     jobs.PLURAL, name, {"status": {**after, **gone}})
        old, new = jobs.current_condition(before), jobs.current_condition(after)
        if new and (old or {}).get("message") != new.get("message"):
            log.info("%s", new["message"])

    # Deletion

    def release(self, namespace: str, name: str) -> None:
        """The finaliser's work: free the job's IPUs, then remove what the job was made of."""
        partition = jobs.partition_id(namespace, name)
        url = f"{self.wiring.proxy_url.rstrip('/')}/partitions/{partition}"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="DELETE"), timeout=60):
                log.info("job %s/%s: partition %s released", namespace, name, partition)
        except urllib.error.HTTPError as error:
            if error.code != 404:  # 404: the job never got a partition
                raise kopf.TemporaryError(f"the proxy could not release partition {partition}: HTTP {error.code}", delay=5) from None
        except (urllib.error.URLError, OSError) as error:
            raise kopf.TemporaryError(f"the proxy at {url} cannot be reached to release {partition}: {error}", delay=5) from None
        self.core.delete_collection_namespaced_pod(namespace, label_selector=f"{jobs.JOB_LABEL}={name}")
        launcher = f"{name}-launcher"
        self._ignore(404, self.core.delete_namespaced_config_map, f"{name}-ipujob", namespace)
        self._ignore(404, self.rbac.delete_namespaced_role_binding, launcher, namespace)
        self._ignore(404, self.rbac.delete_namespaced_role, launcher, namespace)
        self._ignore(404, self.core.delete_namespaced_service_account, launcher, namespace)

    @staticmethod
    def _ignore(status: int, call, *args):
        try:
            return call(*args)
        except ApiException as error:
            if error.status != status:
                raise
            return None


def register(registry: kopf.OperatorRegistry, operator: Operator, resync: float) -> None:
    """The operator's handlers, on a registry of their own (so that tests can run several)."""
    resource = (jobs.GROUP, jobs.VERSION, jobs.PLURAL)

    @kopf.on.login(registry=registry)
    def login(**kwargs):
        return kopf.login_via_client(**kwargs)  # in a pod its service account, elsewhere KUBECONFIG

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_):
        settings.persistence.finalizer = jobs.FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="ipu.graphcore.ai")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="ipu.graphcore.ai")
        settings.posting.level = logging.WARNING

    @kopf.on.event(*resource, registry=registry)
    def job_changed(namespace, name, **_):
        operator.reconcile(namespace, name)

    @kopf.on.event("", "v1", "pods", labels={jobs.JOB_LABEL: kopf.PRESENT}, registry=registry)
    def pod_changed(namespace, labels, **_):
        operator.reconcile(namespace, labels[jobs.JOB_LABEL])

    @kopf.timer(*resource, interval=resync, registry=registry)
    def resync_job(namespace, name, **_):
        operator.reconcile(namespace, name)

    @kopf.on.delete(*resource, registry=registry)
    def job_deleted(namespace, name, **_):
        operator.release(namespace, name)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--vipu-host", required=True, envvar="VIPU_SERVER_ADDR", help="vipu-server's host, as the workers reach it.")
@click.option("--vipu-port", type=click.IntRange(1, 65535), default=8090, show_default=True, envvar="VIPU_SERVER_PORT")
@click.option("--proxy-url", required=True, envvar="VIPU_PROXY_URL", help="The V-IPU proxy, as launchers reach it.")
@click.option("--launcher-image", default="launcher:latest", show_default=True, envvar="LAUNCHER_IMAGE",
              help="Image of the launcher's init container (it runs vipu-ipujob-init).")
@click.option("--restart-backoff", type=click.FloatRange(0), default=10.0, show_default=True,
              help="Seconds before a job's first restart; each further restart waits twice as long.")
@click.option("--resync", type=click.FloatRange(0.1), default=10.0, show_default=True,
              help="Seconds between reconciliations of a job when nothing happens to it.")
@click.option("--namespace", "namespaces", multiple=True, help="Watch only these namespaces. Default: all.")
def main(vipu_host, vipu_port, proxy_url, launcher_image, restart_backoff, resync, namespaces):
    """The IPUJob operator."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kopf").setLevel(logging.WARNING)
    wiring = jobs.Wiring(vipu_host, vipu_port, proxy_url, launcher_image)
    registry = kopf.OperatorRegistry()
    register(registry, Operator(kube.api_client(), wiring, restart_backoff), resync)
    log.info("watching IPUJobs in %s", ", ".join(namespaces) if namespaces else "all namespaces")
    kopf.run(registry=registry, standalone=True, clusterwide=not namespaces, namespaces=namespaces)

