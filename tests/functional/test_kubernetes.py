"""The Kubernetes integration on a real control plane: etcd, kube-apiserver and kube-scheduler built
from source, kwok's nodes, and `tests/kubelet.py` running the pods' programs as local processes.

vipu's operator and proxy run as processes, as they would in their pods, against a real controller
and a simulated pod of 8 IPUs. Each job's workers attach to their partition with `vipu-ipuof run`,
started in them by the launcher through the job's own kubeexec script.
"""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
import yaml

from tests.functional.harness import BIN, Pod, wait_until
from tests.kubecluster import KubeCluster
from tests.kubelet import Kubelet
from tests.ports import free_port
from tests.processes import dying_with_parent
from vipu.api import tls
from vipu.api.protos import admin_pb2, vipuuser_pb2, vipuuser_pb2_grpc

pytestmark = pytest.mark.functional

ROOT = Path(__file__).resolve().parents[2]
MACHINES = 2  # 8 IPUs
SYSTEM = "vipu-system"
CONTROLLERS = "gc-ipu-operator-vipu-controllers"
# The launcher's command: on every worker of the hostfile, through kubeexec, attach to the IPUs.
ATTACH_ON_EVERY_WORKER = ["sh", "-c", 'for w in $(cat "$OMPI_MCA_orte_default_hostfile"); do '
                                      '"$OMPI_MCA_plm_rsh_agent" "$w" vipu-ipuof run || exit 1; done']


class Service:
    """One of vipu's Kubernetes programs, run as its pod would run it."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], directory: Path):
        self.name, self.command, self.env, self.log_path = name, command, env, directory / f"{name}.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> Service:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(dying_with_parent(self.command), env=self.env, stdout=log, stderr=subprocess.STDOUT)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class World:
    def __init__(self, directory: Path):
        self.directory = directory
        self.pod = Pod(directory / "vipu", machines=MACHINES).start().register()
        self.proxy_port = free_port()
        self.kube = KubeCluster(scheduler_extender=f"{self.proxy_url}/scheduler")
        self.kube.add_node("ipu-head-1", labels={"ipunode": "node1"})
        self.kube.kubectl("create", "namespace", SYSTEM)
        self.set_controllers(f"127.0.0.1:{self.pod.user_port}:ipunode=node1")
        self.kube.kubectl("create", "serviceaccount", "default")  # kube-controller-manager's work, which this cluster lacks
        self.kube.kubectl("apply", "-f", str(ROOT / "deploy" / "crds" / "graphcore.ai_ipujobs.yaml"))
        self.kube.kubectl("wait", "--for=condition=Established", "crd/ipujobs.graphcore.ai", "--timeout=60s")
        self.kubelet = Kubelet(self.kube, directory / "kubelet", path=[str(BIN)])
        env = {**self.kube.env, "PYTHONUNBUFFERED": "1"}
        self.proxy = Service("proxy", [str(BIN / "vipu-ipu-proxy"), "--controllers-configmap", CONTROLLERS,
                                       "--controllers-refresh", "1", "--listen-address", "127.0.0.1",
                                       "--port", str(self.proxy_port), "--namespace", SYSTEM],
                             env, directory)
        self.env = env
        self.operator = self.operator_replica("operator")
        self.webhook = self._webhooks(directory, env)
        self.start_proxy()
        self.operator.start()
        wait_until(lambda: " leads (lease " in self.operator.log(), what="the operator to lead")

    def operator_replica(self, name: str) -> Service:
        """An operator replica with leader election, its probes and metrics on ports of its own."""
        probe_port, metrics_port = free_port(), free_port()
        service = Service(name, [str(BIN / "vipu-ipu-operator"), "--proxy-url", self.proxy_url, "--launcher-image", "vipu:test",
                                 "--restart-backoff", "1", "--resync", "1", "--lease-namespace", SYSTEM, "--lease-seconds", "4",
                                 "--probe-address", "127.0.0.1", "--probe-port", str(probe_port),
                                 "--metrics-address", "127.0.0.1", "--metrics-port", str(metrics_port)],
                          self.env, self.directory)
        service.probe_port, service.metrics_port = probe_port, metrics_port
        return service

    def set_controllers(self, text: str) -> None:
        """The V-IPU controller list, as an administrator edits it."""
        self.kube.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CONTROLLERS, "namespace": SYSTEM},
                         "data": {"vipuControllers": text}})

    def _webhooks(self, directory: Path, env: dict[str, str]) -> Service:
        """The admission webhooks over TLS, registered with the API server as the Helm chart does."""
        authority_key, authority = tls.make_authority("vipu webhook test authority")
        key, certificate = tls.issue(authority_key, authority, "vipu-ipu-webhook", server_names=["127.0.0.1"])
        (directory / "webhook.key").write_bytes(key)
        (directory / "webhook.crt").write_bytes(certificate)
        port = free_port()
        service = Service("webhook", [str(BIN / "vipu-ipu-webhook"), "--listen-address", "127.0.0.1", "--port", str(port),
                                      "--tls-cert", str(directory / "webhook.crt"), "--tls-key", str(directory / "webhook.key")],
                          env, directory).start()
        bundle = base64.b64encode(authority).decode()
        rules = [{"apiGroups": ["graphcore.ai"], "apiVersions": ["v1alpha1"], "operations": ["CREATE", "UPDATE"],
                  "resources": ["ipujobs"]}]
        for kind, name, path in (("MutatingWebhookConfiguration", "mipujob.graphcore.ai", "mutate"),
                                 ("ValidatingWebhookConfiguration", "vipujob.graphcore.ai", "validate")):
            self.kube.apply({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": {"name": name},
                             "webhooks": [{"name": name, "rules": rules, "failurePolicy": "Fail", "sideEffects": "None",
                                           "admissionReviewVersions": ["v1"], "timeoutSeconds": 30,
                                           "clientConfig": {"url": f"https://127.0.0.1:{port}/{path}-graphcore-ai-v1alpha1-ipujob",
                                                            "caBundle": bundle}}]})
        return service

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    def start_proxy(self) -> None:
        self.proxy.start()
        wait_until(lambda: self._health(), timeout=30, what=f"the proxy to answer:\n{self.proxy.log()}")

    def _health(self) -> bool:
        try:
            return self.get("/health")["status"] == "ok"
        except OSError:
            return False

    def stop(self) -> None:
        for part in (self.operator, self.proxy, self.webhook):
            part.stop()
        self.kubelet.stop()
        self.kube.stop()
        self.pod.stop()

    # The proxy's REST end-points

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.proxy_url + path, timeout=10) as reply:
            return json.loads(reply.read())

    def post(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(self.proxy_url + path, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            return json.loads(reply.read())

    # Jobs

    def submit(self, name: str, replicas: int = 4, per_replica: int = 1, workers: int | None = None, **spec) -> str:
        template = {"metadata": {"labels": {"app": name}}, "spec": {"containers": [
            {"name": "poplar", "image": "poplar:test", "env": [{"name": "IPUOF_LOG_LEVEL", "value": "INFO"}]}]}}
        document = {
            "apiVersion": "graphcore.ai/v1alpha1", "kind": "IPUJob", "metadata": {"name": name, "namespace": "default"},
            "spec": {"modelReplicas": str(replicas), "ipusPerModelReplica": str(per_replica),
                     "workers": {"template": template, **({"replicas": workers} if workers else {})}, **spec},
        }
        if "interactive" not in spec:
            document["spec"].setdefault("launcher", {"command": ATTACH_ON_EVERY_WORKER})
        self.kube.apply(document)
        return name

    def job(self, name: str) -> dict | None:
        done = self.kube.kubectl("get", "ipujob", name, "-o", "json", check=False)
        return json.loads(done.stdout) if done.returncode == 0 else None

    def condition(self, name: str) -> dict:
        conditions = ((self.job(name) or {}).get("status") or {}).get("conditions") or []
        return next((c for c in reversed(conditions) if c["status"] == "True"), {})

    def wait_for(self, name: str, kind: str, timeout: float = 90) -> dict:
        try:
            wait_until(lambda: self.condition(name).get("type") == kind, timeout=timeout, what=f"job {name} to be {kind}")
        except AssertionError as timeout_error:
            raise AssertionError(f"{timeout_error}; it is {self.condition(name)}; operator:\n{self.operator.log()[-2000:]}") from None
        return self.condition(name)

    def delete(self, name: str) -> None:
        self.kube.kubectl("delete", "ipujob", name, "--wait=true", "--timeout=60s")

    def pods(self, job: str) -> list[str]:
        out = self.kube.kubectl("get", "pods", "-l", f"graphcore.ai/ipujob={job}", "-o", "name").stdout
        return sorted(line.removeprefix("pod/") for line in out.split())

    def launcher_log(self, job: str, container: str = "launcher") -> str:
        return self.kubelet.logs("default", f"{job}-launcher", container)

    def partitions(self) -> dict[str, int]:
        api = vipuuser_pb2_grpc.UserServiceStub(self.pod._channel(self.pod.user_port))
        return {p.id: len(p.spec.ipus) for p in api.ListPartitions(vipuuser_pb2.ListPartitionsRequest()).partitions}

    def tracked(self) -> dict[str, dict]:
        data = json.loads(self.kube.kubectl("get", "configmap", "ipu-partitions-tracker", "-n", SYSTEM, "-o", "json").stdout)
        return {key: json.loads(value) for key, value in (data.get("data") or {}).items()}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    world = World(tmp_path_factory.mktemp("kubernetes"))
    yield world
    world.stop()


@pytest.fixture
def cluster(world):
    """The world, with no job left behind by the test."""
    yield world
    for name in json.loads(world.kube.kubectl("get", "ipujobs", "-o", "json").stdout)["items"]:
        world.delete(name["metadata"]["name"])
    wait_until(lambda: not world.partitions(), what="every job's partition to be released")


def test_a_four_replica_job_runs_to_succeeded_with_its_workers_attached_to_its_partition(cluster):
    cluster.submit("resnet", replicas=4, workers=2)
    wait_until(lambda: "ipu.finalizers.graphcore.ai" in cluster.job("resnet")["metadata"].get("finalizers", ()),
               what="the operator's finaliser on the job")
    cluster.wait_for("resnet", "Succeeded")

    job = cluster.job("resnet")
    conditions = [(c["type"], c["status"], c["message"]) for c in job["status"]["conditions"]]
    assert ("Pending", "False", "IPUJob default/resnet is waiting for resources to be ready.") in conditions
    assert ("Running", "False", "IPUJob default/resnet is running.") in conditions
    assert conditions[-1] == ("Succeeded", "True", "IPUJob default/resnet successfully completed.")
    assert job["status"]["ipuPartitionCreated"] is True

    partition = "p-default-resnet"
    log = cluster.launcher_log("resnet")
    assert log.count(f"run ({partition}): success. 4 IPUs in 1 GCD(s) ran the test program.") == 2, log
    assert f"partition {partition} created" in cluster.launcher_log("resnet", "launcher-init")
    assert cluster.partitions() == {partition: 4}
    assert cluster.tracked()[partition] | {"created": None} == {
        "namespace": "default", "job": "resnet", "uid": job["metadata"]["uid"], "size": 4,
        "controller": f"127.0.0.1:{cluster.pod.user_port}", "created": None}

    table = cluster.kube.kubectl("get", "ipujobs").stdout.splitlines()
    assert table[0].split() == ["NAME", "STATUS", "AGE"] and table[1].split()[:2] == ["resnet", "Succeeded"]

    worker = json.loads(cluster.kube.kubectl("get", "pod", "resnet-worker-1", "-o", "json").stdout)["spec"]
    assert (worker["hostNetwork"], worker["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert worker["containers"][0]["securityContext"]["privileged"] is True
    assert worker["nodeName"] == "ipu-head-1"  # bound by the real scheduler
    for kind in ("configmap/resnet-ipujob", "serviceaccount/resnet-launcher", "role/resnet-launcher", "rolebinding/resnet-launcher"):
        assert cluster.kube.kubectl("get", kind, check=False).returncode == 0, kind

    cluster.delete("resnet")
    assert cluster.partitions() == {}
    assert partition not in cluster.tracked()
    wait_until(lambda: cluster.pods("resnet") == [], what="the deleted job's pods to go")
    assert cluster.kube.kubectl("get", "configmap/resnet-ipujob", check=False).returncode != 0


def test_a_two_gcd_job_spreads_its_workers_over_its_partitions_gcds_each_told_its_own(cluster):
    """spec.numGcds: the partition is made with that many GCDs, the workers are spread over them
    in order, every container of each told its GCD, and each worker runs on its GCD's IPUs alone."""
    cluster.submit("twogcd", replicas=8, workers=2, numGcds=2)
    cluster.wait_for("twogcd", "Succeeded")
    assert cluster.job("twogcd")["spec"]["numGcds"] == 2
    api = vipuuser_pb2_grpc.UserServiceStub(cluster.pod._channel(cluster.pod.user_port))
    [partition] = [p for p in api.ListPartitions(vipuuser_pb2.ListPartitionsRequest()).partitions if p.id == "p-default-twogcd"]
    assert (len(partition.spec.ipus), partition.spec.num_gcds) == (8, 2)
    told = []
    for worker in ("twogcd-worker-0", "twogcd-worker-1"):
        [container] = json.loads(cluster.kube.kubectl("get", "pod", worker, "-o", "json").stdout)["spec"]["containers"]
        told.append({v["name"]: v.get("value") for v in container["env"]}["IPUOF_VIPU_API_GCD_ID"])
    assert told == ["0", "1"]
    log = cluster.launcher_log("twogcd")
    assert log.count("run (p-default-twogcd): success. 4 IPUs in 1 GCD(s) ran the test program.") == 2, log
    cluster.delete("twogcd")
    assert cluster.partitions() == {}


def test_a_failing_launcher_is_restarted_on_a_reset_partition_until_its_backoff_limit(cluster):
    cluster.submit("flaky", launcher={"command": ["sh", "-c", "exit 3"]}, restartPolicy={"type": "OnFailure", "backoffLimit": 2})
    condition = cluster.wait_for("flaky", "Failed")
    assert condition["message"] == "IPUJob default/flaky has failed after 2 restart(s): its launcher exited with code 3."
    assert cluster.job("flaky")["status"]["restartCount"] == 2
    init = cluster.launcher_log("flaky", "launcher-init")
    assert init.count("partition p-default-flaky created") == 1 and init.count("partition p-default-flaky reset") == 2, init
    assert cluster.partitions() == {"p-default-flaky": 4}  # kept until the job is deleted, as the seed says


def test_the_seeds_backoff_limit_of_one_retries_a_failing_launcher_once(cluster):
    cluster.submit("retried", launcher={"command": ["sh", "-c", "exit 4"]}, restartPolicy={"type": "OnFailure", "backOffLimit": 1})
    condition = cluster.wait_for("retried", "Failed")
    assert condition["message"] == "IPUJob default/retried has failed after 1 restart(s): its launcher exited with code 4."
    job = cluster.job("retried")
    assert (job["status"]["restartCount"], job["spec"]["restartPolicy"]) == (1, {"type": "OnFailure", "backOffLimit": 1})
    assert cluster.launcher_log("retried", "launcher-init").count("partition p-default-retried reset") == 1
    cluster.submit("respelled", interactive={"ttl": 3600}, restartPolicy={"type": "OnFailure", "backoffLimit": 2})
    assert cluster.job("respelled")["spec"]["restartPolicy"] == {"type": "OnFailure", "backOffLimit": 2}  # one spelling stored


def test_a_job_that_never_restarts_fails_at_once(cluster):
    cluster.submit("once", launcher={"command": ["sh", "-c", "exit 5"]}, cleanPodPolicy="All")
    assert cluster.wait_for("once", "Failed")["message"] == "IPUJob default/once has failed: its launcher exited with code 5."
    wait_until(lambda: cluster.pods("once") == [], what="cleanPodPolicy All to remove the pods")


def test_an_interactive_job_ends_after_its_ttl(cluster):
    cluster.submit("session", interactive={"ttl": 4})
    cluster.wait_for("session", "Running")
    assert cluster.partitions() == {"p-default-session": 4}
    condition = cluster.wait_for("session", "Succeeded", timeout=30)
    assert (condition["reason"], condition["message"]) == (
        "IPUJobExpired", "IPUJob default/session ended: its interactive session of 4 s expired.")
    wait_until(lambda: cluster.pods("session") == [], what="the expired session's pods to go")


def test_jobs_that_together_exceed_the_pod_queue_in_the_controller_in_their_order_instead_of_oversubscribing(cluster):
    cluster.submit("big", replicas=8, interactive={"ttl": 3600})
    cluster.wait_for("big", "Running")
    cluster.submit("whole", replicas=8, interactive={"ttl": 3600})
    wait_until(lambda: "(number 1): first in the queue" in cluster.condition("whole").get("message", ""),
               what="the second job to wait in the controller's queue")
    cluster.submit("small", replicas=4, interactive={"ttl": 3600})
    wait_until(lambda: "(number 2): number 2 in the queue, behind p-default-whole (8 IPUs)" in
               cluster.condition("small").get("message", ""), what="the third job to wait behind it")
    assert cluster.condition("small")["message"].startswith(
        "IPUJob default/small is waiting for a V-IPU controller with room: waiting in the queue of V-IPU controller 127.0.0.1:")
    assert cluster.condition("whole")["type"] == "Pending" and cluster.pods("whole") == cluster.pods("small") == []
    assert cluster.partitions() == {"p-default-big": 8}
    assert cluster.get("/stats") == {"default": {"used": 8, "available": 0}, "total": {"used": 8, "available": 0}}
    assert cluster.post("/query", {"size": 2}) == {"available": True, "numOfPartitions": 0, "message": ""}  # as the seed's size-64 example

    cluster.delete("big")  # frees its IPUs: the first waiting job gets them, though the second would fit too
    cluster.wait_for("whole", "Running", timeout=60)
    assert cluster.partitions() == {"p-default-whole": 8}
    assert cluster.condition("small")["type"] == "Pending" and "(number 1)" in cluster.condition("small")["message"]
    cluster.delete("whole")
    cluster.wait_for("small", "Running", timeout=60)
    assert cluster.partitions() == {"p-default-small": 4}
    assert cluster.get("/stats") == {"default": {"used": 4, "available": 4}, "total": {"used": 4, "available": 4}}
    assert cluster.post("/query", {"size": 2}) == {"available": True, "numOfPartitions": 2, "message": ""}
    assert cluster.post("/query", {"size": 8})["numOfPartitions"] == 0
    assert cluster.post("/query", {"size": 64}) == {"available": True, "numOfPartitions": 0, "message": ""}  # the seed's example
    refused = {"available": False, "numOfPartitions": 0, "message": "size must be a power of two, not 3"}
    assert cluster.post("/query", {"size": 3}) == refused


def test_a_job_in_a_vipu_reservation_gets_its_machines_others_are_kept_off_them_and_a_drain_is_told_in_a_condition(cluster):
    api = vipuuser_pb2_grpc.UserServiceStub(cluster.pod._channel(cluster.pod.user_port))

    def machines(job: str) -> set[str]:
        [partition] = [p for p in api.ListPartitions(vipuuser_pb2.ListPartitionsRequest()).partitions if p.id == f"p-default-{job}"]
        return {ipu.agent_id for ipu in partition.spec.ipus}

    admin, now = cluster.pod.admin_api, time.time()
    admin.CreateReservation(admin_pb2.CreateReservationRequest(name="team", agent_ids=["ag2"], start=now, end=now + 3600,
                                                               reason="a team's slot", users=["anyone"]))
    try:
        cluster.submit("whole", replicas=8, interactive={"ttl": 3600})  # ag2 is the reservation's: no room for it
        wait_until(lambda: "reservation team" in cluster.launcher_log("whole", "launcher-init"), timeout=60,
                   what="the job too big for the IPUs left to wait with the reservation named")
        cluster.delete("whole")
        cluster.submit("inside", replicas=4, interactive={"ttl": 3600}, reservation="team")
        cluster.submit("outside", replicas=4, interactive={"ttl": 3600})
        cluster.wait_for("inside", "Running")
        cluster.wait_for("outside", "Running")
        assert machines("inside") == {"ag2"} and machines("outside") == {"ag1"}

        admin.DrainAgents(admin_pb2.DrainAgentsRequest(agent_ids=["ag1"], reason="cable repair"))

        def drained() -> dict:
            return next((c for c in cluster.job("outside")["status"]["conditions"] if c["type"] == "PartitionDraining"), {})

        wait_until(lambda: drained().get("status") == "True", what="the job on the drained machine to be told")
        assert drained()["message"].startswith("agent ag1 is draining for cable repair"), drained()
        assert cluster.condition("outside")["type"] == "Running"  # its state is as it was: it is left to finish
        assert "PartitionDraining" not in {c["type"] for c in cluster.job("inside")["status"]["conditions"]}
        admin.ResumeAgents(admin_pb2.ResumeAgentsRequest(agent_ids=["ag1"]))
        wait_until(lambda: drained().get("status") == "False", what="the job to be told its machine is back")
    finally:
        with contextlib.suppress(grpc.RpcError):
            admin.ResumeAgents(admin_pb2.ResumeAgentsRequest(agent_ids=["ag1"]))
        admin.RemoveReservation(admin_pb2.RemoveRequest(id="team"))


def test_a_create_failed_by_the_machines_leaves_no_partition_and_the_job_is_told_why(cluster):
    """The proxy cleans up after a create that reached the controller and failed, and tells the
    launcher that asking again will not help; nothing is left holding IPUs or in the tracker."""
    for machine in cluster.pod.rack.machines:
        cluster.pod.fault(machine.name, "IPU-Link training failed")
    try:
        cluster.submit("faulty", replicas=4)
        cluster.wait_for("faulty", "Failed")
        init = cluster.launcher_log("faulty", "launcher-init")
        assert "vipu-ipujob-init (partition p-default-faulty): failed: " in init and "IPU-Link training failed" in init, init
        assert cluster.partitions() == {} and "p-default-faulty" not in cluster.tracked()
    finally:
        cluster.pod.wipe_rack_only()


def test_the_tracker_survives_the_proxy_and_a_new_proxy_picks_it_up(cluster):
    cluster.submit("kept", interactive={"ttl": 3600})
    cluster.wait_for("kept", "Running")
    cluster.proxy.stop()  # as `helm uninstall` would: the tracker ConfigMap is not the chart's
    assert "p-default-kept" in cluster.tracked()
    cluster.start_proxy()
    assert "tracking 1 partition(s)" in cluster.proxy.log()
    cluster.delete("kept")  # the new proxy releases what the old one made
    assert cluster.partitions() == {}


def test_an_ipujob_is_held_to_the_quota_of_the_account_its_namespace_maps_onto(cluster):
    """vipu-k8s-proxy --accounts default=physics: an IPUJob's partition is made on account physics,
    whose quota counts what another front-end (Slurm, say) holds on it: the job waits in the
    controller's queue saying so, and runs once the quota has room."""
    plain = list(cluster.proxy.command)
    assert cluster.pod.admin("create", "account", "physics", "--quota", "4").code == 0
    cluster.proxy.stop()
    cluster.proxy.command = [*plain, "--accounts", "default=physics"]
    cluster.start_proxy()
    try:
        assert cluster.pod.user("create", "partition", "slurm-7", "--size", "4", "--account", "physics").code == 0
        cluster.submit("over", replicas=4, interactive={"ttl": 3600})
        api = vipuuser_pb2_grpc.UserServiceStub(cluster.pod._channel(cluster.pod.user_port))

        def waiting_reason() -> str:
            return next((r.reason for r in api.ListQueued(vipuuser_pb2.ListQueuedRequest()).requests
                         if r.partition_id == "p-default-over"), "")

        wait_until(lambda: "waits for its account's quota: account physics holds 4 of its quota of 4 IPUs" in waiting_reason(),
                   what="the job's request to wait for its account's quota")  # though 4 IPUs are free
        assert cluster.partitions() == {"slurm-7": 4} and cluster.condition("over").get("type") == "Pending"
        assert cluster.pod.user("remove", "partition", "slurm-7").code == 0
        cluster.wait_for("over", "Running", timeout=60)
        status = api.GetPartitionStatus(vipuuser_pb2.GetPartitionStatusRequest(partition_id="p-default-over")).status
        assert status.account == "physics"
        assert dict(status.labels) == {"ipujob": "over", "namespace": "default"}  # what its IPUs' telemetry is labelled with
    finally:
        if cluster.job("over") is not None:
            cluster.delete("over")
        cluster.pod.user("remove", "partition", "slurm-7")
        wait_until(lambda: not cluster.partitions(), what="the job's partition to be released")
        cluster.pod.admin("remove", "account", "physics")
        cluster.proxy.stop()
        cluster.proxy.command = plain
        cluster.start_proxy()


def test_a_partition_made_by_hand_is_neither_tracked_nor_taken(cluster):
    assert cluster.pod.user("create", "partition", "p-default-manual", "--size", "1").code == 0
    try:
        cluster.submit("manual", replicas=1, interactive={"ttl": 3600})
        refusal = f"p-default-manual exists on 127.0.0.1:{cluster.pod.user_port} and was not made by this proxy"
        wait_until(lambda: refusal in cluster.launcher_log("manual", "launcher-init"),
                   what="the job to be told the partition is someone else's")
        assert "p-default-manual" not in cluster.tracked()
        assert cluster.get("/stats")["total"]["used"] == 1
    finally:
        cluster.delete("manual")
        assert cluster.pod.user("remove", "partition", "p-default-manual").code == 0


def test_the_validating_webhook_refuses_a_bad_job_with_its_reason(cluster):
    for changes, reason in (
        ({"replicas": 3}, "modelReplicas x ipusPerModelReplica = 3 IPUs: a partition's size must be a power of two"),
        ({"replicas": 4, "workers": 3}, "modelReplicas (4) must be a multiple of workers.replicas (3)"),
        ({"launcher": {}}, "spec.launcher.command is required unless the job is interactive"),
        ({"replicas": 4, "workers": 1, "numGcds": 2}, "modelReplicas (4) and workers.replicas (1) must be multiples of spec.numGcds (2)"),
    ):
        with pytest.raises(AssertionError) as refused:
            cluster.submit("bad", **changes)
        assert 'admission webhook "vipujob.graphcore.ai" denied the request' in str(refused.value)
        assert f"IPUJob bad: {reason}" in str(refused.value)
        assert cluster.job("bad") is None


def test_the_mutating_webhook_fills_in_the_defaults(cluster):
    cluster.submit("plain", interactive={"ttl": 3600})
    spec = cluster.job("plain")["spec"]
    assert (spec["restartPolicy"], spec["cleanPodPolicy"], spec["workers"]["replicas"], spec["numGcds"]) == (
        {"type": "Never", "backOffLimit": 3}, "None", 1, 1)
    cluster.submit("seeds", interactive={"ttl": 3600}, restartPolicy={"type": "OnFailure", "backOffLimit": 5})
    assert cluster.job("seeds")["spec"]["restartPolicy"] == {"type": "OnFailure", "backOffLimit": 5}  # the seed's spelling kept


def test_the_launchers_service_account_may_exec_into_its_own_jobs_workers_only(cluster):
    cluster.submit("scoped", interactive={"ttl": 3600})
    cluster.submit("other", replicas=2, interactive={"ttl": 3600})
    cluster.wait_for("scoped", "Running")

    def can(verb: str, what: str, *options: str) -> str:
        return cluster.kube.kubectl("auth", "can-i", verb, what, *options, "--as",
                                    "system:serviceaccount:default:scoped-launcher", check=False).stdout.strip()

    assert can("create", "pods/scoped-worker-0", "--subresource=exec") == "yes"
    assert can("create", "pods/other-worker-0", "--subresource=exec") == "no"
    assert can("watch", "pods") == "yes"
    assert can("delete", "pods") == "no" and can("get", "secrets") == "no"


def test_ipujob_yaml_documents_in_the_readme_are_accepted(cluster):
    """The README's sample job is a valid IPUJob for this CRD (server-side dry run)."""
    readme = (ROOT / "README.md").read_text()
    samples = [block for block in readme.split("```yaml")[1:] if "kind: IPUJob" in block.split("```")[0]]
    assert samples, "the README shows an IPUJob"
    for sample in samples:
        document = yaml.safe_load(sample.split("```")[0])
        done = cluster.kube.kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(document), check=False)
        assert done.returncode == 0, done.stderr


def test_the_programs_answer_help():
    for program in ("vipu-ipu-operator", "vipu-ipu-proxy"):
        done = subprocess.run([str(BIN / program), "--help"], capture_output=True, text=True)
        assert done.returncode == 0 and "Usage" in done.stdout, done.stderr
    done = subprocess.run([str(BIN / "vipu-ipujob-init")], capture_output=True, text=True, env={"PATH": sys.exec_prefix})
    assert done.returncode == 2 and "missing from the environment: IPUJOB_NAME" in done.stderr


def test_a_second_controller_takes_a_job_when_the_first_is_full_and_its_pods_go_to_its_nodes(cluster, tmp_path):
    second = Pod(tmp_path / "second-pod", machines=1).start().register()  # 4 IPUs
    first_address, second_address = f"127.0.0.1:{cluster.pod.user_port}", f"127.0.0.1:{second.user_port}"
    try:
        cluster.kube.add_node("ipu-head-2", labels={"ipunode": "node2"})
        cluster.set_controllers(f"{first_address}:ipunode=node1,{second_address}:ipunode=node2")
        wait_until(lambda: f"V-IPU controllers: {first_address}, {second_address}" in cluster.proxy.log(),
                   what="the proxy to notice the edited controller list")

        cluster.submit("fills", replicas=8, interactive={"ttl": 3600})
        assert cluster.wait_for("fills", "Running")
        cluster.submit("overflows", replicas=4, interactive={"ttl": 3600})
        cluster.wait_for("overflows", "Running")
        assert cluster.job("overflows")["status"]["controller"] == {"host": "127.0.0.1", "port": second.user_port, "label": "ipunode=node2"}
        nodes = {name: json.loads(cluster.kube.kubectl("get", "pod", name, "-o", "json").stdout)["spec"]["nodeName"]
                 for name in cluster.pods("fills") + cluster.pods("overflows")}
        assert nodes == {"fills-launcher": "ipu-head-1", "fills-worker-0": "ipu-head-1",
                         "overflows-launcher": "ipu-head-2", "overflows-worker-0": "ipu-head-2"}
        api = vipuuser_pb2_grpc.UserServiceStub(second._channel(second.user_port))
        assert [p.id for p in api.ListPartitions(vipuuser_pb2.ListPartitionsRequest()).partitions] == ["p-default-overflows"]
        assert cluster.tracked()["p-default-overflows"]["controller"] == second_address

        cluster.submit("waits", replicas=1, interactive={"ttl": 3600})
        wait_until(lambda: "waiting for a V-IPU controller with room" in cluster.condition("waits").get("message", ""),
                   what="a third job to wait for room")
        assert cluster.pods("waits") == []
        assert cluster.get("/stats")["total"] == {"used": 12, "available": 0}
        cluster.delete("overflows")
        cluster.wait_for("waits", "Running", timeout=60)
        assert cluster.job("waits")["status"]["controller"]["port"] == second.user_port
    finally:
        for name in ("fills", "overflows", "waits"):
            cluster.kube.kubectl("delete", "ipujob", name, "--ignore-not-found", "--wait=true", "--timeout=60s")
        cluster.set_controllers(f"{first_address}:ipunode=node1")
        second.stop()


def _https_get(url: str, token: str | None = None) -> tuple[int, str]:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # the operator's self-signed certificate
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_operator_metrics_need_a_token_the_metrics_reader_role_allows(cluster):
    kube = cluster.kube
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "gc-metrics-reader", "labels": {"component": "metrics-reader"}},
                "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]})
    kube.kubectl("create", "serviceaccount", "prometheus")
    kube.kubectl("create", "clusterrolebinding", "metrics", "--clusterrole=gc-metrics-reader", "--serviceaccount=default:prometheus")
    cluster.submit("measured", interactive={"ttl": 3600})
    cluster.wait_for("measured", "Running")
    url = f"https://127.0.0.1:{cluster.operator.metrics_port}/metrics"

    status, body = _https_get(url, kube.kubectl("create", "token", "prometheus").stdout.strip())
    assert status == 200, body
    assert "vipu_ipujob_reconciliations_total" in body and 'vipu_ipujobs{condition="Running"} 1.0' in body
    assert 'vipu_ipujob_pods_created_total{role="launcher"}' in body and "vipu_ipujob_operator_leader 1.0" in body
    assert _https_get(url)[0] == 401
    assert _https_get(url, "not-a-token")[0] == 401
    assert _https_get(url, kube.kubectl("create", "token", "default").stdout.strip())[0] == 403

    with urllib.request.urlopen(f"{cluster.proxy_url}/metrics", timeout=10) as reply:
        proxy_metrics = reply.read().decode()
    assert 'vipu_proxy_requests_total{endpoint="/controllers/choose",status="200"}' in proxy_metrics
    assert "vipu_proxy_tracked_partitions 1.0" in proxy_metrics


def test_probes_answer(cluster):
    for path in ("/healthz", "/readyz"):
        with urllib.request.urlopen(f"http://127.0.0.1:{cluster.operator.probe_port}{path}", timeout=10) as reply:
            assert (reply.status, reply.read()) == (200, b"ok")


def test_of_two_operator_replicas_one_leads_and_the_other_takes_over_when_it_dies(cluster):
    standby = cluster.operator_replica("operator-standby").start()
    try:
        wait_until(lambda: " standing by for lease " in standby.log(), what="the second replica to stand by")
        holder = json.loads(cluster.kube.kubectl("get", "lease", "gc-ipu-operator-leader", "-n", SYSTEM, "-o", "json").stdout)
        leader_identity = holder["spec"]["holderIdentity"]
        assert f"{leader_identity} leads" in cluster.operator.log() and " leads " not in standby.log()
        cluster.submit("before", interactive={"ttl": 3600})
        cluster.wait_for("before", "Running")
        assert "before" not in standby.log()  # only the leader acts

        cluster.operator.process.kill()  # the leader dies without giving up its lease
        cluster.operator.process.wait()
        wait_until(lambda: " leads (lease " in standby.log(), timeout=30, what="the standby to take the lease")
        cluster.submit("after", interactive={"ttl": 3600})
        cluster.wait_for("after", "Running")
        assert "job default/after: pod after-launcher created" in standby.log()
    except BaseException:
        standby.stop()
        raise
    cluster.operator = standby


def _pod_asking_for_ipus(cluster, name: str, ipus: int) -> None:
    cluster.kube.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": {"graphcore.ai/ipus": str(ipus)}},
                        "spec": {"containers": [{"name": "main", "image": "poplar:test", "command": ["sleep", "3600"]}]}})


def _node_of(cluster, pod: str) -> str:
    return json.loads(cluster.kube.kubectl("get", "pod", pod, "-o", "json").stdout)["spec"].get("nodeName", "")


def test_the_scheduler_extender_steers_pods_asking_for_ipus_to_nodes_whose_controller_has_room(cluster, tmp_path):
    second = Pod(tmp_path / "second-pod", machines=1).start().register()  # 4 IPUs
    first_address, second_address = f"127.0.0.1:{cluster.pod.user_port}", f"127.0.0.1:{second.user_port}"
    try:
        cluster.kube.add_node("ipu-head-2", labels={"ipunode": "node2"})
        cluster.kube.add_node("ipu-master", labels={"ipunode": "node1", "node-role.kubernetes.io/control-plane": ""})
        cluster.kube.kubectl("taint", "node", "ipu-master", "node-role.kubernetes.io/control-plane:NoSchedule")
        cluster.set_controllers(f"{first_address}:ipunode=node1,{second_address}:ipunode=node2")
        wait_until(lambda: f"V-IPU controllers: {first_address}, {second_address}" in cluster.proxy.log(),
                   what="the proxy to notice the edited controller list")
        annotations = lambda node: json.loads(  # noqa: E731
            cluster.kube.kubectl("get", "node", node, "-o", "json").stdout)["metadata"].get("annotations", {})
        wait_until(lambda: annotations("ipu-head-1").get("graphcore.ai/ipus-available") == "8"
                   and annotations("ipu-head-2").get("graphcore.ai/ipus-available") == "4", what="nodes to advertise their free IPUs")
        assert "graphcore.ai/ipus-available" not in annotations("ipu-master")  # ipuVisibility.advertiseOnMaster is off

        assert cluster.pod.user("create", "partition", "p-full", "--size", "8").code == 0  # the first controller is full
        _pod_asking_for_ipus(cluster, "wants-four", 4)
        wait_until(lambda: _node_of(cluster, "wants-four"), what="the pod to be scheduled")
        assert _node_of(cluster, "wants-four") == "ipu-head-2"
        wait_until(lambda: annotations("ipu-head-1").get("graphcore.ai/ipus-available") == "0", what="the full node's annotation")

        _pod_asking_for_ipus(cluster, "wants-eight", 8)  # no controller has room: unschedulable, with the reason
        wait_until(lambda: "no room for 8 IPUs" in cluster.kube.kubectl("get", "events", "--field-selector",
                                                                         "involvedObject.name=wants-eight").stdout,
                   what="the scheduler to say why the pod waits")
        assert _node_of(cluster, "wants-eight") == ""
        assert cluster.pod.user("remove", "partition", "p-full").code == 0
        wait_until(lambda: _node_of(cluster, "wants-eight") == "ipu-head-1", timeout=60, what="the pod to go where room appeared")
    finally:
        cluster.kube.kubectl("delete", "pod", "wants-four", "wants-eight", "--ignore-not-found", "--wait=true")
        cluster.pod.user("remove", "partition", "p-full")
        cluster.set_controllers(f"{first_address}:ipunode=node1")
        cluster.kube.kubectl("delete", "node", "ipu-master", "--ignore-not-found")
        second.stop()


def test_the_proxy_makes_no_partition_for_a_job_that_is_gone(cluster):
    """A launcher's request racing its job's deletion must not leave a partition behind."""
    request = {"id": "p-default-ghost", "namespace": "default", "job": "ghost", "uid": "u-gone", "size": 1}
    with pytest.raises(urllib.error.HTTPError) as refused:
        cluster.post("/partitions", request)
    assert refused.value.code == 404
    assert "job default/ghost is gone or being deleted" in refused.value.read().decode()
    assert cluster.partitions() == {} and "p-default-ghost" not in cluster.tracked()
