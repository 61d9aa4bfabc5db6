"""`vipu-ipu-operator`: the IPUJob controller, written with kopf.

Every change to an IPUJob or to one of its pods, and a periodic resync, leads to one idempotent
reconciliation of that job (`reconcile`): read the job and its pods, let `jobs.decide` say what to
do, create and delete pods, write the status. Deleting a job runs the finaliser
`ipu.finalizers.graphcore.ai`: the proxy releases the job's partition (the finaliser stays until it
has), then the job's pods and objects are removed.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import typing
import uuid
from collections import defaultdict
from pathlib import Path

import click
import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter, Gauge

from vipu.k8s import endpoints, jobs, kube, rest
from vipu.k8s.leader import LeaderElection
from vipu.model.errors import InvalidArgument

log = logging.getLogger("vipu.k8s.operator")
DRAINS_TIMEOUT = 5.0  # seconds a reconciliation waits for the proxy to say whether the job's partition is drained
# Seconds a job's drain notices, once read, answer its reconciliations: a burst of pod events asks
# the proxy once.
DRAINS_FRESH_SECONDS = 5.0


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.reconciliations = Counter("vipu_ipujob_reconciliations", "Reconciliations of IPUJobs", registry=registry)
        self.pods_created = Counter("vipu_ipujob_pods_created", "Pods created for IPUJobs", ["role"], registry=registry)
        self.restarts = Counter("vipu_ipujob_restarts", "Restarts of IPUJobs under their restart policy", registry=registry)
        self.releases = Counter("vipu_ipujob_partition_releases", "Partitions released when IPUJobs were deleted", registry=registry)
        self.jobs = Gauge("vipu_ipujobs", "IPUJobs by their current condition", ["condition"], registry=registry)
        self.leader = Gauge("vipu_ipujob_operator_leader", "1 while this replica leads", registry=registry)
        self._conditions: dict[str, str] = {}

    def job_condition(self, key: str, condition: str | None) -> None:
        if condition is None:
            self._conditions.pop(key, None)
        else:
            self._conditions[key] = condition
        for kind in ("Pending", "Running", "Succeeded", "Failed"):
            self.jobs.labels(kind).set(sum(c == kind for c in self._conditions.values()))


class Operator:
    def __init__(self, api: client.ApiClient, wiring: jobs.Wiring, restart_backoff: float, metrics: OperatorMetrics):
        self.metrics = metrics
        self.core = client.CoreV1Api(api)
        self.rbac = client.RbacAuthorizationV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.wiring = wiring
        self.restart_backoff = restart_backoff
        self._locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
        self._drains_read: dict[str, tuple[float, list[str]]] = {}  # job -> when its drain notices were read (monotonic), and them

    # Reconciliation

    def reconcile(self, namespace: str, name: str) -> None:
        with self._locks[f"{namespace}/{name}"]:
            try:
                job = typing.cast(dict, self.custom.get_namespaced_custom_object(  # the object's JSON, as a dict
                    jobs.GROUP, jobs.VERSION, namespace, jobs.PLURAL, name))
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
            controller = jobs.controller_of(status)
            if controller is None and not jobs.is_finished(status):
                chosen, why = self._choose_controller(spec)
                if chosen is None:  # no pods until a controller has room: the job queues
                    self._write_status(namespace, name, status, {
                        **status, "startTime": status.get("startTime") or jobs.rfc3339(now),
                        "conditions": jobs.with_condition(status, "Pending", "IPUJobPending",
                                                          f"IPUJob {spec.key} is waiting for a V-IPU controller with room: {why}",
                                                          jobs.rfc3339(now))})
                    return
                controller = jobs.controller_of({"controller": chosen})
            pods = {p.metadata.name: self.core.api_client.sanitize_for_serialization(p)
                    for p in self.core.list_namespaced_pod(namespace, label_selector=f"{jobs.JOB_LABEL}={name}").items
                    if p.metadata is not None and p.metadata.name is not None}  # the API server names every pod
            decision = jobs.decide(spec, status, pods, now, self.restart_backoff)
            self.metrics.reconciliations.inc()
            if decision.status.get("restartCount", 0) > status.get("restartCount", 0):
                self.metrics.restarts.inc()
            self.metrics.job_condition(spec.key, (jobs.current_condition(decision.status) or {}).get("type"))
            if controller is not None:
                decision.status["controller"] = controller.describe()
            for pod in decision.delete:
                self._ignore(404, self.core.delete_namespaced_pod, pod, namespace)
                log.info("job %s: pod %s deleted", spec.key, pod)
            if decision.create:
                self._ensure_job_objects(spec)
            for pod in decision.create:
                if controller is None:  # decide creates pods only for a job placed on a controller
                    raise RuntimeError(f"job {spec.key}: pod {pod} to create, but no V-IPU controller chosen")
                body = jobs.launcher_pod(spec, self.wiring, controller) if pod == spec.launcher_name else \
                    jobs.worker_pod(spec, int(pod.rsplit("-", 1)[1]), controller)
                if self._ignore(409, self.core.create_namespaced_pod, namespace, body) is not None:  # None: it existed
                    self.metrics.pods_created.labels(body["metadata"]["labels"][jobs.ROLE_LABEL]).inc()
                    log.info("job %s: pod %s created", spec.key, pod)
            notices = self._drains(spec, decision.status)
            if notices is not None:
                decision.status["conditions"] = jobs.with_drains(decision.status, notices, jobs.rfc3339(now))
            self._write_status(namespace, name, status, decision.status)

    def _drains(self, spec: jobs.JobSpec, status: dict) -> list[str] | None:
        """The drain notices of the job's partition while the job goes on (the proxy reads them from
        its controller); none while it has no partition; None for a job that is over (its
        condition stays as it was last told), and when the proxy cannot say now (until the next
        reconciliation)."""
        if jobs.is_finished(status):
            return None
        if not status.get("ipuPartitionCreated"):
            return []
        read = self._drains_read.get(spec.key)
        if read is not None and time.monotonic() - read[0] < DRAINS_FRESH_SECONDS:
            return read[1]
        notices = self._read_drains(spec)
        if notices is not None:
            self._drains_read[spec.key] = (time.monotonic(), notices)
        return notices

    def _read_drains(self, spec: jobs.JobSpec) -> list[str] | None:
        """The proxy's answer of the drain notices of the job's partition; None when it cannot say."""
        try:
            answer, reply = rest.call("GET", f"{self.wiring.proxy_url.rstrip('/')}/partitions/{spec.partition_id}/drains?uid={spec.uid}",
                                     timeout=DRAINS_TIMEOUT)
        except OSError as error:
            log.info("job %s: the proxy cannot be reached for its partition's drains: %s", spec.key, error)
            return None
        if answer == 404:  # not made, or gone: nothing of it is drained
            return []
        if answer != 200:
            log.info("job %s: the proxy cannot say whether its partition is drained: %s", spec.key, reply.get("detail"))
            return None
        return [str(notice) for notice in reply.get("drains") or []]

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
        old, new = jobs.drain_condition(before), jobs.drain_condition(after)
        if new and (old or {}).get("message") != new.get("message"):
            log.info("IPUJob %s/%s: %s", namespace, name, new["message"])

    def resync_forever(self, interval: float, namespaces: tuple[str, ...]) -> None:
        """Reconcile every job every `interval` seconds: back-offs and interactive ttls end on time
        even when nothing happens to the job."""
        while True:
            time.sleep(interval)
            try:
                if namespaces:
                    listed = [self.custom.list_namespaced_custom_object(jobs.GROUP, jobs.VERSION, namespace, jobs.PLURAL)
                              for namespace in namespaces]
                else:
                    listed = [self.custom.list_cluster_custom_object(jobs.GROUP, jobs.VERSION, jobs.PLURAL)]
                found = [job for objects in listed for job in typing.cast(dict, objects)["items"]]  # JSON, as dicts
                for job in found:
                    self.reconcile(job["metadata"]["namespace"], job["metadata"]["name"])
            except Exception:  # the API server or the proxy away for a moment: the next round retries
                log.exception("resync failed")

    # Deletion

    def release(self, namespace: str, name: str) -> None:
        """The finaliser's work: free the job's IPUs, then remove what the job was made of.

        A launcher still asking for the partition meanwhile is refused by the proxy, which makes
        no partition for a job being deleted."""
        partition = jobs.partition_id(namespace, name)
        try:
            status, reply = rest.call("DELETE", f"{self.wiring.proxy_url.rstrip('/')}/partitions/{partition}")
        except OSError as error:
            raise kopf.TemporaryError(f"the proxy cannot be reached to release partition {partition}: {error}", delay=5) from None
        if status not in (200, 404):  # 404: the job never got a partition
            raise kopf.TemporaryError(f"the proxy could not release partition {partition}: {reply.get('detail')}", delay=5)
        if status == 200:
            self.metrics.releases.inc()
            log.info("job %s/%s: partition %s released", namespace, name, partition)
        self.metrics.job_condition(f"{namespace}/{name}", None)
        self._drains_read.pop(f"{namespace}/{name}", None)
        self.core.delete_collection_namespaced_pod(namespace, label_selector=f"{jobs.JOB_LABEL}={name}")
        launcher = f"{name}-launcher"
        self._ignore(404, self.core.delete_namespaced_config_map, f"{name}-ipujob", namespace)
        self._ignore(404, self.rbac.delete_namespaced_role_binding, launcher, namespace)
        self._ignore(404, self.rbac.delete_namespaced_role, launcher, namespace)
        self._ignore(404, self.core.delete_namespaced_service_account, launcher, namespace)

    def _choose_controller(self, spec: jobs.JobSpec) -> tuple[dict | None, str]:
        """The proxy's choice of V-IPU controller for the job, or None and why there is none yet."""
        body = {"namespace": spec.namespace, "job": spec.name, "uid": spec.uid, "size": spec.ipus, "id": spec.partition_id,
                "replicas": spec.model_replicas, "expected_seconds": spec.expected_seconds, "reservation": spec.reservation}
        try:
            status, reply = rest.call("POST", f"{self.wiring.proxy_url.rstrip('/')}/controllers/choose", body)
        except OSError as error:
            return None, f"the proxy cannot be reached ({error})"
        if status != 200:
            return None, reply.get("detail", f"HTTP {status}")
        return reply, ""

    @staticmethod
    def _ignore(status: int, call, *args):
        try:
            return call(*args)
        except ApiException as error:
            if error.status != status:
                raise
            return None


def register(registry: kopf.OperatorRegistry, operator: Operator) -> None:
    """The operator's handlers, on a registry of their own (so that tests can run several).

    The periodic resync is `Operator.resync_forever`, not a kopf timer: kopf holds a job's
    deletion until its timers have stopped, which delayed some deletions by a minute."""
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

    @kopf.on.delete(*resource, registry=registry)
    def job_deleted(namespace, name, **_):
        operator.release(namespace, name)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--proxy-url", required=True, envvar="VIPU_PROXY_URL", help="The V-IPU proxy, as launchers reach it.")
@click.option("--launcher-image", default="launcher:latest", show_default=True, envvar="LAUNCHER_IMAGE",
              help="Image of the launcher's init container (it runs vipu-ipujob-init).")
@click.option("--restart-backoff", type=click.FloatRange(0), default=10.0, show_default=True,
              help="Seconds before a job's first restart; each further restart waits twice as long.")
@click.option("--resync", type=click.FloatRange(0.1), default=10.0, show_default=True,
              help="Seconds between reconciliations of a job when nothing happens to it.")
@click.option("--namespace", "namespaces", multiple=True, help="Watch only these namespaces. Default: all.")
@click.option("--leader-election/--no-leader-election", default=True, show_default=True,
              help="Act only while holding the lease, so that several replicas never act at once.")
@click.option("--lease", default="gc-ipu-operator-leader", show_default=True, help="Name of the leader election Lease.")
@click.option("--lease-namespace", default=None, help="Namespace of the Lease. Default: the operator pod's.")
@click.option("--lease-seconds", type=click.FloatRange(1), default=15.0, show_default=True,
              help="How long a leader that stops renewing keeps the lease.")
@click.option("--probe-address", default="0.0.0.0", show_default=True)
@click.option("--probe-port", type=click.IntRange(0, 65535), default=8081, show_default=True, help="/healthz and /readyz; 0: none.")
@click.option("--metrics-address", default="0.0.0.0", show_default=True)
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=8444, show_default=True,
              help="/metrics over TLS, for callers the metrics-reader ClusterRole allows; 0: none.")
@click.option("--metrics-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Certificate of the metrics end-point (PEM). Default: a self-signed one.")
@click.option("--metrics-key", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None)
def main(proxy_url, launcher_image, restart_backoff, resync, namespaces, leader_election, lease, lease_namespace,
         lease_seconds, probe_address, probe_port, metrics_address, metrics_port, metrics_cert, metrics_key):
    """The IPUJob operator."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kopf").setLevel(logging.WARNING)
    api = kube.api_client()
    registry = CollectorRegistry()
    metrics = OperatorMetrics(registry)
    reached = threading.Event()
    if probe_port:
        endpoints.serve_probes(probe_address, probe_port, reached.is_set)
    if metrics_port:
        endpoints.serve_metrics(metrics_address, metrics_port, registry, endpoints.Authorizer(api),
                                endpoints.tls_context(metrics_cert, metrics_key))
    client.VersionApi(api).get_code()  # the API server answers: ready, leading or standing by
    reached.set()
    if leader_election:
        identity = f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        election = LeaderElection(client.CoordinationV1Api(api), lease_namespace or kube.namespace_of_this_pod(), lease,
                                  identity, lease_seconds, retry_seconds=min(2.0, lease_seconds / 4))
        log.info("%s standing by for lease %s/%s", identity, election.namespace, lease)
        election.acquire()
        log.info("%s leads (lease %s/%s)", identity, election.namespace, lease)
        election.keep(on_lost=lambda: os._exit(1))  # stop acting at once; the pod restarts and stands by
    metrics.leader.set(1)
    wiring = jobs.Wiring(proxy_url, launcher_image)
    registry_of_handlers = kopf.OperatorRegistry()
    operator = Operator(api, wiring, restart_backoff, metrics)
    register(registry_of_handlers, operator)
    threading.Thread(target=operator.resync_forever, args=(resync, tuple(namespaces)), name="resync", daemon=True).start()
    log.info("watching IPUJobs in %s", ", ".join(namespaces) if namespaces else "all namespaces")
    kopf.run(registry=registry_of_handlers, standalone=True, clusterwide=not namespaces, namespaces=namespaces)
