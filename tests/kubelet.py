"""A kubelet for the test cluster's kwok nodes: pods become local processes.

kwok keeps the nodes Ready but runs nothing. This plays the kubelet's part for every pod the real
kube-scheduler binds: it runs each init container's, then each container's command as a local
process with the environment the pod spec gives it, reports the pod's phase, conditions and
container states through the API server as a kubelet does, and when a pod is deleted it stops the
processes and completes the deletion.

A container's filesystem is this machine's, with two of a kubelet's duties done by hand: the
pod's ConfigMap, Secret and emptyDir volumes are written into a directory of the pod's (a volume
claim's is a directory of the claim's, shared by every pod that mounts it, as a ReadWriteMany
volume is), and the container's mount paths in its variables and arguments are translated to that
directory (a Secret's keys reach its variables too). Every pod has this machine's address
(127.0.0.1 unless told another of its addresses: an EndpointSlice refuses loopback ones, so a
Service that the API server calls, a webhook's, needs another), so cluster DNS and kube-proxy are
done the same way: a Service's name in a URL of a container's variables or arguments
(`http://NAME.NAMESPACE.svc:PORT`) becomes 127.0.0.1 and the Service's target port; a pod
with a service account gets a real token for it (TokenRequest) in a kubeconfig named by
KUBECONFIG, so its programs act with exactly the rights RBAC gives that account.

`kubectl exec` needs a kubelet's streaming server, which kwok's nodes lack: `kubectl_shim` stands
in for it on a container's PATH. It checks with the API server, as the container's service
account, that exec into the pod is allowed, then runs the command with the target container's
environment.
"""

from __future__ import annotations

import base64
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ProtocolError

from tests.kubecluster import KubeCluster

SHIM = """#!{python}
import sys
sys.path.insert(0, {root!r})
from tests.kubelet import kubectl_shim
sys.exit(kubectl_shim(sys.argv[1:]))
"""


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _translated(text: str, mounts: dict[str, Path]) -> str:
    """`text` (a path, or an option and a path: --tls-cert=/etc/...) with a mount path made the volume's directory."""
    option = re.match(r"(--[\w-]+=)(/.*)", text)
    if option:
        return option.group(1) + _translated(option.group(2), mounts)
    for mount_path, host_path in sorted(mounts.items(), key=lambda item: -len(item[0])):
        if text == mount_path or text.startswith(mount_path.rstrip("/") + "/"):
            return str(host_path) + text[len(mount_path.rstrip("/")):]
    return text


SERVICE_URL = re.compile(r"(?<=//)([a-z0-9-]+)\.([a-z0-9-]+)\.svc(?:\.cluster\.local)?(?::(\d+))?")


def container_environment(pod: dict, container: dict, mounts: dict[str, Path], base: dict[str, str],
                          secret: Callable[[str, str], str] | None = None,
                          services: Callable[[str], str] = lambda text: text, pod_ip: str = "127.0.0.1") -> dict[str, str]:
    """The variables a container of this pod sees: `base`, then its spec's, fields resolved, keys of
    Secrets read through `secret(name, key)`, and Services' URLs through `services`."""
    fields = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": pod["metadata"]["namespace"],
              "spec.nodeName": pod["spec"].get("nodeName", ""),
              "status.podIP": pod_ip, "status.hostIP": pod_ip}
    env = dict(base)
    for variable in container.get("env") or []:
        source = variable.get("valueFrom") or {}
        if "value" in variable:
            env[variable["name"]] = services(_translated(str(variable["value"]), mounts))
        elif (source.get("fieldRef") or {}).get("fieldPath") in fields:
            env[variable["name"]] = fields[source["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in source and secret is not None:
            env[variable["name"]] = secret(source["secretKeyRef"]["name"], source["secretKeyRef"]["key"])
    return env


class Kubelet:
    def __init__(self, cluster: KubeCluster, root: Path, path: list[str], pod_ip: str = "127.0.0.1"):
        """`path`: directories put before the machine's PATH in every container; `pod_ip`: an address
        of this machine, every pod's."""
        self.cluster = cluster
        self.pod_ip = pod_ip
        self.root = root
        self.core = client.CoreV1Api(config.new_client_from_config(str(cluster.kubeconfig)))
        shims = root / "shims"
        shims.mkdir(parents=True, exist_ok=True)
        (shims / "kubectl").write_text(SHIM.format(python=sys.executable, root=str(Path(__file__).resolve().parent.parent)))
        (shims / "kubectl").chmod(0o755)
        self.path = ":".join([str(shims), *path, os.environ["PATH"]])
        self.started: dict[str, threading.Thread] = {}  # by pod uid
        self.processes: dict[str, list[subprocess.Popen]] = {}
        self.deleting: set[str] = set()  # pods (by uid) being deleted: their threads report nothing more
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="kubelet", daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        """Kill every pod's processes, and let each pod's thread report its end while the API server still runs."""
        self._stop.set()
        with self._lock:
            for processes in self.processes.values():
                for process in processes:
                    if process.poll() is None:
                        process.kill()
                        process.wait()
            threads = list(self.started.values())
        deadline = time.monotonic() + 10
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def pod_dir(self, namespace: str, name: str) -> Path:
        return self.root / "pods" / namespace / name

    def logs(self, namespace: str, name: str, container: str) -> str:
        """What a container printed, as `kubectl logs` would show it."""
        path = self.pod_dir(namespace, name) / f"{container}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # Watching

    def _watch(self) -> None:
        version = None
        while not self._stop.is_set():
            try:
                if version is None:
                    listed = self.core.list_pod_for_all_namespaces()
                    version = listed.metadata.resource_version
                    for pod in listed.items:
                        self._seen(self.core.api_client.sanitize_for_serialization(pod))
                for event in watch.Watch().stream(self.core.list_pod_for_all_namespaces, resource_version=version,
                                                  timeout_seconds=5, _request_timeout=10):
                    pod = self.core.api_client.sanitize_for_serialization(event["object"])
                    version = pod["metadata"]["resourceVersion"]
                    if event["type"] != "DELETED":
                        self._seen(pod)
                    if self._stop.is_set():
                        return
            except ApiException as error:
                if error.status == 410:  # our resource version is too old: list again
                    version = None
                elif not self._stop.is_set():
                    time.sleep(0.2)
            except Exception:  # noqa: BLE001 - the API server went away (end of the session): try again until stopped
                if not self._stop.is_set():
                    time.sleep(0.2)

    def _seen(self, pod: dict) -> None:
        key = pod["metadata"]["uid"]  # not the name: a launcher restarted is a new pod of the same name
        if not pod["spec"].get("nodeName"):
            return
        with self._lock:
            if pod["metadata"].get("deletionTimestamp"):
                if key not in self.deleting:
                    self.deleting.add(key)
                    threading.Thread(target=self._delete, args=(pod, key), daemon=True).start()
                return
            if key in self.started or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                return
            thread = threading.Thread(target=self._run, args=(pod, key), name=f"pod {pod['metadata']['name']}", daemon=True)
            self.started[key] = thread
            self.processes[key] = []
        thread.start()

    # Running a pod

    def _patch_status(self, pod: dict, status: dict) -> None:
        for attempt in range(3):
            try:
                self.core.patch_namespaced_pod_status(pod["metadata"]["name"], pod["metadata"]["namespace"], {"status": status})
                return
            except ApiException as error:
                if error.status not in (404, 409):
                    raise
                return
            except ProtocolError:  # the API server closed a kept-alive connection as it was reused; urllib3 resends no PATCH
                if attempt == 2:
                    raise

    def _prepare(self, pod: dict) -> tuple[dict[str, Path], dict[str, str]]:
        """Volumes written out, and the pod's base environment (PATH, HOME, its service account)."""
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        directory = self.pod_dir(namespace, name)
        volumes: dict[str, Path] = {}
        for volume in pod["spec"].get("volumes") or []:
            target = directory / "volumes" / volume["name"]
            target.mkdir(parents=True, exist_ok=True)
            if "configMap" in volume:
                source = self.core.read_namespaced_config_map(volume["configMap"]["name"], namespace)
                _write_volume(target, volume["configMap"], {key: value.encode() for key, value in (source.data or {}).items()})
            elif "persistentVolumeClaim" in volume:
                target = self.root / "claims" / namespace / volume["persistentVolumeClaim"]["claimName"]
                target.mkdir(parents=True, exist_ok=True)
            elif "secret" in volume:
                secret = self.core.read_namespaced_secret(volume["secret"]["secretName"], namespace)
                _write_volume(target, volume["secret"], {key: base64.b64decode(value) for key, value in (secret.data or {}).items()})
            volumes[volume["name"]] = target
        base = {"PATH": self.path, "HOME": str(directory), "HOSTNAME": name}
        account = pod["spec"].get("serviceAccountName")
        if account and pod["spec"].get("automountServiceAccountToken", True):
            token = self.core.create_namespaced_service_account_token(account, namespace, client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(audiences=["https://kubernetes.default.svc"], expiration_seconds=3600,
                                               bound_object_ref=client.V1BoundObjectReference(
                                                   kind="Pod", api_version="v1", name=name, uid=pod["metadata"]["uid"]))))
            kubeconfig = self.cluster.write_kubeconfig(directory / "serviceaccount.kubeconfig", {"token": token.status.token})
            base["KUBECONFIG"] = str(kubeconfig)
        return volumes, base

    def _services_reached(self, text: str) -> str:
        """`text` with each Service URL's host and port made the address its pods answer at."""
        return SERVICE_URL.sub(lambda match: self._service_address(match.group(1), match.group(2), match.group(3)), text)

    def _service_address(self, name: str, namespace: str, port: str | None) -> str:
        service = self.core.read_namespaced_service(name, namespace)
        wanted = int(port) if port else 80
        entry = next((p for p in service.spec.ports if p.port == wanted), service.spec.ports[0])
        target = entry.target_port or entry.port
        if isinstance(target, str):  # a container port's name: look it up in a pod the Service selects (soon made)
            selector = ",".join(f"{key}={value}" for key, value in (service.spec.selector or {}).items())
            deadline = time.monotonic() + 60
            while True:
                pods = self.core.list_namespaced_pod(namespace, label_selector=selector).items
                named = [p.container_port for pod in pods for c in pod.spec.containers for p in c.ports or [] if p.name == target]
                if named:
                    return f"127.0.0.1:{named[0]}"
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no pod of Service {namespace}/{name} has a port named {target}")
                time.sleep(0.2)
        return f"127.0.0.1:{target}"

    def _secret_value(self, namespace: str, name: str, key: str) -> str:
        return base64.b64decode(self.core.read_namespaced_secret(name, namespace).data[key]).decode()

    def _start(self, pod: dict, key: str, container: dict, volumes: dict[str, Path], base: dict[str, str]) -> subprocess.Popen:
        mounts = {m["mountPath"]: volumes[m["name"]] for m in container.get("volumeMounts") or [] if m["name"] in volumes}
        namespace = pod["metadata"]["namespace"]
        env = container_environment(pod, container, mounts, base, lambda name, key: self._secret_value(namespace, name, key),
                                    self._services_reached, self.pod_ip)
        command = [self._services_reached(_translated(str(part), mounts))
                   for part in (container.get("command") or []) + (container.get("args") or [])]
        directory = self.pod_dir(pod["metadata"]["namespace"], pod["metadata"]["name"])
        with open(directory / f"{container['name']}.log", "ab") as log:
            try:
                process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=directory,
                                           start_new_session=True)
            except OSError as error:  # as a runtime reports a command it cannot start: exit status 128
                log.write(f"cannot start {command}: {error}\n".encode())
                process = subprocess.Popen(["sh", "-c", "exit 128"])
        with self._lock:
            if key in self.deleting:  # deleted while starting: it must not outlive its pod
                process.kill()
            self.processes.setdefault(key, []).append(process)
        return process

    def _run(self, pod: dict, key: str) -> None:
        try:
            self._run_pod(pod, key)
        except Exception as error:  # the test reads this file when a pod does not get on
            with open(self.pod_dir(pod["metadata"]["namespace"], pod["metadata"]["name"]) / "kubelet.log", "a") as log:
                log.write(f"the test kubelet failed to run the pod: {error!r}\n")
            if not self._stop.is_set():  # once stopping, the cluster may be gone before a pod's last report
                raise

    def _run_pod(self, pod: dict, key: str) -> None:
        started = _now()
        ready = {"type": "PodScheduled", "status": "True", "lastTransitionTime": started}
        self._patch_status(pod, {"phase": "Pending", "hostIP": self.pod_ip, "podIP": self.pod_ip, "startTime": started,
                                 "conditions": [ready]})
        try:
            volumes, base = self._prepare(pod)
        except ApiException as error:  # a missing ConfigMap: the kubelet retries; here the pod fails
            self._patch_status(pod, {"phase": "Failed", "message": f"cannot prepare the pod: {error.reason}"})
            return
        done: list[dict] = []
        for container in pod["spec"].get("initContainers") or []:
            state = {"name": container["name"], "image": container.get("image", ""), "imageID": "", "ready": False,
                     "restartCount": 0, "state": {"running": {"startedAt": _now()}}}
            self._patch_status(pod, {"initContainerStatuses": [*done, state]})
            process = self._start(pod, key, container, volumes, base)
            code = process.wait()
            if key in self.deleting:
                return
            done.append({**state, "ready": code == 0, "state": {"terminated": {
                "exitCode": code, "reason": "Completed" if code == 0 else "Error", "startedAt": state["state"]["running"]["startedAt"],
                "finishedAt": _now()}}})
            if code != 0:
                self._patch_status(pod, {"phase": "Failed", "initContainerStatuses": done})
                return
        containers = pod["spec"]["containers"]
        processes = [self._start(pod, key, c, volumes, base) for c in containers]
        running_since = _now()
        statuses = [{"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": True, "restartCount": 0,
                     "started": True, "state": {"running": {"startedAt": running_since}}} for c in containers]
        conditions = [ready] + [{"type": kind, "status": "True", "lastTransitionTime": running_since}
                                for kind in ("Initialized", "ContainersReady", "Ready")]
        self._patch_status(pod, {"phase": "Running", "conditions": conditions, "initContainerStatuses": done,
                                 "containerStatuses": statuses})
        codes = [process.wait() for process in processes]
        if key in self.deleting:
            return
        finished = _now()
        statuses = [{**s, "ready": False, "started": False, "state": {"terminated": {
            "exitCode": code, "reason": "Completed" if code == 0 else "Error", "startedAt": running_since, "finishedAt": finished}}}
            for s, code in zip(statuses, codes, strict=True)]
        conditions = [ready] + [{"type": kind, "status": "False", "lastTransitionTime": finished, "reason": "PodCompleted"}
                                for kind in ("ContainersReady", "Ready")]
        self._patch_status(pod, {"phase": "Succeeded" if not any(codes) else "Failed", "conditions": conditions,
                                 "containerStatuses": statuses})

    def _delete(self, pod: dict, key: str) -> None:
        with self._lock:
            processes = list(self.processes.get(key, ()))
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + min(5, pod["spec"].get("terminationGracePeriodSeconds", 30))
        for process in processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        try:
            self.core.delete_namespaced_pod(pod["metadata"]["name"], pod["metadata"]["namespace"], body=client.V1DeleteOptions(
                grace_period_seconds=0, preconditions=client.V1Preconditions(uid=pod["metadata"]["uid"])))
        except ApiException as error:
            if error.status not in (404, 409):
                raise
        with self._lock:
            self.processes.pop(key, None)


def _write_volume(target: Path, source: dict, data: dict[str, bytes]) -> None:
    """A ConfigMap's or Secret's keys as files: each key, or the paths its `items` give them."""
    mode = source.get("defaultMode", 0o644)
    items = source.get("items") or [{"key": key, "path": key} for key in data]
    for item in items:
        path = target / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data[item["key"]])
        path.chmod(item.get("mode", mode))


def kubectl_shim(args: list[str]) -> int:
    """`kubectl exec [--namespace NS] POD -- COMMAND...` run where the pod's processes run."""
    if not args or args[0] != "exec" or "--" not in args:
        print(f"kubectl (test kubelet): only 'exec POD -- COMMAND' is served here, not {' '.join(args)}", file=sys.stderr)
        return 1
    options, command = args[1:args.index("--")], args[args.index("--") + 1:]
    namespace, positional = "default", []
    iterator = iter(options)
    for option in iterator:
        if option in ("-n", "--namespace"):
            namespace = next(iterator)
        elif option.startswith("--namespace="):
            namespace = option.split("=", 1)[1]
        elif not option.startswith("-"):
            positional.append(option)
    api = config.new_client_from_config(os.environ["KUBECONFIG"])
    review = client.AuthorizationV1Api(api).create_self_subject_access_review(client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=client.V1ResourceAttributes(
            namespace=namespace, verb="create", resource="pods", subresource="exec", name=positional[0]))))
    if not review.status.allowed:
        print(f'Error from server (Forbidden): pods "{positional[0]}" is forbidden: cannot create pods/exec', file=sys.stderr)
        return 1
    pod = api.sanitize_for_serialization(client.CoreV1Api(api).read_namespaced_pod(positional[0], namespace))
    container = pod["spec"]["containers"][0]
    env = container_environment(pod, container, {}, {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/")})
    return subprocess.run(command, env=env).returncode

