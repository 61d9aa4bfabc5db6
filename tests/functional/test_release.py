"""The Kubernetes release as a site receives it (seed 001, section 6.2).

`scripts/release` makes the tarball here, images built from Debian's archive included. Its
checksums hold; each image runs from its unpacked root as its own non-root user (this machine
cannot run containers: podman's runtimes may not set a container's resource limits here); the
packaged chart installs with the seed's own command line on a real API server, where its patch
jobs make the webhooks' certificate; and the seed's three sample IPUJobs, applied as written,
each take a partition of a simulated pod. The cluster's pods run as local processes
(`tests/kubelet.py`), so this proves the chart and the programs, the images above.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import tarfile
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

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = Path(__file__).resolve().parent / "seed001"
VERSION = "1.0.0-alpha-5"
NAME = f"gc-ipu-operator-v{VERSION}"
TAG = f"v{VERSION}"
IMAGES = {"gc-operator": "vipu-ipu-operator", "gc-webhook": "vipu-ipu-webhook", "gc-proxy": "vipu-ipu-proxy",
          "gc-launcher": "vipu-ipujob-init", "controller": "vipu-server", "agent": "vipu-agent"}
VIPU_USER = "10001:10001"

pytestmark = [pytest.mark.functional,
              pytest.mark.skipif(os.geteuid() != 0, reason="the images are built as root (mmdebstrap and umoci keep owners)")]


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    """The release directory, unpacked from the tarball scripts/release wrote."""
    out = tmp_path_factory.mktemp("release")
    done = subprocess.run([str(ROOT / "scripts" / "release"), VERSION, "--output", str(out / "built")],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    tarball = Path(done.stdout.strip().splitlines()[-1])
    assert tarball == out / "built" / f"{NAME}.tar.gz"
    with tarfile.open(tarball) as archive:
        archive.extractall(out / "unpacked", filter="data")
    return out / "unpacked" / NAME


@pytest.fixture(scope="module")
def kube():
    cluster = KubeCluster(workload_controllers=True)
    cluster.add_node("ipu-head-1")
    yield cluster
    cluster.stop()


def helm(kube: KubeCluster, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([str(kube.bin / "helm"), *args], capture_output=True, text=True, env=kube.env, timeout=400)
    assert done.returncode == 0, f"helm {' '.join(args)}: {done.stderr}"
    return done


def test_the_release_has_the_seeds_layout_and_its_checksums_hold(release, kube):
    files = {str(path.relative_to(release)) for path in release.rglob("*") if path.is_file()}
    assert files == {"CRDs/graphcore.ai_ipujobs.yaml", "docs/ipujob-crd-reference.md", "docs/operator-guide.md",
                     "docs/helm-chart-values.md", f"gc-ipu-operator-helm-chart-{TAG}.tgz", "gc-operator-images.tar.gz",
                     "gc-operator.cksm", "gc-ipu-operator-helm-chart.cksm"}
    checked = subprocess.run(["sha256sum", "--check", "--strict", "gc-operator.cksm", "gc-ipu-operator-helm-chart.cksm"],
                             cwd=release, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert sorted(checked.stdout.split("\n")[:-1]) == sorted(
        ["CRDs/graphcore.ai_ipujobs.yaml: OK", "gc-operator-images.tar.gz: OK", f"gc-ipu-operator-helm-chart-{TAG}.tgz: OK"])
    chart = yaml.safe_load(helm(kube, "show", "chart", str(release / f"gc-ipu-operator-helm-chart-{TAG}.tgz")).stdout)
    assert (chart["name"], chart["version"], chart["appVersion"]) == ("gc-ipu-operator-helm-chart", TAG, TAG)
    reference = (release / "docs" / "ipujob-crd-reference.md").read_text()
    for field in ("spec.restartPolicy.type", "spec.restartPolicy.backOffLimit", "spec.cleanPodPolicy", "status.iPUPartitionCreated"):
        assert f"| `{field}` |" in reference
    assert (release / "docs" / "operator-guide.md").read_text().startswith("## Kubernetes\n")


def _blob(layout: Path, digest: str) -> dict:
    return json.loads((layout / "blobs" / "sha256" / digest.removeprefix("sha256:")).read_text())


def _portable_kubeconfig(kube: KubeCluster, path: Path) -> None:
    """The cluster's kubeconfig with its files' contents inside it, for a program in another root."""
    config = yaml.safe_load(kube.kubeconfig.read_text())
    for section, entries in (("cluster", config["clusters"]), ("user", config["users"])):
        for entry in entries:
            for key in [k for k in entry[section] if k in ("certificate-authority", "client-certificate", "client-key")]:
                entry[section][f"{key}-data"] = base64.b64encode(Path(entry[section].pop(key)).read_bytes()).decode()
    path.write_text(yaml.safe_dump(config))
    os.chown(path, 10001, 10001)


def test_each_image_runs_from_its_unpacked_root_as_its_own_user(release, kube, tmp_path):
    layout = tmp_path / "layout"
    with tarfile.open(release / "gc-operator-images.tar.gz") as archive:
        archive.extractall(layout, filter="data")
    manifests = {m["annotations"]["org.opencontainers.image.ref.name"]: _blob(layout, m["digest"])
                 for m in json.loads((layout / "index.json").read_text())["manifests"]}
    assert set(manifests) == {f"localhost/vipu/{name}:{TAG}" for name in IMAGES}
    layers = {tuple(layer["digest"] for layer in manifest["layers"]) for manifest in manifests.values()}
    assert len(layers) == 1  # one root for all: each image is its entry point

    bundle = tmp_path / "bundle"
    unpacked = subprocess.run(["umoci", "unpack", "--image", f"{layout}:localhost/vipu/gc-operator:{TAG}", str(bundle)],
                              capture_output=True, text=True, timeout=300)
    assert unpacked.returncode == 0, unpacked.stderr
    rootfs = bundle / "rootfs"
    assert "vipu:x:10001:10001:" in (rootfs / "etc" / "passwd").read_text()

    def command(image: str, *args: str) -> list[str]:
        config = _blob(layout, manifests[f"localhost/vipu/{image}:{TAG}"]["config"]["digest"])["config"]
        assert config["User"] == VIPU_USER
        return ["chroot", f"--userspec={VIPU_USER}", str(rootfs), "/usr/bin/env", "-i", f"--chdir={config['WorkingDir']}",
                *config["Env"], *config["Entrypoint"], *(args or config["Cmd"])]

    for image, program in IMAGES.items():
        ran = subprocess.run(command(image), capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0 and "Usage: " in ran.stdout, f"{image}: {ran.stdout}{ran.stderr}"
        assert program in ran.stdout
    who = subprocess.run(["chroot", f"--userspec={VIPU_USER}", str(rootfs), "/usr/bin/id", "-un"], capture_output=True, text=True)
    assert who.stdout.strip() == "vipu"

    _portable_kubeconfig(kube, rootfs / "home" / "vipu" / "kubeconfig")
    port = free_port()
    proxy_command = command("gc-proxy", "--listen-address", "127.0.0.1", "--port", str(port), "--namespace", "default")
    env_at = proxy_command.index("-i") + 2
    proxy_command.insert(env_at, "KUBECONFIG=/home/vipu/kubeconfig")
    with open(tmp_path / "proxy.log", "wb") as log:
        proxy = subprocess.Popen(dying_with_parent(proxy_command), stdout=log, stderr=subprocess.STDOUT)
    try:
        def healthy():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
                    return json.loads(reply.read())
            except OSError:
                assert proxy.poll() is None, (tmp_path / "proxy.log").read_text()
                return None
        assert wait_until(healthy, timeout=60, what="the proxy image's health end-point") == {"status": "ok"}
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)


def _non_loopback_address() -> str:
    """An IPv4 address of this machine's that is not loopback (the pods', see Kubelet)."""
    found = [a for a in subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split() if "." in a]
    if not found:
        pytest.skip("this machine has no address but loopback, which Services' endpoints may not have")
    return found[0]


def _subset(wanted, stored) -> bool:
    """True when every field of `wanted` is in `stored` with the same value: nothing was pruned."""
    if isinstance(wanted, dict):
        return isinstance(stored, dict) and all(key in stored and _subset(value, stored[key]) for key, value in wanted.items())
    if isinstance(wanted, list):
        return isinstance(stored, list) and len(wanted) == len(stored) and all(map(_subset, wanted, stored))
    return wanted == stored


def test_the_packaged_chart_installs_as_the_seed_says_and_the_seeds_samples_each_take_a_partition(release, kube, tmp_path):
    vipu = Pod(tmp_path / "vipu", machines=2).start().register()
    kubelet = Kubelet(kube, tmp_path / "kubelet", path=[str(BIN)], pod_ip=_non_loopback_address())
    api = vipuuser_pb2_grpc.UserServiceStub(vipu._channel(vipu.user_port))

    def partitions() -> dict[str, int]:
        return {p.id: len(p.spec.ipus) for p in api.ListPartitions(vipuuser_pb2.ListPartitionsRequest()).partitions}

    try:
        kube.kubectl("apply", "-f", str(release / "CRDs" / "graphcore.ai_ipujobs.yaml"))
        kube.kubectl("wait", "--for=condition=Established", "crd/ipujobs.graphcore.ai", "--timeout=60s")
        # The seed's command line (its vipuCLusterName spelling too), with this release's images
        helm(kube, "install", "gc", str(release / f"gc-ipu-operator-helm-chart-{TAG}.tgz"),
             "--set", "vipuServerAddr=127.0.0.1", "--set", f"vipuServerPort={vipu.user_port}", "--set", "vipuCLusterName=cl0",
             "--set", "controller.image.repository=localhost/vipu/gc-operator",
             "--set", "vipuProxy.image.repository=localhost/vipu/gc-proxy")
        secret = json.loads(kube.kubectl("get", "secret", "gc-ipu-operator-webhook-tls", "-o", "json").stdout)
        for kind, name in (("mutatingwebhookconfiguration", "mipujob.graphcore.ai"),
                           ("validatingwebhookconfiguration", "vipujob.graphcore.ai")):
            hook = json.loads(kube.kubectl("get", kind, name, "-o", "json").stdout)["webhooks"][0]
            assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]  # the patch job's work
            assert hook["rules"][0]["resources"] == ["ipujobs"]  # and only that
        assert kube.kubectl("get", "jobs", "-o", "name").stdout == ""  # both patch jobs succeeded and were removed
        helm(kube, "upgrade", "gc", str(release / f"gc-ipu-operator-helm-chart-{TAG}.tgz"), "--reuse-values")
        for kind, name in (("mutatingwebhookconfiguration", "mipujob.graphcore.ai"),
                           ("validatingwebhookconfiguration", "vipujob.graphcore.ai")):  # an upgrade keeps the authority
            bundle = kube.kubectl("get", kind, name, "-o", "jsonpath={.webhooks[0].clientConfig.caBundle}").stdout
            assert bundle == secret["data"]["ca.crt"], kind
        kube.kubectl("wait", "--for=condition=Available", "deployment", "--all", "--timeout=120s")
        wait_until(lambda: kube.kubectl("apply", "--dry-run=server", "-f", str(SAMPLES / "single-gcd-sample.yaml"),
                                        check=False).returncode == 0, timeout=60, what="the webhooks to answer")

        # 4 of the pod's 8 IPUs each; the single-GCD job and its NFS twin share a name, so one at a time
        single = yaml.safe_load((SAMPLES / "single-gcd-sample.yaml").read_text())
        kube.kubectl("apply", "-f", str(SAMPLES / "single-gcd-sample.yaml"))
        kube.kubectl("apply", "-f", str(SAMPLES / "interactive-job.yaml"))
        wait_until(lambda: partitions() == {"p-default-ipujob-sample": 4, "p-default-interactive-sample-job": 4}, timeout=120,
                   what="the two samples' partitions")
        stored = json.loads(kube.kubectl("get", "ipujob", "ipujob-sample", "-o", "json").stdout)
        assert _subset(single["spec"], stored["spec"]), stored["spec"]  # nothing of the seed's pruned
        interactive = yaml.safe_load((SAMPLES / "interactive-job.yaml").read_text())
        stored = json.loads(kube.kubectl("get", "ipujob", "interactive-sample-job", "-o", "json").stdout)
        assert _subset(interactive["spec"], stored["spec"]), stored["spec"]
        assert stored["spec"]["restartPolicy"] == {"type": "Never", "backOffLimit": 3}
        wait_until(lambda: (json.loads(kube.kubectl("get", "ipujob", "ipujob-sample", "-o", "json").stdout)
                            .get("status") or {}).get("iPUPartitionCreated"), timeout=60, what="the seed's status field")
        kube.kubectl("delete", "-f", str(SAMPLES / "single-gcd-sample.yaml"), "--wait")
        wait_until(lambda: "p-default-ipujob-sample" not in partitions(), timeout=60, what="the partition's release")

        kube.kubectl("apply", "-f", str(SAMPLES / "single-gcd-sample-nfs.yaml"))
        nfs_job = [d for d in yaml.safe_load_all((SAMPLES / "single-gcd-sample-nfs.yaml").read_text()) if d and d["kind"] == "IPUJob"]
        assert _subset(nfs_job[0]["spec"], json.loads(kube.kubectl("get", "ipujob", "ipujob-sample", "-o", "json").stdout)["spec"])
        # As written the claim (storageClassName "") never binds to the volume (class "slow"), on any
        # cluster: the site gives its volume the claim's class, as it must for its own NFS server
        wait_until(lambda: "FailedBinding" in kube.kubectl("get", "events", "--field-selector", "involvedObject.name=nfs-pvc",
                                                           "-o", "jsonpath={.items[*].reason}").stdout,
                   timeout=60, what="Kubernetes' refusal to bind the claim as written")
        kube.kubectl("patch", "pv", "nfs-shared-storage", "--type=merge", "-p", '{"spec": {"storageClassName": ""}}')
        wait_until(lambda: kube.kubectl("get", "pvc", "nfs-pvc", "-o", "jsonpath={.status.phase}").stdout == "Bound",
                   timeout=60, what="the claim to bind")
        wait_until(lambda: partitions().get("p-default-ipujob-sample") == 4, timeout=120, what="the NFS sample's partition")
        assert (tmp_path / "kubelet" / "claims" / "default" / "nfs-pvc").is_dir()  # mounted in its launcher and worker
    except AssertionError as failure:  # with what the chart's pods said
        said = "".join(f"\n--- {path.relative_to(kubelet.root)}\n{path.read_text(errors='replace')[-1500:]}"
                       for path in sorted((kubelet.root / "pods").rglob("*.log")))
        raise AssertionError(f"{failure}{said}") from None
    finally:
        kubelet.stop()
        vipu.stop()
