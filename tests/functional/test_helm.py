"""The Helm chart: it lints, its manifests pass the real API server's validation, each value does
what the seed's table says, and install, upgrade and uninstall work on a real control plane
(leaving the partition tracker behind)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.kubecluster import KubeCluster

pytestmark = pytest.mark.functional

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "gc-ipu-operator-helm-chart"
CRD = CHART.parents[1] / "crds" / "graphcore.ai_ipujobs.yaml"
IMAGE = ("--set", "controller.image.repository=registry.example/vipu")


@pytest.fixture(scope="module")
def kube():
    cluster = KubeCluster()
    cluster.kubectl("apply", "-f", str(CRD))
    cluster.kubectl("create", "namespace", "ipu")
    yield cluster
    cluster.stop()


def helm(kube: KubeCluster, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([str(kube.bin / "helm"), *args], capture_output=True, text=True, env=kube.env, timeout=120)
    if check and done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed: {done.stderr}")
    return done


def render(kube: KubeCluster, *values: str) -> dict[tuple[str, str], dict]:
    """The chart's manifests by (kind, name), for release `gc` in namespace `ipu`."""
    out = helm(kube, "template", "gc", str(CHART), "--namespace", "ipu", *IMAGE, *values).stdout
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out) if d}


def container(manifests: dict, deployment: str, name: str) -> dict:
    pod = manifests[("Deployment", deployment)]["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == name)


def test_the_chart_lints_and_its_manifests_pass_the_api_servers_validation(kube):
    assert helm(kube, "lint", str(CHART), *IMAGE).returncode == 0
    for values in ((), ("--set", "extendedScheduler.enabled=true", "--set", "admissionWebhooks.scope=ipu")):
        manifests = helm(kube, "template", "gc", str(CHART), "--namespace", "ipu", *IMAGE, *values).stdout
        done = kube.kubectl("apply", "--dry-run=server", "--namespace", "ipu", "-f", "-", stdin=manifests, check=False)
        assert done.returncode == 0, done.stderr


def test_the_chart_names_the_releases_images_and_things_as_the_seed_does(kube):
    manifests = yaml.safe_load_all(helm(kube, "template", "gc", str(CHART), "--namespace", "ipu").stdout)
    images = {c["image"] for d in manifests if d and d["kind"] in ("Deployment", "Job")
              for c in d["spec"]["template"]["spec"]["containers"]}
    assert images == {"localhost/vipu/gc-operator:v1.0.0", "localhost/vipu/gc-webhook:v1.0.0", "localhost/vipu/gc-proxy:v1.0.0"}
    refused = helm(kube, "template", "gc", str(CHART), "--set", "controller.image.repository=", check=False)
    assert refused.returncode != 0 and "controller.image.repository must name the operator's image" in refused.stderr
    names = {name for _, name in render(kube)}
    assert {"gc-ipu-operator-controller-manager", "gc-ipu-operator-vipu-proxy", "gc-ipu-operator-vipu-controllers",
            "gc-ipu-operator-metrics-reader", "mipujob.graphcore.ai", "vipujob.graphcore.ai"} <= names
    assert "ipu-partitions-tracker" not in names  # the proxy makes it, so that an uninstall leaves it
    assert ("Deployment", "x-controller-manager") in render(kube, "--set", "fullNameOverride=x")
    assert ("Deployment", "gc-other-controller-manager") in render(kube, "--set", "nameOverride=other")


def test_each_value_does_what_the_seeds_table_says(kube):
    defaults = render(kube)
    manager = container(defaults, "gc-ipu-operator-controller-manager", "manager")
    assert manager["image"] == "registry.example/vipu:v1.0.0" and manager["imagePullPolicy"] == "IfNotPresent"
    assert "--launcher-image=localhost/vipu/gc-launcher:v1.0.0" in manager["args"]
    operator_pod = defaults[("Deployment", "gc-ipu-operator-controller-manager")]["spec"]["template"]["spec"]
    assert (operator_pod["hostNetwork"], operator_pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert defaults[("ConfigMap", "gc-ipu-operator-vipu-controllers")]["data"]["vipuControllers"] == "example.com:8191"
    proxy = container(defaults, "gc-ipu-operator-vipu-proxy", "vipu-proxy")
    assert {"--port=8080", "--vipu-cluster=test"} <= set(proxy["args"]) and "--advertise-on-master" not in proxy["args"]
    assert (proxy["image"], proxy["imagePullPolicy"]) == ("localhost/vipu/gc-proxy:v1.0.0", "IfNotPresent")
    service = defaults[("Service", "gc-ipu-operator-vipu-proxy")]["spec"]
    assert (service["type"], service["ports"][0]["port"]) == ("ClusterIP", 80)
    hooks = defaults[("ValidatingWebhookConfiguration", "vipujob.graphcore.ai")]["webhooks"][0]
    assert (hooks["failurePolicy"], hooks["timeoutSeconds"], hooks["clientConfig"]["service"]["port"]) == ("Fail", 30, 443)
    assert "namespaceSelector" not in hooks and "caBundle" not in hooks["clientConfig"]  # the patch job's, kept by upgrades
    for job in ("create", "patch"):
        pod = defaults[("Job", f"gc-ipu-operator-webhook-certs-{job}")]["spec"]["template"]["spec"]
        assert pod["containers"][0]["image"] == "localhost/vipu/gc-webhook:v1.0.0"
        assert pod["containers"][0]["command"] == ["vipu-ipu-webhook-certs", job]
        assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 2000}
        assert not {"priorityClassName", "nodeSelector", "tolerations"} & set(pod)
    assert defaults[("Job", "gc-ipu-operator-webhook-certs-create")]["metadata"]["annotations"]["helm.sh/hook"] == \
        "pre-install,pre-upgrade"
    assert ("ConfigMap", "gc-ipu-operator-scheduler-extender") not in defaults

    preferred = "affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0]"
    changed = render(kube, "--set", "global.launcherImage=reg/launch:2", "--set", "global.imagePullSecrets[0].name=pull",
                     "--set", "controller.hostNetwork=false", "--set", "controller.image.tag=v9", "--set",
                     "controller.image.pullPolicy=Always", "--set", "controller.serviceAccount.name=ops",
                     "--set", "controller.serviceAccount.annotations.team=ipu", "--set", "vipuServerAddr=pod001",
                     "--set", "vipuServerPort=8090", "--set", "vipuClusterName=c64", "--set", "proxyPort=9000",
                     "--set", "ipuVisibility.advertiseOnMaster=true", "--set", "podAnnotations.scrape=yes",
                     "--set", "podSecurityPolicyContext.runAsNonRoot=false", "--set", "securityContext.readOnlyRootFilesystem=true",
                     "--set", "service.type=NodePort", "--set", "service.port=81", "--set", "resources.limits.cpu=1",
                     "--set", "nodeSelector.ipunode=node1", "--set", "tolerations[0].operator=Exists",
                     "--set", f"{preferred}.weight=1",
                     "--set", f"{preferred}.preference.matchExpressions[0].key=a",
                     "--set", f"{preferred}.preference.matchExpressions[0].operator=Exists",
                     "--set", "extendedScheduler.enabled=true", "--set", "admissionWebhooks.scope=team-a\\,team-b",
                     "--set", "admissionWebhooks.timeoutSeconds=5", "--set", "admissionWebhooks.failurePolicy=Ignore",
                     "--set", "admissionWebhooks.port=9443", "--set", "admissionWebhooks.service.servicePort=8444",
                     "--set", "admissionWebhooks.service.type=NodePort", "--set", "admissionWebhooks.service.annotations.a=b",
                     "--set", "admissionWebhooks.image.repository=reg/webhook", "--set", "admissionWebhooks.image.tag=w1",
                     "--set", "vipuProxy.image.repository=reg/proxy", "--set", "vipuProxy.image.tag=p1",
                     "--set", "vipuProxy.image.pullPolicy=Never", "--set", "admissionWebhooks.patch.image.repository=reg/certgen",
                     "--set", "admissionWebhooks.patch.image.tag=c1", "--set", "admissionWebhooks.patch.image.pullPolicy=Always",
                     "--set", "admissionWebhooks.patch.priorityClassName=low", "--set", "admissionWebhooks.patch.podAnnotations.p=q",
                     "--set", "admissionWebhooks.patch.nodeSelector.role=ops",
                     "--set", "admissionWebhooks.patch.tolerations[0].operator=Exists",
                     "--set", "admissionWebhooks.patch.runAsUser=3000")
    manager = container(changed, "gc-ipu-operator-controller-manager", "manager")
    assert manager["image"] == "registry.example/vipu:v9" and manager["imagePullPolicy"] == "Always"
    assert "--launcher-image=reg/launch:2" in manager["args"] and manager["resources"] == {"limits": {"cpu": 1}}
    operator_pod = changed[("Deployment", "gc-ipu-operator-controller-manager")]["spec"]["template"]
    assert (operator_pod["spec"]["hostNetwork"], operator_pod["spec"]["dnsPolicy"]) == (False, "ClusterFirst")
    assert operator_pod["metadata"]["annotations"] == {"scrape": "yes"}
    assert operator_pod["spec"]["serviceAccountName"] == "ops"
    assert changed[("ServiceAccount", "ops")]["metadata"]["annotations"] == {"team": "ipu"}
    for deployment in ("gc-ipu-operator-controller-manager", "gc-ipu-operator-vipu-proxy"):
        pod = changed[("Deployment", deployment)]["spec"]["template"]["spec"]
        assert pod["imagePullSecrets"] == [{"name": "pull"}] and pod["nodeSelector"] == {"ipunode": "node1"}
        assert pod["tolerations"] == [{"operator": "Exists"}] and pod["securityContext"] == {"runAsNonRoot": False}
        assert pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 1
    webhook = container(changed, "gc-ipu-operator-controller-manager", "webhook")
    assert webhook["image"] == "reg/webhook:w1" and "--port=9443" in webhook["args"]
    assert changed[("ConfigMap", "gc-ipu-operator-vipu-controllers")]["data"]["vipuControllers"] == "pod001:8090"
    proxy = container(changed, "gc-ipu-operator-vipu-proxy", "vipu-proxy")
    assert {"--port=9000", "--vipu-cluster=c64", "--advertise-on-master"} <= set(proxy["args"])
    assert (proxy["image"], proxy["imagePullPolicy"]) == ("reg/proxy:p1", "Never")  # the seed's vipuProxy.image.repository
    assert proxy["securityContext"] == {"readOnlyRootFilesystem": True}
    service = changed[("Service", "gc-ipu-operator-vipu-proxy")]["spec"]
    assert (service["type"], service["ports"][0]["port"]) == ("NodePort", 81)
    webhook_service = changed[("Service", "gc-ipu-operator-webhook")]
    assert webhook_service["spec"]["type"] == "NodePort" and webhook_service["metadata"]["annotations"] == {"a": "b"}
    assert webhook_service["spec"]["ports"][0] == {"name": "webhook", "port": 8444, "targetPort": 9443}
    for kind, name in (("MutatingWebhookConfiguration", "mipujob.graphcore.ai"),
                       ("ValidatingWebhookConfiguration", "vipujob.graphcore.ai")):
        hook = changed[(kind, name)]["webhooks"][0]
        assert (hook["failurePolicy"], hook["timeoutSeconds"]) == ("Ignore", 5)
        assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == ["team-a", "team-b"]
    for job in ("create", "patch"):
        template = changed[("Job", f"gc-ipu-operator-webhook-certs-{job}")]["spec"]["template"]
        pod = template["spec"]
        assert (pod["containers"][0]["image"], pod["containers"][0]["imagePullPolicy"]) == ("reg/certgen:c1", "Always")
        assert (pod["priorityClassName"], pod["nodeSelector"], pod["tolerations"]) == ("low", {"role": "ops"}, [{"operator": "Exists"}])
        assert pod["securityContext"]["runAsUser"] == 3000 and template["metadata"]["annotations"] == {"p": "q"}
        assert pod["imagePullSecrets"] == [{"name": "pull"}]
    extender = yaml.safe_load(changed[("ConfigMap", "gc-ipu-operator-scheduler-extender")]["data"]["scheduler-config.yaml"])
    assert extender["extenders"][0]["urlPrefix"] == "http://gc-ipu-operator-vipu-proxy.ipu.svc:81/scheduler"
    assert (extender["extenders"][0]["filterVerb"], extender["extenders"][0]["prioritizeVerb"]) == ("filter", "prioritize")

    several = render(kube, "--set", "vipuControllers=pod001:8090:ipunode=node1\\,pod002:8091:ipunode=node2")
    assert several[("ConfigMap", "gc-ipu-operator-vipu-controllers")]["data"]["vipuControllers"] == \
        "pod001:8090:ipunode=node1,pod002:8091:ipunode=node2"
    bare = render(kube, "--set", "controller.serviceAccount.create=false", "--set", "controller.rbac.create=false")
    assert not [key for key in bare if key[0] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
                and not key[1].endswith("-webhook-certs")]  # the patch jobs' own, which live only while they run
    assert bare[("Deployment", "gc-ipu-operator-vipu-proxy")]["spec"]["template"]["spec"]["serviceAccountName"] == "default"


def test_monitoring_makes_the_service_monitor_scrape_config_alert_rules_and_dashboards_that_ship(kube):
    assert not {kind for kind, _ in render(kube)} & {"ServiceMonitor", "ScrapeConfig", "PrometheusRule"}  # none by default
    manifests = render(kube, "--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.serviceMonitor.labels.release=kps",
                       "--set", "monitoring.prometheusRule.enabled=true", "--set", "monitoring.grafanaDashboards.enabled=true",
                       "--set", "monitoring.scrapeTargets.controllers={ctl1:8092}",
                       "--set", "monitoring.scrapeTargets.agents={m01:2112,m02:2112}")
    monitor = manifests[("ServiceMonitor", "gc-ipu-operator-vipu-proxy")]
    assert monitor["metadata"]["labels"]["release"] == "kps" and monitor["spec"]["endpoints"][0]["port"] == "http"
    proxy = manifests[("Service", "gc-ipu-operator-vipu-proxy")]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= proxy["metadata"]["labels"].items()  # it selects the proxy's Service
    scrape = manifests[("ScrapeConfig", "gc-ipu-operator-vipu-pod")]["spec"]["staticConfigs"]
    assert scrape == [{"labels": {"job": "vipu-controller"}, "targets": ["ctl1:8092"]},
                      {"labels": {"job": "vipu-agents"}, "targets": ["m01:2112", "m02:2112"]}]
    rules = manifests[("PrometheusRule", "gc-ipu-operator-vipu-alerts")]["spec"]
    assert rules == yaml.safe_load((CHART.parents[1] / "prometheus" / "vipu-alerts.yml").read_text())
    dashboards = manifests[("ConfigMap", "gc-ipu-operator-vipu-dashboards")]
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert {name: json.loads(text)["uid"] for name, text in dashboards["data"].items()} == {
        "vipu-links.json": "vipu-links", "vipu-machine.json": "vipu-machine", "vipu-partition.json": "vipu-partition",
        "vipu-pod.json": "vipu-pod", "vipu-queue.json": "vipu-queue"}


def test_a_value_the_chart_does_not_know_is_refused_by_its_schema(kube):
    typo = helm(kube, "install", "gc", str(CHART), "--namespace", "ipu", "--set", "vipuProxi.image.repository=x", check=False)
    assert typo.returncode != 0
    assert "values don't meet the specifications of the schema" in typo.stderr
    assert "additional properties 'vipuProxi' not allowed" in typo.stderr, typo.stderr
    wrong_type = helm(kube, "template", "gc", str(CHART), "--set", "proxyPort=http", check=False)
    assert wrong_type.returncode != 0 and "proxyPort" in wrong_type.stderr
    assert helm(kube, "ls", "-n", "ipu", "-q").stdout.strip() == ""  # nothing installed


def test_the_seeds_own_spellings_are_taken(kube):
    manifests = render(kube, "--set", "vipuCLusterName=c9", "--set", "controllers.serviceAccount.name=ops2")
    assert "--vipu-cluster=c9" in container(manifests, "gc-ipu-operator-vipu-proxy", "vipu-proxy")["args"]
    assert manifests[("Deployment", "gc-ipu-operator-vipu-proxy")]["spec"]["template"]["spec"]["serviceAccountName"] == "ops2"


def test_the_charts_readme_and_schema_are_what_its_values_make():
    done = subprocess.run([sys.executable, str(CHART.parents[2] / "scripts" / "release.py"), "chart-docs", "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    readme = (CHART / "README.md").read_text()
    for path in ("vipuProxy.image.repository", "admissionWebhooks.patch.runAsUser", "global.launcherImage"):
        assert f"| `{path}` |" in readme


def test_install_upgrade_and_uninstall_leave_the_partition_tracker(kube):
    # What the proxy makes when it first runs: not the chart's, so the uninstall keeps it
    kube.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ipu-partitions-tracker", "namespace": "ipu"},
                "data": {"p-default-job": json.dumps({"namespace": "default", "job": "job"})}})
    # No kubelet runs here to run the patch jobs (test_release runs them): the certificate is the site's
    no_patch = ("--set", "admissionWebhooks.patch.enabled=false")
    notes = helm(kube, "install", "gc", str(CHART), "--namespace", "ipu", *IMAGE, *no_patch,
                 "--set", "extendedScheduler.enabled=true").stdout
    assert "Restart the default scheduler with the configuration in" in notes
    assert kube.kubectl("get", "deployment", "gc-ipu-operator-controller-manager", "-n", "ipu").returncode == 0
    assert kube.kubectl("get", "clusterrole", "-l", "component=metrics-reader", "-o", "name").stdout.split() == [
        "clusterrole.rbac.authorization.k8s.io/gc-ipu-operator-metrics-reader"]
    helm(kube, "upgrade", "gc", str(CHART), "--namespace", "ipu", *IMAGE, *no_patch, "--set", "vipuControllers=pod001:8090:ipunode=node1")
    data = kube.kubectl("get", "configmap", "gc-ipu-operator-vipu-controllers", "-n", "ipu", "-o", "jsonpath={.data.vipuControllers}")
    assert data.stdout == "pod001:8090:ipunode=node1"
    assert '"deployed"' in helm(kube, "ls", "-n", "ipu", "-o", "json").stdout

    helm(kube, "uninstall", "gc", "--namespace", "ipu", "--wait")
    assert kube.kubectl("get", "deployment", "gc-ipu-operator-controller-manager", "-n", "ipu", check=False).returncode != 0
    assert kube.kubectl("get", "validatingwebhookconfiguration", "vipujob.graphcore.ai", check=False).returncode != 0
    assert kube.kubectl("get", "configmap", "ipu-partitions-tracker", "-n", "ipu").returncode == 0
