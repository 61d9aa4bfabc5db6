"""An IPUJob: its specification, the Kubernetes objects it is made of, and what its pods mean.

Pure functions over plain dictionaries (as the API server sends and takes them), so the operator's
decisions can be tested without a cluster. The operator (`operator.py`) does the I/O.

One job is:
- a ConfigMap `<job>-ipujob` with `kubeexec` (MPI's remote shell: `kubectl exec` into a worker)
  and `hostfile` (the worker pods), mounted in the launcher at /etc/ipujob;
- a ServiceAccount, Role and RoleBinding `<job>-launcher` letting the launcher list and watch
  pods and exec into the job's workers;
- worker pods `<job>-worker-<i>`, the user's template with its first container put to sleep until
  the launcher execs the job's processes into it, and the IPUoF variables in every container;
- a launcher pod `<job>-launcher`, whose init container (`vipu-ipujob-init`) waits for the workers
  to be Ready and has the proxy create (or reset) the job's partition, and whose container runs
  `launcher.command` (or, for an interactive job, nothing but a sleep).
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime

from vipu.k8s.controllers import Controller
from vipu.model.entities import check_id
from vipu.model.errors import InvalidArgument

GROUP = "graphcore.ai"
VERSION = "v1alpha1"
PLURAL = "ipujobs"
KIND = "IPUJob"
FINALIZER = "ipu.finalizers.graphcore.ai"

JOB_LABEL = "graphcore.ai/ipujob"
ROLE_LABEL = "graphcore.ai/ipujob-role"
CONFIG_MOUNT = "/etc/ipujob"
WORKER_SLEEP = ["sleep", "365d"]  # until the launcher execs the job's processes into the worker
INIT_PROGRAM = "vipu-ipujob-init"

RESTART_POLICIES = ("Never", "Always", "OnFailure", "ExitCode")
CLEAN_POD_POLICIES = ("None", "All", "Workers")
MAX_PARTITION_IPUS = 64  # the seed's known limitation


@dataclass(frozen=True)
class JobSpec:
    namespace: str
    name: str
    uid: str
    model_replicas: int
    ipus_per_replica: int
    workers: int
    worker_template: dict
    command: tuple[str, ...]
    interactive_ttl: int | None
    restart_policy: str
    backoff_limit: int
    clean_pod_policy: str
    expected_seconds: int = 0  # how long its partition is expected to run (`expected_seconds`); 0: unknown
    reservation: str = ""  # the vipu reservation its partition is made in (`vipu list reservations`); "": none
    num_gcds: int = 1  # the GCDs its partition is split into, as `vipu create partition --num-gcds`

    def gcd_of(self, worker: int) -> int:
        """The GCD a worker runs on: the workers in order, an equal run of them on each GCD."""
        return worker * self.num_gcds // self.workers

    @property
    def ipus(self) -> int:
        return self.model_replicas * self.ipus_per_replica

    @property
    def partition_id(self) -> str:
        return partition_id(self.namespace, self.name)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def worker_name(self, index: int) -> str:
        return f"{self.name}-worker-{index}"

    @property
    def launcher_name(self) -> str:
        return f"{self.name}-launcher"

    @property
    def config_name(self) -> str:
        return f"{self.name}-ipujob"


def partition_id(namespace: str, name: str) -> str:
    """`p-<namespace>-<job>`, shortened with a digest when longer than a partition id may be."""
    full = f"p-{namespace}-{name}"
    if len(full) <= 63:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    return f"{full[:54]}-{digest}"


def _count(spec: dict, field: str, default: int | None = None) -> int:
    value = spec.get(field, default)
    text = str(value).strip() if value is not None else ""
    if not text.isdigit() or int(text) < 1:
        raise InvalidArgument(f"spec.{field} must be a positive whole number, not {value!r}")
    return int(text)


def _object(parent: dict, field: str, where: str) -> dict:
    """parent[field] as an object, {} when absent; InvalidArgument when it is something else."""
    value = parent.get(field)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgument(f"{where}{field} must be an object, not {value!r}")
    return value


BACKOFF_LIMITS = ("backOffLimit", "backoffLimit")  # the seed's spelling ("Back Off Limit" in kubectl describe), then vipu's first one
DEFAULT_BACKOFF_LIMIT = 3


def backoff_limit(restart: dict) -> int:
    """spec.restartPolicy's limit of restarts, by either spelling (given both, they must agree)."""
    given = {key: restart[key] for key in BACKOFF_LIMITS if key in restart}
    if len({repr(value) for value in given.values()}) > 1:
        raise InvalidArgument(f"spec.restartPolicy.backOffLimit ({given['backOffLimit']!r}) and backoffLimit ({given['backoffLimit']!r}) "
                              "differ; give one")
    backoff = next(iter(given.values()), DEFAULT_BACKOFF_LIMIT)
    if not isinstance(backoff, int) or isinstance(backoff, bool) or backoff < 0:
        raise InvalidArgument(f"spec.restartPolicy.backOffLimit must be a whole number of at least 0, not {backoff!r}")
    return backoff


def expected_seconds(spec: dict) -> int:
    """How long the job is expected to run, from what ends it: its interactive session's ttl, and its
    workers' activeDeadlineSeconds (Kubernetes ends them then); the sooner of the two, 0 if neither
    is a positive whole number (the API server judges the template's own fields)."""
    interactive = spec.get("interactive")
    workers = spec.get("workers")
    template = workers.get("template") if isinstance(workers, dict) else None
    pod_spec = template.get("spec") if isinstance(template, dict) else None
    limits = [interactive.get("ttl") if isinstance(interactive, dict) else None,
              pod_spec.get("activeDeadlineSeconds") if isinstance(pod_spec, dict) else None]
    given = [limit for limit in limits if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0]
    return min(given, default=0)


def parse(job: dict) -> JobSpec:
    """The job's specification, or InvalidArgument naming the first thing wrong with it."""
    metadata, spec = _object(job, "metadata", ""), _object(job, "spec", "")
    replicas = _count(spec, "modelReplicas")
    per_replica = _count(spec, "ipusPerModelReplica")
    ipus = replicas * per_replica
    if ipus & (ipus - 1):
        raise InvalidArgument(f"modelReplicas x ipusPerModelReplica = {ipus} IPUs: a partition's size must be a power of two")
    if ipus > MAX_PARTITION_IPUS:
        raise InvalidArgument(f"{ipus} IPUs: partitions larger than {MAX_PARTITION_IPUS} IPUs are not supported")
    workers = _object(spec, "workers", "spec.")
    template = _object(workers, "template", "spec.workers.")
    containers = _object(template, "spec", "spec.workers.template.").get("containers")
    if not isinstance(containers, list) or not containers or not all(isinstance(c, dict) for c in containers):
        raise InvalidArgument("spec.workers.template.spec.containers must name at least one container")
    worker_count = _count(workers, "replicas", 1)
    if replicas % worker_count:
        raise InvalidArgument(f"modelReplicas ({replicas}) must be a multiple of workers.replicas ({worker_count}): "
                              "each worker runs whole model replicas")
    gcds = _count(spec, "numGcds", 1)
    if gcds & (gcds - 1) or ipus % gcds:
        raise InvalidArgument(f"spec.numGcds ({gcds}) must be a power of two that divides the partition's {ipus} IPUs")
    if replicas % gcds or worker_count % gcds:
        raise InvalidArgument(f"modelReplicas ({replicas}) and workers.replicas ({worker_count}) must be multiples of spec.numGcds "
                              f"({gcds}): each GCD runs whole model replicas, on workers of its own")
    interactive = _object(spec, "interactive", "spec.")
    ttl = _count(interactive, "ttl") if interactive.get("ttl") is not None else None
    command = _object(spec, "launcher", "spec.").get("command") or []
    if not isinstance(command, list):
        raise InvalidArgument(f"spec.launcher.command must be a list of words, not {command!r}")
    if not command and ttl is None:
        raise InvalidArgument("spec.launcher.command is required unless the job is interactive")
    restart = _object(spec, "restartPolicy", "spec.")
    restart_type = restart.get("type", "Never")
    if restart_type not in RESTART_POLICIES:
        raise InvalidArgument(f"spec.restartPolicy.type must be one of {', '.join(RESTART_POLICIES)}, not {restart_type!r}")
    backoff = backoff_limit(restart)
    clean = spec.get("cleanPodPolicy", "None")
    if clean not in CLEAN_POD_POLICIES:
        raise InvalidArgument(f"spec.cleanPodPolicy must be one of {', '.join(CLEAN_POD_POLICIES)}, not {clean!r}")
    reservation = spec.get("reservation", "")
    if not isinstance(reservation, str):
        raise InvalidArgument(f"spec.reservation names a vipu reservation, not {reservation!r}")
    if reservation:
        check_id("reservation", reservation)
    return JobSpec(
        namespace=str(metadata.get("namespace", "default")), name=str(metadata.get("name", "")), uid=str(metadata.get("uid", "")),
        model_replicas=replicas, ipus_per_replica=per_replica, workers=worker_count, worker_template=template,
        command=tuple(str(part) for part in command), interactive_ttl=ttl, restart_policy=restart_type,
        backoff_limit=backoff, clean_pod_policy=clean, expected_seconds=expected_seconds(spec), reservation=reservation,
        num_gcds=gcds,
    )


@dataclass(frozen=True)
class Wiring:
    """What the operator was told at start-up that every job's pods need."""

    proxy_url: str
    launcher_image: str


def controller_of(status: dict) -> Controller | None:
    """The V-IPU controller the proxy chose for the job, as its status records it."""
    chosen = status.get("controller") or {}
    if not chosen.get("host"):
        return None
    key, _, value = (chosen.get("label") or "").partition("=")
    return Controller(chosen["host"], int(chosen["port"]), key, value)


def _owner(job: JobSpec) -> list[dict]:
    return [{"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": job.name, "uid": job.uid,
             "controller": True, "blockOwnerDeletion": True}]


def _metadata(job: JobSpec, name: str, role: str, extra_labels: dict | None = None) -> dict:
    return {"name": name, "namespace": job.namespace, "ownerReferences": _owner(job),
            "labels": {**(extra_labels or {}), JOB_LABEL: job.name, ROLE_LABEL: role}}


def _env(pairs: dict[str, str]) -> list[dict]:
    return [{"name": key, "value": value} for key, value in pairs.items()]


def _with_env(container: dict, pairs: dict[str, str]) -> dict:
    """The container with these variables set, replacing any of the same names it had."""
    kept = [v for v in container.get("env") or [] if v.get("name") not in pairs]
    return {**container, "env": kept + _env(pairs)}


def ipuof_environment(job: JobSpec, controller: Controller, gcd: int = 0) -> dict[str, str]:
    """The variables that let Poplar (or `vipu-ipuof run`) find the job's partition, and its GCD there."""
    return {
        "IPUOF_VIPU_API_HOST": controller.host,
        "IPUOF_VIPU_API_PORT": str(controller.port),
        "IPUOF_VIPU_API_PARTITION_ID": job.partition_id,
        "IPUOF_VIPU_API_GCD_ID": str(gcd),
    }


def _on_host(pod_spec: dict, controller: Controller) -> dict:
    """As the seed lists: host network (for the RDMA interface), privileged, ClusterFirstWithHostNet;
    and on a node carrying the label of the controller whose IPUs the job uses."""
    if controller.node_selector:
        pod_spec["nodeSelector"] = {**(pod_spec.get("nodeSelector") or {}), **controller.node_selector}
    pod_spec["hostNetwork"] = True
    pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    pod_spec["restartPolicy"] = "Never"
    for group in ("initContainers", "containers"):
        for container in pod_spec.get(group) or []:
            container["securityContext"] = {**(container.get("securityContext") or {}), "privileged": True}
    return pod_spec


def worker_pod(job: JobSpec, index: int, controller: Controller) -> dict:
    template = copy.deepcopy(job.worker_template)
    spec = template.get("spec") or {}
    containers = [_with_env(c, ipuof_environment(job, controller, job.gcd_of(index))) for c in spec["containers"]]
    containers[0] = {**containers[0], "command": list(WORKER_SLEEP)}
    containers[0].pop("args", None)
    spec["containers"] = containers
    labels = (template.get("metadata") or {}).get("labels") or {}
    metadata = _metadata(job, job.worker_name(index), "worker", labels)
    metadata["annotations"] = (template.get("metadata") or {}).get("annotations") or {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": _on_host(spec, controller)}


def launcher_pod(job: JobSpec, wiring: Wiring, controller: Controller) -> dict:
    template = copy.deepcopy(job.worker_template)
    worker_spec = template.get("spec") or {}
    first = worker_spec["containers"][0]
    command = list(job.command) if job.interactive_ttl is None else ["sleep", str(job.interactive_ttl)]
    mpi = {"OMPI_MCA_plm_rsh_agent": f"{CONFIG_MOUNT}/kubeexec", "OMPI_MCA_orte_default_hostfile": f"{CONFIG_MOUNT}/hostfile"}
    main = {
        "name": "launcher", "image": first.get("image", ""), "command": command,
        "env": (first.get("env") or []) + _env({**mpi, **ipuof_environment(job, controller)}),
        "volumeMounts": (first.get("volumeMounts") or []) + [{"name": "ipujob-config", "mountPath": CONFIG_MOUNT}],
    }
    if first.get("imagePullPolicy"):
        main["imagePullPolicy"] = first["imagePullPolicy"]
    init = {
        "name": "launcher-init", "image": wiring.launcher_image, "command": [INIT_PROGRAM],
        "env": _env({
            "IPUJOB_NAME": job.name, "IPUJOB_NAMESPACE": job.namespace, "IPUJOB_UID": job.uid,
            "IPUJOB_WORKERS": str(job.workers), "IPUJOB_PARTITION": job.partition_id,
            "IPUJOB_IPUS": str(job.ipus), "IPUJOB_MODEL_REPLICAS": str(job.model_replicas), "IPUJOB_GCDS": str(job.num_gcds),
            "IPUJOB_CONTROLLER": controller.address, "VIPU_PROXY_URL": wiring.proxy_url,
            "IPUJOB_EXPECTED_SECONDS": str(job.expected_seconds), "IPUJOB_RESERVATION": job.reservation,
        }),
    }
    spec = {
        "serviceAccountName": job.launcher_name,
        "initContainers": [init],
        "containers": [main],
        "volumes": (worker_spec.get("volumes") or []) + [
            {"name": "ipujob-config", "configMap": {"name": job.config_name, "defaultMode": 0o755}}],
    }
    for field in ("nodeSelector", "tolerations", "affinity", "imagePullSecrets"):
        if worker_spec.get(field):
            spec[field] = worker_spec[field]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": _metadata(job, job.launcher_name, "launcher"),
            "spec": _on_host(spec, controller)}


KUBEEXEC = """#!/bin/sh
# MPI's remote shell agent for an IPUJob: run a command in one of the job's worker pods.
# mpirun calls it as: kubeexec <worker pod> <command...>
set -e
pod="$1"
shift
exec kubectl exec --namespace "{namespace}" "$pod" -- /bin/sh -c "$*"
"""


def config_map(job: JobSpec) -> dict:
    hostfile = "".join(f"{job.worker_name(i)}\n" for i in range(job.workers))
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _metadata(job, job.config_name, "config"),
            "data": {"kubeexec": KUBEEXEC.replace("{namespace}", job.namespace), "hostfile": hostfile}}


def launcher_rbac(job: JobSpec) -> list[dict]:
    """The launcher's identity: it may watch the namespace's pods and exec into its job's workers, nothing more."""
    name = job.launcher_name
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _metadata(job, name, "launcher")},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _metadata(job, name, "launcher"),
         "rules": [
             {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
             {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"],
              "resourceNames": [job.worker_name(i) for i in range(job.workers)]},
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _metadata(job, name, "launcher"),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": job.namespace}]},
    ]


# What the pods say, and what to do about it


@dataclass(frozen=True)
class Decision:
    """One reconciliation's verdict: pods to create and delete, the new status, when to look again."""

    create: tuple[str, ...]
    delete: tuple[str, ...]
    status: dict
    recheck_after: float | None = None


def _phase(pod: dict | None) -> str:
    return ((pod or {}).get("status") or {}).get("phase", "Pending")


def _terminated(pod: dict, group: str) -> list[dict]:
    return [s["state"]["terminated"] for s in (pod.get("status") or {}).get(group) or []
            if (s.get("state") or {}).get("terminated")]


def exit_code(pod: dict) -> int:
    """The first non-zero exit code of the pod's init containers, then containers; 0 if none."""
    for group in ("initContainerStatuses", "containerStatuses"):
        for state in _terminated(pod, group):
            if state.get("exitCode", 0) != 0:
                return int(state["exitCode"])
    return 0


def partition_obtained(launcher: dict | None) -> bool:
    """Whether the launcher's init container has created the partition (it ends only then)."""
    if launcher is None:
        return False
    states = _terminated(launcher, "initContainerStatuses")
    return bool(states) and all(s.get("exitCode") == 0 for s in states)


# A condition beside the job's state (Pending, Running, ...), first in the list so that the state's stays
# last (the STATUS column): True while an operator drains a machine of the job's partition.
DRAINING = "PartitionDraining"


def with_condition(status: dict, kind: str, reason: str, message: str, now: str) -> list[dict]:
    """The conditions with `kind` the one true state, last in the list as the latest."""
    conditions = []
    current = None
    for condition in status.get("conditions") or []:
        if condition["type"] == kind:
            current = condition
            continue
        if condition.get("status") == "True" and condition["type"] != DRAINING:
            condition = {**condition, "status": "False", "lastTransitionTime": now, "lastUpdateTime": now}
        conditions.append(condition)
    unchanged = current is not None and current.get("status") == "True" and current.get("reason") == reason \
        and current.get("message") == message
    if unchanged:
        return [*conditions, current]
    transition = now if current is None or current.get("status") != "True" else current.get("lastTransitionTime", now)
    return [*conditions, {"type": kind, "status": "True", "reason": reason, "message": message,
                          "lastTransitionTime": transition, "lastUpdateTime": now}]


def current_condition(status: dict) -> dict | None:
    """The job's state: its latest true condition, the drain's aside."""
    return next((c for c in reversed(status.get("conditions") or []) if c.get("status") == "True" and c["type"] != DRAINING),
                None)


def drain_condition(status: dict) -> dict | None:
    """The job's PartitionDraining condition, if it was ever drained."""
    return next((c for c in status.get("conditions") or [] if c["type"] == DRAINING), None)


def with_drains(status: dict, notices: list[str], now: str) -> list[dict]:
    """The conditions with the drain's saying `notices` (the partition's `drain_notices`, a line per
    machine drained under it): True while there are some, False once there are none (absent if there
    never were)."""
    conditions = list(status.get("conditions") or [])
    before = drain_condition(status)
    if before is None and not notices:
        return conditions
    state, message = ("True", "; ".join(notices)) if notices else ("False", "no machine of its partition is drained now")
    condition = {"type": DRAINING, "status": state, "reason": "MachineDraining" if notices else "NoDrain", "message": message,
                 "lastTransitionTime": now, "lastUpdateTime": now}
    if before is None:
        return [condition, *conditions]
    if (before.get("status"), before.get("message")) == (state, message):
        return conditions
    if before.get("status") == state:  # the same state, said anew
        condition["lastTransitionTime"] = before.get("lastTransitionTime", now)
    conditions[conditions.index(before)] = condition
    return conditions


def is_finished(status: dict) -> bool:
    condition = current_condition(status)
    return condition is not None and condition["type"] in ("Succeeded", "Failed")


def _restartable(job: JobSpec, succeeded: bool, code: int) -> bool:
    if job.restart_policy == "Always":
        return True
    if succeeded:
        return False
    if job.restart_policy == "OnFailure":
        return True
    return job.restart_policy == "ExitCode" and code >= 128  # killed by a signal: worth another try


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seconds(stamp: str | None, default: float) -> float:
    if not stamp:
        return default
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def decide(job: JobSpec, status: dict, pods: dict[str, dict], now: float, backoff: float) -> Decision:
    """What to do for a job, given its status and its pods (by name), at time `now` (seconds since the epoch).

    `backoff` is the first restart's delay; each further restart waits twice as long.
    """
    stamp = rfc3339(now)
    status = copy.deepcopy(status)
    status.setdefault("startTime", stamp)
    status.setdefault("restartCount", 0)
    status["partition"] = job.partition_id
    workers = [job.worker_name(i) for i in range(job.workers)]
    launcher = pods.get(job.launcher_name)
    live = {name for name, pod in pods.items() if not (pod.get("metadata") or {}).get("deletionTimestamp")}
    phases = [_phase(pods.get(name)) for name in workers]
    status["workersStatus"] = {"active": phases.count("Running"), "succeeded": phases.count("Succeeded"),
                               "failed": phases.count("Failed")}
    status["launcherStatus"] = _phase(launcher) if launcher is not None else "Absent"
    if partition_obtained(launcher):
        status["ipuPartitionCreated"] = status["iPUPartitionCreated"] = True
    status.setdefault("ipuPartitionCreated", False)
    status.setdefault("iPUPartitionCreated", status["ipuPartitionCreated"])  # the seed's spelling of the same
    subject = f"IPUJob {job.key}"

    if is_finished(status):
        return Decision((), _cleanable(job, pods), status)

    failed_worker = next((name for name in workers if _phase(pods.get(name)) == "Failed"), None)
    outcome = _phase(launcher) if launcher is not None else None
    if failed_worker is not None and outcome not in ("Succeeded", "Failed"):
        outcome, code, culprit = "Failed", exit_code(pods[failed_worker]), f"worker {failed_worker}"
    else:
        code, culprit = (exit_code(launcher) if launcher is not None else 0), "its launcher"

    if outcome == "Succeeded" and job.interactive_ttl is not None:
        return _expired(job, status, live, workers, stamp)
    if outcome in ("Succeeded", "Failed"):
        succeeded = outcome == "Succeeded"
        if _restartable(job, succeeded, code) and status["restartCount"] < job.backoff_limit:
            delay = backoff * 2 ** status["restartCount"]
            status["restartCount"] += 1
            status["restartAt"] = rfc3339(now + delay)
            ended = "completed" if succeeded else f"failed (exit code {code})"
            status["conditions"] = with_condition(status, "Pending", "IPUJobRestarting",
                                              f"{subject} is restarting (restart {status['restartCount']} of at most "
                                              f"{job.backoff_limit}) after {culprit} {ended}.", stamp)
            doomed = [job.launcher_name] + [n for n in workers if _phase(pods.get(n)) == "Failed"]
            return Decision((), tuple(n for n in doomed if n in live), status, delay)
        status["completionTime"] = stamp
        status.pop("restartAt", None)
        if succeeded:
            status["conditions"] = with_condition(status, "Succeeded", "IPUJobSucceeded", f"{subject} successfully completed.", stamp)
        else:
            limit = f" after {status['restartCount']} restart(s)" if status["restartCount"] else ""
            status["conditions"] = with_condition(status, "Failed", "IPUJobFailed",
                                              f"{subject} has failed{limit}: {culprit} exited with code {code}.", stamp)
        return Decision((), _cleanable(job, pods), status)

    waiting = _seconds(status.get("restartAt"), now) - now
    create = [name for name in workers if name not in pods]
    recheck = None
    if launcher is None:
        if waiting > 0:
            recheck = waiting
        else:
            create.append(job.launcher_name)
            status.pop("restartAt", None)

    if outcome == "Running":
        condition = current_condition(status) or {}
        if condition.get("type") != "Running":
            status["conditions"] = with_condition(status, "Running", "IPUJobRunning", f"{subject} is running.", stamp)
            status["runningSince"] = stamp
        if job.interactive_ttl is not None:
            left = _seconds(status.get("runningSince"), now) + job.interactive_ttl - now
            if left <= 0:
                return _expired(job, status, live, workers, stamp)
            recheck = left
    elif launcher is not None or waiting <= 0:  # while a restart waits out its back-off, it says so
        status["conditions"] = with_condition(status, "Pending", "IPUJobPending",
                                          f"{subject} is waiting for resources to be ready.", stamp)
    return Decision(tuple(create), (), status, recheck)


def _expired(job: JobSpec, status: dict, live: set[str], workers: list[str], stamp: str) -> Decision:
    """An interactive session's end (its ttl is up): the job succeeded, and its pods go."""
    status["completionTime"] = stamp
    status["conditions"] = with_condition(status, "Succeeded", "IPUJobExpired",
                                      f"IPUJob {job.key} ended: its interactive session of {job.interactive_ttl} s expired.", stamp)
    return Decision((), tuple(sorted(n for n in live if n in workers or n == job.launcher_name)), status)


def _cleanable(job: JobSpec, pods: dict[str, dict]) -> tuple[str, ...]:
    """The pods cleanPodPolicy removes from a job that is over (None: keep them all)."""
    doomed = []
    if job.clean_pod_policy in ("All", "Workers"):
        doomed += [n for n in pods if n.startswith(f"{job.name}-worker-")]
    if job.clean_pod_policy == "All" and job.launcher_name in pods:
        doomed.append(job.launcher_name)
    return tuple(sorted(n for n in doomed if not (pods[n].get("metadata") or {}).get("deletionTimestamp")))
