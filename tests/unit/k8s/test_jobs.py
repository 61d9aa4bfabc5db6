"""The IPUJob's specification, the objects it is made of, and the operator's decisions."""

from __future__ import annotations

import pytest
import yaml

from vipu.k8s import jobs
from vipu.k8s.controllers import Controller
from vipu.model.errors import InvalidArgument

SEED_JOB = """
apiVersion: graphcore.ai/v1alpha1
kind: IPUJob
metadata: {name: ipujob-sample, namespace: default, uid: u-1}
spec:
  modelReplicas: "4"
  ipusPerModelReplica: "1"
  launcher:
    command: [mpirun, --allow-run-as-root, -np, "1", python3, train.py]
  workers:
    replicas: 1
    template:
      metadata: {labels: {app: resnet-launcher}}
      spec:
        containers:
        - name: resnet
          image: resnet:latest
          env: [{name: IPUOF_LOG_LEVEL, value: INFO}]
"""
WIRING = jobs.Wiring("http://proxy", "launcher:latest")
CONTROLLER = Controller("vipu.example", 8090, "ipunode", "node1")
NOW, BACKOFF = 1_795_000_000.0, 10.0
STAMP = jobs.rfc3339(NOW)


def job_document(**spec_changes) -> dict:
    document = yaml.safe_load(SEED_JOB)
    document["spec"].update(spec_changes)
    return document


def spec(**spec_changes) -> jobs.JobSpec:
    return jobs.parse(job_document(**spec_changes))


def pod(phase: str, init_code: int | None = None, code: int | None = None) -> dict:
    status: dict = {"phase": phase}
    if init_code is not None:
        status["initContainerStatuses"] = [{"name": "launcher-init", "state": {"terminated": {"exitCode": init_code}}}]
    if code is not None:
        status["containerStatuses"] = [{"name": "launcher", "state": {"terminated": {"exitCode": code}}}]
    return {"metadata": {}, "status": status}


def pods_of(job: jobs.JobSpec, launcher: dict | None) -> dict:
    found = {job.worker_name(i): pod("Running") for i in range(job.workers)}
    if launcher is not None:
        found[job.launcher_name] = launcher
    return found


def condition(decision: jobs.Decision) -> dict:
    return jobs.current_condition(decision.status)


def test_the_seed_job_parses_with_the_documented_defaults():
    job = spec()
    assert (job.ipus, job.model_replicas, job.workers) == (4, 4, 1)
    assert (job.restart_policy, job.backoff_limit, job.clean_pod_policy, job.interactive_ttl) == ("Never", 3, "None", None)
    assert job.partition_id == "p-default-ipujob-sample"


@pytest.mark.parametrize("changes, message", [
    ({"modelReplicas": "3"}, "power of two"),
    ({"modelReplicas": "128"}, "larger than 64"),
    ({"ipusPerModelReplica": "zero"}, "ipusPerModelReplica must be a positive whole number"),
    ({"launcher": {}}, "launcher.command is required unless the job is interactive"),
    ({"restartPolicy": {"type": "Sometimes"}}, "restartPolicy.type must be one of"),
    ({"restartPolicy": {"backoffLimit": -1}}, "backOffLimit must be a whole number"),
    ({"restartPolicy": {"backOffLimit": 2, "backoffLimit": 5}}, r"backOffLimit \(2\) and backoffLimit \(5\) differ"),
    ({"cleanPodPolicy": "Some"}, "cleanPodPolicy must be one of"),
    ({"workers": {"template": {"spec": {"containers": []}}}}, "at least one container"),
    ({"workers": {"replicas": 3, "template": {"spec": {"containers": [{"name": "c"}]}}}},
     r"modelReplicas \(4\) must be a multiple of workers.replicas \(3\)"),
    ({"numGcds": 3}, r"spec.numGcds \(3\) must be a power of two that divides the partition's 4 IPUs"),
    ({"numGcds": 8}, r"spec.numGcds \(8\) must be a power of two that divides the partition's 4 IPUs"),
    ({"numGcds": 0}, "spec.numGcds must be a positive whole number"),
    ({"numGcds": 2}, r"modelReplicas \(4\) and workers.replicas \(1\) must be multiples of spec.numGcds \(2\)"),
])
def test_a_bad_specification_is_refused_with_the_reason(changes, message):
    with pytest.raises(InvalidArgument, match=message):
        spec(**changes)


def test_an_interactive_job_needs_no_command():
    assert spec(launcher={}, interactive={"ttl": 60}).interactive_ttl == 60


def test_partition_ids_stay_within_the_controllers_limit_and_stay_the_same():
    long = jobs.partition_id("a-namespace-with-a-long-name", "and-a-job-whose-name-is-longer-still-than-that")
    assert len(long) <= 63 and long == jobs.partition_id("a-namespace-with-a-long-name", "and-a-job-whose-name-is-longer-still-than-that")
    assert long != jobs.partition_id("a-namespace-with-a-long-name", "and-a-job-whose-name-is-longer-still-than-this")


def test_a_worker_runs_on_the_host_privileged_asleep_with_the_ipuof_variables():
    worker = jobs.worker_pod(spec(), 0, CONTROLLER)
    body = worker["spec"]
    assert worker["metadata"]["name"] == "ipujob-sample-worker-0"
    assert worker["metadata"]["labels"] == {"app": "resnet-launcher", jobs.JOB_LABEL: "ipujob-sample", jobs.ROLE_LABEL: "worker"}
    assert worker["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert (body["hostNetwork"], body["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert body["nodeSelector"] == {"ipunode": "node1"}  # where its controller's IPUs are reached
    container = body["containers"][0]
    assert container["securityContext"]["privileged"] is True
    assert container["command"] == jobs.WORKER_SLEEP
    env = {v["name"]: v["value"] for v in container["env"]}
    assert env == {"IPUOF_LOG_LEVEL": "INFO", "IPUOF_VIPU_API_HOST": "vipu.example", "IPUOF_VIPU_API_PORT": "8090",
                   "IPUOF_VIPU_API_PARTITION_ID": "p-default-ipujob-sample", "IPUOF_VIPU_API_GCD_ID": "0"}


def test_a_multi_gcd_jobs_workers_are_spread_over_its_gcds_each_told_its_own():
    template = {"spec": {"containers": [{"name": "c", "image": "poplar"}, {"name": "side", "image": "tools"}]}}
    job = spec(modelReplicas="8", numGcds=2, workers={"replicas": 4, "template": template})
    assert (job.ipus, job.num_gcds) == (8, 2)
    workers = [jobs.worker_pod(job, n, CONTROLLER)["spec"]["containers"] for n in range(4)]
    gcds = [[{v["name"]: v["value"] for v in c["env"]}["IPUOF_VIPU_API_GCD_ID"] for c in containers] for containers in workers]
    assert gcds == [["0", "0"], ["0", "0"], ["1", "1"], ["1", "1"]]  # every container of a worker is told the worker's GCD
    init = {v["name"]: v["value"] for v in jobs.launcher_pod(job, WIRING, CONTROLLER)["spec"]["initContainers"][0]["env"]}
    assert init["IPUJOB_GCDS"] == "2"


def test_the_launcher_waits_for_its_partition_then_runs_the_command():
    launcher = jobs.launcher_pod(spec(), WIRING, CONTROLLER)
    body = launcher["spec"]
    assert body["nodeSelector"] == {"ipunode": "node1"}
    assert body["serviceAccountName"] == "ipujob-sample-launcher"
    init = body["initContainers"][0]
    assert (init["image"], init["command"]) == ("launcher:latest", [jobs.INIT_PROGRAM])
    init_env = {v["name"]: v["value"] for v in init["env"]}
    assert init_env["IPUJOB_IPUS"] == "4" and init_env["IPUJOB_PARTITION"] == "p-default-ipujob-sample"
    assert init_env["VIPU_PROXY_URL"] == "http://proxy" and init_env["IPUJOB_WORKERS"] == "1"
    assert init_env["IPUJOB_CONTROLLER"] == "vipu.example:8090"
    main = body["containers"][0]
    assert main["image"] == "resnet:latest" and main["command"][0] == "mpirun"
    assert {"name": "ipujob-config", "mountPath": jobs.CONFIG_MOUNT} in main["volumeMounts"]
    assert all(c["securityContext"]["privileged"] for c in body["initContainers"] + body["containers"])


def test_a_jobs_partition_is_expected_to_run_until_what_ends_the_job_ends_it():
    def with_deadline(deadline) -> dict:
        workers = job_document()["spec"]["workers"]
        workers["template"]["spec"]["activeDeadlineSeconds"] = deadline
        return workers

    assert spec().expected_seconds == 0  # nothing ends it: unknown
    assert spec(workers=with_deadline(7200)).expected_seconds == 7200  # Kubernetes ends its workers then
    assert spec(launcher={}, interactive={"ttl": 600}).expected_seconds == 600
    assert spec(launcher={}, interactive={"ttl": 600}, workers=with_deadline(7200)).expected_seconds == 600  # the sooner
    assert spec(workers=with_deadline("soon")).expected_seconds == 0  # the API server judges its own field
    assert spec(workers=with_deadline(True)).expected_seconds == 0
    init = jobs.launcher_pod(spec(workers=with_deadline(7200)), WIRING, CONTROLLER)["spec"]["initContainers"][0]
    assert {"name": "IPUJOB_EXPECTED_SECONDS", "value": "7200"} in init["env"]


def test_a_jobs_reservation_goes_to_its_launcher_and_a_bad_one_is_refused():
    assert spec().reservation == ""
    reserved = spec(reservation="train")
    init = jobs.launcher_pod(reserved, WIRING, CONTROLLER)["spec"]["initContainers"][0]
    assert {"name": "IPUJOB_RESERVATION", "value": "train"} in init["env"]
    assert spec(reservation="team:a").reservation == "team:a"  # the model's rule of ids
    with pytest.raises(InvalidArgument, match=r"spec\.reservation names a vipu reservation"):
        spec(reservation=7)
    for bad in ("two words", "-x", "x" * 64):
        with pytest.raises(InvalidArgument, match="invalid reservation id"):
            spec(reservation=bad)


def test_an_interactive_launcher_only_sleeps_out_its_ttl():
    launcher = jobs.launcher_pod(spec(launcher={}, interactive={"ttl": 90}), WIRING, CONTROLLER)
    assert launcher["spec"]["containers"][0]["command"] == ["sleep", "90"]


def test_the_config_map_lists_the_workers_and_execs_into_the_jobs_namespace():
    data = jobs.config_map(spec(workers={**job_document()["spec"]["workers"], "replicas": 4}))["data"]
    assert data["hostfile"].split() == [f"ipujob-sample-worker-{i}" for i in range(4)]
    assert 'kubectl exec --namespace "default"' in data["kubeexec"]


def test_the_launcher_may_only_watch_pods_and_exec_into_its_workers():
    account, role, binding = jobs.launcher_rbac(spec())
    assert {tuple(r["resources"]): (tuple(r["verbs"]), tuple(r.get("resourceNames", ()))) for r in role["rules"]} == {
        ("pods",): (("get", "list", "watch"), ()), ("pods/exec",): (("create",), ("ipujob-sample-worker-0",))}
    assert binding["subjects"][0]["name"] == account["metadata"]["name"]


def test_a_new_job_gets_its_pods_and_waits_with_the_seeds_message():
    job = spec()
    decision = jobs.decide(job, {}, {}, NOW, BACKOFF)
    assert decision.create == ("ipujob-sample-worker-0", "ipujob-sample-launcher")
    assert condition(decision)["type"] == "Pending"
    assert condition(decision)["message"] == "IPUJob default/ipujob-sample is waiting for resources to be ready."
    assert decision.status["startTime"] == STAMP and decision.status["ipuPartitionCreated"] is False
    assert decision.status["iPUPartitionCreated"] is False  # the seed's spelling ("I PU Partition Created") too


def test_a_running_launcher_makes_the_job_running_and_pending_false():
    job = spec()
    pending = jobs.decide(job, {}, {}, NOW, BACKOFF).status
    decision = jobs.decide(job, pending, pods_of(job, pod("Running", init_code=0)), NOW + 5, BACKOFF)
    assert decision.create == () and decision.delete == ()
    assert [(c["type"], c["status"]) for c in decision.status["conditions"]] == [("Pending", "False"), ("Running", "True")]
    assert condition(decision)["message"] == "IPUJob default/ipujob-sample is running."
    assert decision.status["ipuPartitionCreated"] is True and decision.status["workersStatus"]["active"] == 1
    assert decision.status["iPUPartitionCreated"] is True


@pytest.mark.parametrize("policy, deleted", [
    ("None", ()),
    ("Workers", ("ipujob-sample-worker-0",)),
    ("All", ("ipujob-sample-launcher", "ipujob-sample-worker-0")),
])
def test_a_finished_job_cleans_its_pods_by_policy(policy, deleted):
    job = spec(cleanPodPolicy=policy)
    decision = jobs.decide(job, {}, pods_of(job, pod("Succeeded", 0, 0)), NOW, BACKOFF)
    assert condition(decision)["type"] == "Succeeded"
    assert condition(decision)["message"] == "IPUJob default/ipujob-sample successfully completed."
    assert decision.delete == deleted
    assert decision.status["completionTime"] == STAMP


def test_a_failed_launcher_fails_the_job_under_never():
    job = spec()
    decision = jobs.decide(job, {}, pods_of(job, pod("Failed", 0, 3)), NOW, BACKOFF)
    assert condition(decision)["type"] == "Failed"
    assert condition(decision)["message"] == "IPUJob default/ipujob-sample has failed: its launcher exited with code 3."


def test_on_failure_restarts_after_a_growing_back_off_until_the_limit():
    job = spec(restartPolicy={"type": "OnFailure", "backoffLimit": 2})
    failed = pods_of(job, pod("Failed", 0, 1))
    first = jobs.decide(job, {}, failed, NOW, BACKOFF)
    assert first.delete == ("ipujob-sample-launcher",) and first.recheck_after == BACKOFF
    assert first.status["restartCount"] == 1 and condition(first)["reason"] == "IPUJobRestarting"
    waiting = jobs.decide(job, first.status, pods_of(job, None), NOW + BACKOFF / 2, BACKOFF)
    assert waiting.create == () and waiting.recheck_after == pytest.approx(BACKOFF / 2)
    assert condition(waiting)["reason"] == "IPUJobRestarting"
    again = jobs.decide(job, waiting.status, pods_of(job, None), NOW + BACKOFF, BACKOFF)
    assert again.create == ("ipujob-sample-launcher",)
    second = jobs.decide(job, again.status, failed, NOW + 20, BACKOFF)
    assert second.status["restartCount"] == 2 and second.recheck_after == 2 * BACKOFF
    last = jobs.decide(job, second.status, failed, NOW + 60, BACKOFF)
    assert condition(last)["type"] == "Failed"
    assert condition(last)["message"].endswith("has failed after 2 restart(s): its launcher exited with code 1.")


@pytest.mark.parametrize("code, restarts", [(137, True), (1, False)])
def test_exit_code_restarts_only_what_a_signal_ended(code, restarts):
    job = spec(restartPolicy={"type": "ExitCode"})
    decision = jobs.decide(job, {}, pods_of(job, pod("Failed", 0, code)), NOW, BACKOFF)
    assert (decision.status["restartCount"] == 1) is restarts


def test_always_restarts_a_job_that_succeeded():
    job = spec(restartPolicy={"type": "Always", "backoffLimit": 1})
    decision = jobs.decide(job, {}, pods_of(job, pod("Succeeded", 0, 0)), NOW, BACKOFF)
    assert decision.status["restartCount"] == 1 and decision.delete == ("ipujob-sample-launcher",)


def test_a_failed_worker_fails_the_attempt():
    job = spec()
    pods = {**pods_of(job, pod("Running", 0)), "ipujob-sample-worker-0": pod("Failed", code=2)}
    decision = jobs.decide(job, {}, pods, NOW, BACKOFF)
    assert condition(decision)["message"] == "IPUJob default/ipujob-sample has failed: worker ipujob-sample-worker-0 exited with code 2."


def test_an_interactive_job_ends_when_its_ttl_has_passed():
    job = spec(launcher={}, interactive={"ttl": 30})
    running = jobs.decide(job, {}, pods_of(job, pod("Running", 0)), NOW, BACKOFF)
    assert condition(running)["type"] == "Running" and running.recheck_after == 30
    later = jobs.decide(job, running.status, pods_of(job, pod("Running", 0)), NOW + 29, BACKOFF)
    assert condition(later)["type"] == "Running" and later.recheck_after == pytest.approx(1)
    over = jobs.decide(job, later.status, pods_of(job, pod("Running", 0)), NOW + 30, BACKOFF)
    assert condition(over)["reason"] == "IPUJobExpired" and condition(over)["type"] == "Succeeded"
    assert over.delete == ("ipujob-sample-launcher", "ipujob-sample-worker-0")


def test_an_interactive_launcher_that_slept_out_its_ttl_ends_the_session():
    job = spec(launcher={}, interactive={"ttl": 30})
    decision = jobs.decide(job, {}, pods_of(job, pod("Succeeded", 0, 0)), NOW, BACKOFF)
    assert condition(decision)["reason"] == "IPUJobExpired"
    assert decision.delete == ("ipujob-sample-launcher", "ipujob-sample-worker-0")


def test_the_chosen_controller_is_read_back_from_the_status():
    assert jobs.controller_of({"controller": CONTROLLER.describe()}) == CONTROLLER
    assert jobs.controller_of({}) is None


@pytest.mark.parametrize("restart, limit", [({}, 3), ({"backOffLimit": 5}, 5), ({"backoffLimit": 4}, 4),
                                            ({"backOffLimit": 2, "backoffLimit": 2}, 2)])
def test_the_limit_of_restarts_is_read_in_the_seeds_spelling_and_in_vipus_first(restart, limit):
    """The seed's IPUJob says restartPolicy.backOffLimit (kubectl describe: "Back Off Limit"); vipu
    first spelt it backoffLimit, and takes both."""
    assert spec(restartPolicy={"type": "OnFailure", **restart}).backoff_limit == limit


def test_a_drain_under_a_running_jobs_partition_is_a_condition_beside_its_state_that_clears_when_the_drain_ends():
    job = spec()
    running = jobs.decide(job, jobs.decide(job, {}, {}, NOW, BACKOFF).status, pods_of(job, pod("Running", init_code=0)),
                          NOW + 5, BACKOFF).status
    notice = "ag2 drained by ops since 2026-12-07 06:00 UTC: cable repair; this partition is left to finish"
    drained = {**running, "conditions": jobs.with_drains(running, [notice], jobs.rfc3339(NOW + 6))}
    assert jobs.drain_condition(drained) == {"type": jobs.DRAINING, "status": "True", "reason": "MachineDraining",
                                             "message": notice, "lastTransitionTime": jobs.rfc3339(NOW + 6),
                                             "lastUpdateTime": jobs.rfc3339(NOW + 6)}
    assert drained["conditions"][-1]["type"] == "Running"  # the STATUS column still shows the job's state
    assert jobs.current_condition(drained)["type"] == "Running" and not jobs.is_finished(drained)
    assert jobs.with_drains(drained, [notice], jobs.rfc3339(NOW + 9)) == drained["conditions"]  # told once

    succeeded = jobs.decide(job, drained, pods_of(job, pod("Succeeded", 0, 0)), NOW + 10, BACKOFF).status
    assert jobs.drain_condition(succeeded)["status"] == "True"  # a new state leaves the drain's condition as it was
    assert [c["type"] for c in succeeded["conditions"] if c["status"] == "True"] == [jobs.DRAINING, "Succeeded"]
    over = jobs.with_drains(succeeded, [], jobs.rfc3339(NOW + 11))
    assert jobs.drain_condition({"conditions": over}) | {"lastUpdateTime": None} == {
        "type": jobs.DRAINING, "status": "False", "reason": "NoDrain", "message": "no machine of its partition is drained now",
        "lastTransitionTime": jobs.rfc3339(NOW + 11), "lastUpdateTime": None}
    assert jobs.with_drains(running, [], STAMP) == running["conditions"]  # never drained: no condition at all
