"""The Kubernetes integration on a real control plane: etcd, kube-apiserver and kube-scheduler built
from source, kwok's nodes, and `tests/kubelet.py` running the pods' programs as local processes.

vipu's operator and proxy run as processes, as they would in their pods, against a real controller
and a simulated pod of 8 IPUs. Each job's workers attach to their partition with `vipu-ipuof run`,
started in them by the launcher through the job's own kubeexec script.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.functional.harness import BIN, Pod, wait_until
from tests.kubecluster import KubeCluster
from tests.kubelet import Kubelet
from tests.ports import free_port
from tests.processes import dying_with_parent
from vipu.api.protos import vipuuser_pb2, vipuuser_pb2_grpc

pytestmark = pytest.mark.functional

ROOT = Path(__file__).resolve().parents[2]
MACHINES = 2  # 8 IPUs
SYSTEM = "vipu-system"
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
        self.kube = KubeCluster()
        self.kube.add_node("ipu-head-1")
        self.kube.kubectl("create", "namespace", SYSTEM)
        self.kube.kubectl("create", "serviceaccount", "default")  # kube-controller-manager's work, which this cluster lacks
        self.kube.kubectl("apply", "-f", str(ROOT / "deploy" / "crds" / "graphcore.ai_ipujobs.yaml"))
        self.kube.kubectl("wait", "--for=condition=Established", "crd/ipujobs.graphcore.ai", "--timeout=60s")
        self.kubelet = Kubelet(self.kube, directory / "kubelet", path=[str(BIN)])
        self.proxy_port = free_port()
        env = {**self.kube.env, "PYTHONUNBUFFERED": "1"}
        self.proxy = Service("proxy", [str(BIN / "vipu-ipu-proxy"), "--vipu-host", "127.0.0.1", "--vipu-port", str(self.pod.user_port),
                                       "--listen-address", "127.0.0.1", "--port", str(self.proxy_port), "--namespace", SYSTEM],
                             env, directory)
        self.operator = Service("operator", [str(BIN / "vipu-ipu-operator"), "--vipu-host", "127.0.0.1",
                                             "--vipu-port", str(self.pod.user_port), "--proxy-url", self.proxy_url,
                                             "--launcher-image", "vipu:test", "--restart-backoff", "1", "--resync", "1"],
                                env, directory)
        self.start_proxy()
        self.operator.start()

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
        for part in (self.operator, self.proxy):
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

    def submit(self, name: str, replicas: int = 4, per_replica: int = 1, workers: int = 1, **spec) -> str:
        document = {
            "apiVersion": "graphcore.ai/v1alpha1", "kind": "IPUJob", "metadata": {"name": name, "namespace": "default"},
            "spec": {"modelReplicas": str(replicas), "ipusPerModelReplica": str(per_replica),
                     "workers": {"replicas": workers, "template": {"metadata": {"labels": {"app": name}}, "spec": {
                         "containers": [{"name": "poplar", "image": "poplar:test",
                                         "env": [{"name": "IPUOF_LOG_LEVEL", "value": "INFO"}]}]}}},
                     **spec},
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
        wait_until(lambda: self.condition(name).get("type") == kind, timeout=timeout,
                   what=f"job {name} to be {kind} (it is {self.condition(name)}); operator:\n{self.operator.log()[-2000:]}")
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


def test_a_failing_launcher_is_restarted_on_a_reset_partition_until_its_backoff_limit(cluster):
    cluster.submit("flaky", launcher={"command": ["sh", "-c", "exit 3"]}, restartPolicy={"type": "OnFailure", "backoffLimit": 2})
    condition = cluster.wait_for("flaky", "Failed")
    assert condition["message"] == "IPUJob default/flaky has failed after 2 restart(s): its launcher exited with code 3."
    assert cluster.job("flaky")["status"]["restartCount"] == 2
    init = cluster.launcher_log("flaky", "launcher-init")
    assert init.count("partition p-default-flaky created") == 1 and init.count("partition p-default-flaky reset") == 2, init
    assert cluster.partitions() == {"p-default-flaky": 4}  # kept until the job is deleted, as the seed says


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


def test_jobs_that_together_exceed_the_pod_queue_instead_of_oversubscribing(cluster):
    cluster.submit("big", replicas=8, interactive={"ttl": 3600})
    cluster.wait_for("big", "Running")
    cluster.submit("small", replicas=4, interactive={"ttl": 3600})
    wait_until(lambda: "waiting for partition p-default-small" in cluster.launcher_log("small", "launcher-init"),
               what="the second job to wait for IPUs")
    assert cluster.condition("small")["type"] == "Pending"
    assert cluster.partitions() == {"p-default-big": 8}
    assert cluster.get("/stats") == {"default": {"used": 8, "available": 0}, "total": {"used": 8, "available": 0}}
    assert cluster.post("/query", {"size": 2}) == {"available": False, "numOfPartitions": 0, "message": ""}

    cluster.delete("big")  # frees its IPUs: the waiting job gets them
    cluster.wait_for("small", "Running", timeout=60)
    assert cluster.partitions() == {"p-default-small": 4}
    assert cluster.get("/stats") == {"default": {"used": 4, "available": 4}, "total": {"used": 4, "available": 4}}
    assert cluster.post("/query", {"size": 2}) == {"available": True, "numOfPartitions": 2, "message": ""}
    assert cluster.post("/query", {"size": 8})["numOfPartitions"] == 0


def test_the_tracker_survives_the_proxy_and_a_new_proxy_picks_it_up(cluster):
    cluster.submit("kept", interactive={"ttl": 3600})
    cluster.wait_for("kept", "Running")
    cluster.proxy.stop()  # as `helm uninstall` would: the tracker ConfigMap is not the chart's
    assert "p-default-kept" in cluster.tracked()
    cluster.start_proxy()
    assert "tracking 1 partition(s)" in cluster.proxy.log()
    cluster.delete("kept")  # the new proxy releases what the old one made
    assert cluster.partitions() == {}


def test_a_partition_made_by_hand_is_neither_tracked_nor_taken(cluster):
    assert cluster.pod.user("create", "partition", "p-default-manual", "--size", "1").code == 0
    try:
        cluster.submit("manual", replicas=1, interactive={"ttl": 3600})
        wait_until(lambda: "p-default-manual exists and was not made by this proxy" in cluster.launcher_log("manual", "launcher-init"),
                   what="the job to be told the partition is someone else's")
        assert "p-default-manual" not in cluster.tracked()
        assert cluster.get("/stats")["total"]["used"] == 1
    finally:
        cluster.delete("manual")
        assert cluster.pod.user("remove", "partition", "p-default-manual").code == 0


def test_an_invalid_job_fails_with_the_reason(cluster):
    cluster.submit("odd", replicas=3)
    assert cluster.wait_for("odd", "Failed")["message"] == (
        "IPUJob default/odd has an invalid specification: modelReplicas x ipusPerModelReplica = 3 IPUs: "
        "a partition's size must be a power of two")
    assert cluster.pods("odd") == []


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
