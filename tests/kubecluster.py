"""A real Kubernetes control plane on loopback, as controller-runtime's envtest runs one, plus nodes.

etcd, kube-apiserver (TLS, client certificates, RBAC, service account tokens) and kube-scheduler,
built from source by `scripts/k8s-binaries`, and kwok keeping the nodes it is given Ready. kwok runs
no containers and here drives no pods: `tests/kubelet.py` plays the kubelet for them. Asked for
(`workload_controllers`), kube-controller-manager runs the Deployment, ReplicaSet, garbage
collection and service account controllers, so that Deployments make their pods, deleted owners
take their own, and each namespace has its default service account.
Everything lives in one private directory; `kubeconfig` there is the cluster administrator's.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.ports import free_port
from tests.processes import dying_with_parent

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl", "kwok", "helm")
# With workload_controllers: Deployments, Jobs, the default service accounts, Services' endpoints
# (which the API server calls webhooks through, see --enable-aggregator-routing) and volume claims bound.
WORKLOAD_CONTROLLERS = ",".join((
    "deployment-controller", "replicaset-controller", "garbage-collector-controller", "serviceaccount-controller",
    "job-controller", "endpoints-controller", "endpointslice-controller", "persistentvolume-binder-controller"))
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"

# kwok's only work here: a node it manages becomes Ready, with room for many pods.
NODE_STAGES = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: 'NotIn'
      values: ['Running']
  next:
    statusTemplate: |
      phase: Running
      conditions:
      - type: Ready
        status: "True"
        reason: KubeletReady
        message: kwok keeps this node ready
        lastHeartbeatTime: {{ Now | Quote }}
        lastTransitionTime: {{ Now | Quote }}
      addresses:
      - type: InternalIP
        address: 127.0.0.1
      - type: Hostname
        address: {{ .metadata.name | Quote }}
      allocatable: {cpu: "64", memory: 256Gi, pods: "110"}
      capacity: {cpu: "64", memory: 256Gi, pods: "110"}
      nodeInfo:
        architecture: amd64
        operatingSystem: linux
        kubeletVersion: kwok
"""


def binaries() -> Path:
    """The cache directory holding the cluster's programs, built on first use."""
    done = subprocess.run([str(ROOT / "scripts" / "k8s-binaries")], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/k8s-binaries failed:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def _certificate(subject: x509.Name, key, issuer: x509.Name, issuer_key, *, ca: bool = False,
                 server_names: list[str] = (), client: bool = False) -> bytes:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server_names:
        names = []
        for name in server_names:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                names.append(x509.DNSName(name))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server_names else []) + ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    return builder.sign(issuer_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def _name(common_name: str, organisation: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organisation:
        attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organisation))
    return x509.Name(attributes)


class KubeCluster:
    def __init__(self, binaries_dir: Path | None = None, scheduler_extender: str | None = None, workload_controllers: bool = False):
        """`scheduler_extender`: the URL prefix of a kube-scheduler extender to configure (filter,
        prioritize); `workload_controllers`: run Deployments and ReplicaSets (kube-controller-manager)."""
        self.scheduler_extender = scheduler_extender
        self.workload_controllers = workload_controllers
        self.bin = binaries_dir or binaries()
        missing = [p for p in PROGRAMS if not (self.bin / p).exists()]
        if missing:
            raise RuntimeError(f"{', '.join(missing)} missing from {self.bin}; scripts/k8s-binaries builds them")
        self.directory = Path(tempfile.mkdtemp(prefix="vipu-kube-"))
        self.processes: dict[str, subprocess.Popen] = {}
        self.api_port = free_port()
        self.server = f"https://127.0.0.1:{self.api_port}"
        self.kubeconfig = self.directory / "kubeconfig"
        try:
            self._certificates()
            self._start()
        except BaseException:
            self.stop()
            raise

    # Certificates and the administrator's kubeconfig

    def _certificates(self) -> None:
        d = self.directory / "pki"
        d.mkdir()
        ca_key, ca_name = _key(), _name("vipu-test-kubernetes-ca")
        (d / "ca.key").write_bytes(_pem(ca_key))
        (d / "ca.crt").write_bytes(_certificate(ca_name, ca_key, ca_name, ca_key, ca=True))
        server_key = _key()
        (d / "apiserver.key").write_bytes(_pem(server_key))
        (d / "apiserver.crt").write_bytes(_certificate(
            _name("kube-apiserver"), server_key, ca_name, ca_key,
            server_names=["127.0.0.1", "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "10.0.0.1"]))
        admin_key = _key()
        (d / "admin.key").write_bytes(_pem(admin_key))
        (d / "admin.crt").write_bytes(_certificate(_name("admin", "system:masters"), admin_key, ca_name, ca_key, client=True))
        account_key = _key()
        (d / "sa.key").write_bytes(_pem(account_key))
        (d / "sa.pub").write_bytes(account_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        self.pki = d
        self.write_kubeconfig(self.kubeconfig, {"client-certificate": str(d / "admin.crt"), "client-key": str(d / "admin.key")})

    def write_kubeconfig(self, path: Path, user: dict) -> Path:
        """A kubeconfig for this cluster with the given user entry (certificate files, or a token)."""
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.server, "certificate-authority": str(self.pki / "ca.crt")}}],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user", "namespace": "default"}}],
        }))
        return path

    # Processes

    def _spawn(self, name: str, command: list[str]) -> None:
        with open(self.directory / f"{name}.log", "ab") as log:
            # KILL: a kube-apiserver told to stop waits for etcd, which may be gone already
            self.processes[name] = subprocess.Popen(dying_with_parent(command, "KILL"), stdout=log, stderr=subprocess.STDOUT,
                                                    cwd=self.directory)

    def log(self, name: str) -> str:
        path = self.directory / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def _wait(self, what: str, ready, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited with status {process.returncode}:\n{self.log(name)}")
            if ready():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} not ready after {timeout:.0f} s:\n{self.log(what)}")
            time.sleep(0.2)

    def _start(self) -> None:
        d, pki = self.directory, self.pki
        etcd_port, peer_port = free_port(), free_port()
        self._spawn("etcd", [
            str(self.bin / "etcd"), "--name", "test", "--data-dir", str(d / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{etcd_port}", "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", f"test=http://127.0.0.1:{peer_port}", "--unsafe-no-fsync", "--log-level", "warn",
        ])
        self._spawn("kube-apiserver", [
            str(self.bin / "kube-apiserver"), "--etcd-servers", f"http://127.0.0.1:{etcd_port}",
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", str(self.api_port),
            "--tls-cert-file", str(pki / "apiserver.crt"), "--tls-private-key-file", str(pki / "apiserver.key"),
            "--client-ca-file", str(pki / "ca.crt"), "--authorization-mode", "RBAC",
            "--service-account-issuer", "https://kubernetes.default.svc", "--service-account-key-file", str(pki / "sa.pub"),
            "--service-account-signing-key-file", str(pki / "sa.key"), "--service-cluster-ip-range", "10.0.0.0/24",
            "--allow-privileged=true", "--enable-priority-and-fairness=false", "--profiling=false",
            # Webhooks behind a Service are called at its endpoints (the pods' 127.0.0.1 and target
            # port), not at its cluster IP, which nothing here routes.
            "--enable-aggregator-routing=true",
            # New nodes would be tainted not-ready until kube-controller-manager, which this cluster does
            # not run, saw them Ready; kwok makes them Ready at once.
            "--disable-admission-plugins=TaintNodesByCondition",
            "--cert-dir", str(d / "apiserver-certs"),
        ])
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"{self.server}/readyz", context=context, timeout=2) as reply:
                    return reply.status == 200
            except OSError:
                return False

        self._wait("kube-apiserver", ready, timeout=90)
        scheduler = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
                     "clientConnection": {"kubeconfig": str(self.kubeconfig)}, "leaderElection": {"leaderElect": False}}
        if self.scheduler_extender:
            scheduler["extenders"] = [{"urlPrefix": self.scheduler_extender, "filterVerb": "filter", "prioritizeVerb": "prioritize",
                                       "weight": 1, "nodeCacheCapable": False, "ignorable": True}]
        (d / "scheduler.yaml").write_text(yaml.safe_dump(scheduler))
        self._spawn("kube-scheduler", [
            str(self.bin / "kube-scheduler"), "--config", str(d / "scheduler.yaml"),
            "--authentication-kubeconfig", str(self.kubeconfig), "--authorization-kubeconfig", str(self.kubeconfig),
            "--bind-address", "127.0.0.1", "--secure-port", str(free_port()),
        ])
        if self.workload_controllers:
            self._spawn("kube-controller-manager", [
                str(self.bin / "kube-controller-manager"), "--kubeconfig", str(self.kubeconfig),
                "--authentication-kubeconfig", str(self.kubeconfig), "--authorization-kubeconfig", str(self.kubeconfig),
                "--controllers", WORKLOAD_CONTROLLERS, "--leader-elect=false", "--bind-address", "127.0.0.1",
                "--secure-port", str(free_port()), "--cert-dir", str(d / "controller-manager-certs"),
            ])
        (d / "kwok.yaml").write_text(NODE_STAGES)
        self._spawn("kwok", [
            str(self.bin / "kwok"), "--kubeconfig", str(self.kubeconfig), "--config", str(d / "kwok.yaml"),
            "--manage-all-nodes=false", "--manage-nodes-with-annotation-selector", f"{KWOK_NODE_ANNOTATION}=fake",
            "--server-address", f"127.0.0.1:{free_port()}",
        ])
        self._wait("kubectl", lambda: self.kubectl("get", "namespace", "default", check=False).returncode == 0)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 3 s: the control plane is thrown away with its directory, and
        kube-apiserver's graceful shutdown would take a quarter of a minute for nothing."""
        for process in reversed(list(self.processes.values())):
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + 3
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)

    # Using it

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PATH": f"{self.bin}:{os.environ['PATH']}"}

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
        done = subprocess.run([str(self.bin / "kubectl"), *args], capture_output=True, text=True, env=self.env,
                              input=stdin, timeout=60)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def apply(self, document: dict | str) -> None:
        self.kubectl("apply", "-f", "-", stdin=document if isinstance(document, str) else yaml.safe_dump(document))

    def add_node(self, name: str, labels: dict[str, str] | None = None) -> None:
        """A node kwok keeps Ready."""
        self.apply({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "annotations": {KWOK_NODE_ANNOTATION: "fake"}, "labels": labels or {}}})
        self._wait("kwok", lambda: "True" in self.kubectl(
            "get", "node", name, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}", check=False).stdout)
