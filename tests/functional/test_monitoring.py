"""What an operator watches, proven on real parts: Debian's Prometheus scraping a simulated pod (the
per-IPU series with their labels, utilisation following `vipu-ipuof run`, every query of the
shipped Grafana dashboards answered), `promtool` on the shipped alert rules, the dashboards as
Grafana's schema builds them, Chromium drawing Prometheus' graph of the pod's IPUs, and the
machines' logs as `vipu-admin logs agent` follows them, a flood kept bounded."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.browser import chromium
from tests.functional.harness import BIN, Pod, wait_until
from tests.functional.test_ipuof import ipuof
from tests.ports import free_port
from tests.processes import dying_with_parent
from vipu.backends.sim.machinelog import ROTATE_BYTES, machine_log_path
from vipu.backends.sim.rack import save_rack
from vipu.client.user import UserClient
from vipu.ipuof import files as ipuof_files
from vipu.store.machinelogs import KEPT_MACHINE_LOG_LINES

pytestmark = pytest.mark.functional

REPOSITORY = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = REPOSITORY / "deploy" / "prometheus"
GRAFANA_DIR = REPOSITORY / "deploy" / "grafana"
MACHINES = 2


@pytest.fixture(scope="module")
def watched_pod(tmp_path_factory):
    directory = tmp_path_factory.mktemp("watched")
    pod = Pod(directory, machines=MACHINES)
    for machine in pod.rack.machines:
        machine.exporter_port = free_port()
    save_rack(pod.rack, pod.rack_path)
    pod.start()
    pod.register()
    yield pod
    pod.stop()


class Prometheus:
    """Debian's prometheus on loopback, scraping every second; `query` its HTTP API."""

    def __init__(self, directory: Path, controller: int, agents: list[int]):
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(PROMETHEUS_DIR / "vipu-alerts.yml")],
            "scrape_configs": [
                {"job_name": "vipu-controller", "static_configs": [{"targets": [f"127.0.0.1:{controller}"]}]},
                {"job_name": "vipu-agents", "static_configs": [{"targets": [f"127.0.0.1:{port}" for port in agents]}]},
            ],
        }
        (directory / "prometheus.yml").write_text(json.dumps(config))  # YAML is a superset of JSON
        self.log = directory / "prometheus.log"
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(dying_with_parent([
                "/usr/bin/prometheus", f"--config.file={directory / 'prometheus.yml'}", f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle"]), stdout=log, stderr=subprocess.STDOUT)
        wait_until(self._ready, timeout=60, what="prometheus")

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"prometheus exited:\n{self.log.read_text()[-3000:]}")
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2).status == 200
        except OSError:
            return False

    def query(self, expr: str) -> list[dict]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        with urllib.request.urlopen(url, timeout=10) as answer:
            document = json.load(answer)
        assert document["status"] == "success", document
        return document["data"]["result"]

    def targets_up(self) -> bool:
        return len([r for r in self.query("up == 1")]) == 1 + MACHINES

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def prometheus(watched_pod, tmp_path_factory):
    scraper = Prometheus(tmp_path_factory.mktemp("prometheus"), watched_pod.metrics_port,
                         [m.exporter_port for m in watched_pod.rack.machines])
    yield scraper
    scraper.stop()


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard, panel, expression) of every query of the shipped dashboards, variables as "all"."""
    found = []
    for path in sorted(GRAFANA_DIR.glob("*.json")):
        document = json.loads(path.read_text())
        for panel in document["panels"]:
            for target in panel.get("targets", []):
                expr = re.sub(r'=~"\$\w+"', '=~".*"', target["expr"])
                found.append((path.name, panel["title"], expr))
        for variable in document["templating"]["list"]:
            if variable.get("type") == "query":
                found.append((path.name, f"${variable['name']}", re.sub(r"label_values\((.*), \w+\)", r"\1", variable["query"])))
    return found


def test_the_shipped_alert_rules_check_and_fire_as_their_tests_say():
    checked = subprocess.run(["/usr/bin/promtool", "check", "rules", "vipu-alerts.yml"], cwd=PROMETHEUS_DIR, capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 0 and "SUCCESS: 13 rules found" in checked.stdout, checked.stdout + checked.stderr
    tested = subprocess.run(["/usr/bin/promtool", "test", "rules", "vipu-alerts.test.yml"], cwd=PROMETHEUS_DIR, capture_output=True,
                            text=True, timeout=60)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr
    configured = subprocess.run(["/usr/bin/promtool", "check", "config", "prometheus.yml"], cwd=PROMETHEUS_DIR, capture_output=True,
                                text=True, timeout=60)
    assert configured.returncode == 0, configured.stdout + configured.stderr
    tests = (PROMETHEUS_DIR / "vipu-alerts.test.yml").read_text()
    alerts = re.findall(r"- alert: (\w+)", (PROMETHEUS_DIR / "vipu-alerts.yml").read_text())
    untested = [a for a in alerts if f"alertname: {a}\n" not in tests and a not in ("VipuAgentExporterDown", "VipuMachineLogDropping")]
    assert untested == []  # each rule's firing is tested, but two whose expressions are a plain comparison of one series


def test_the_dashboards_are_what_grafanas_schema_builds_and_load_as_dashboards():
    checked = subprocess.run([sys.executable, str(REPOSITORY / "scripts" / "grafana.py"), "--check"], capture_output=True, text=True,
                             timeout=60)
    assert checked.returncode == 0, checked.stderr
    from grafana_foundation_sdk.models.dashboard import Dashboard

    uids = set()
    for path in sorted(GRAFANA_DIR.glob("*.json")):
        document = json.loads(path.read_text())
        loaded = Dashboard.from_json(document)  # Grafana's schema, as the Foundation SDK models it
        assert loaded.title.startswith("vipu: ") and loaded.uid not in uids
        uids.add(loaded.uid)
        for panel in document["panels"]:
            assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, (path.name, panel["title"])
            assert panel["type"] == "row" or panel["targets"], (path.name, panel["title"])
    assert len(uids) == 5


def test_a_real_prometheus_scrapes_each_ipu_with_its_labels_and_utilisation_follows_a_run(watched_pod, prometheus):
    with UserClient.connect("127.0.0.1", watched_pod.user_port) as user:  # as a Slurm front-end makes a job's partition
        ipuof_files.write(watched_pod.ipuof_dir, "p1", user.create_partition("p1", 4, labels={"slurm_job": "4242"}))
    wait_until(prometheus.targets_up, timeout=30, what="prometheus to scrape the controller and both agents")
    wait_until(lambda: len(prometheus.query('vipu_agent_ipu_utilisation_percent{partition="p1"}')) == 4, timeout=30,
               what="p1's IPUs in prometheus")
    series = prometheus.query("vipu_agent_ipu_temperature_celsius")
    assert len(series) == 4 * MACHINES
    labelled = {(s["metric"]["machine"], s["metric"]["ipu"]): s["metric"] for s in series}
    p1 = [m for m in labelled.values() if m.get("partition") == "p1"]
    assert len(p1) == 4 and all(m["slurm_job"] == "4242" and m["job"] == "vipu-agents" for m in p1)
    assert all("partition" not in m for m in labelled.values() if m not in p1)  # an IPU in no partition: empty labels
    for _ in range(6):
        assert ipuof(watched_pod, "--partition", "p1").code == 0
    wait_until(lambda: min(float(s["value"][1]) for s in prometheus.query('vipu_agent_ipu_utilisation_percent{partition="p1"}')) > 50,
               timeout=20, what="p1's IPUs busy in prometheus")
    wait_until(lambda: float(prometheus.query('min(vipu_agent_ipu_temperature_celsius{partition="p1"})')[0]["value"][1])
               > float(prometheus.query('max(vipu_agent_ipu_temperature_celsius{partition=""} or '
                                        'vipu_agent_ipu_temperature_celsius unless vipu_agent_ipu_temperature_celsius{partition!=""})')
                                        [0]["value"][1]),
               timeout=20, what="p1's IPUs hotter than the idle ones")
    answered: dict[tuple[str, str], bool] = {}
    for name, panel, expr in dashboard_queries():
        found = bool(prometheus.query(expr))  # an expression Prometheus refused fails here
        answered[(name, panel)] = answered.get((name, panel), False) or found
    empty = {key for key, found in answered.items() if not found}
    # Only what this young, healthy pod in open mode has none of: no unhealthy link, no replicas, no accounts.
    assert empty <= {("vipu-links.json", "Unhealthy links"), ("vipu-pod.json", "Leader"), ("vipu-queue.json", "IPUs by account")}, empty
    assert len(answered) > 35


def test_chromium_draws_prometheus_graph_of_the_pods_ipus(watched_pod, prometheus, tmp_path):
    wait_until(lambda: prometheus.query("min(count_over_time(vipu_agent_ipu_temperature_celsius[5m])) >= 10"), timeout=30,
               what="ten readings of each IPU's temperature in prometheus")
    url = (f"http://127.0.0.1:{prometheus.port}/graph?g0.expr={urllib.parse.quote('vipu_agent_ipu_temperature_celsius')}"
           "&g0.tab=0&g0.range_input=1m")
    shot = Path(os.environ.get("VIPU_SCREENSHOTS", tmp_path)) / "prometheus-ipu-temperatures.png"
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        page.wait_for_selector("canvas, .graph-legend, [class*=legend]", timeout=30_000)
        page.screenshot(path=str(shot), full_page=True)
        legend = page.inner_text("body")
    assert 'machine="m01"' in legend.replace(" ", "") or "m01" in legend
    assert shot.stat().st_size > 10_000


def test_logs_follow_shows_a_line_the_fault_injector_wrote_within_two_seconds(watched_pod):
    machine = watched_pod.rack.machines[0].name
    follower = subprocess.Popen([str(BIN / "vipu-admin"), "-H", "127.0.0.1", "--api-port", str(watched_pod.admin_port), "logs", "agent",
                                 "ag1", "--follow", "--grep", "fault injected|heat"], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)  # let it print what came before and start following: the line to come must be new
        injected = time.monotonic()
        done = subprocess.run([str(BIN / "vipu-sim"), "fault", str(watched_pod.rack_path), "--heat", f"{machine}:ipu3=30"],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert follower.stdout is not None
        while True:
            line = follower.stdout.readline()
            assert line, "vipu-admin logs agent --follow ended"
            if f"fault injected: --heat {machine}:ipu3=30" in line:
                break
        seen_after = time.monotonic() - injected
    finally:
        follower.send_signal(signal.SIGINT)
        follower.wait(timeout=10)
    assert seen_after < 2.0, seen_after
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d gateway: fault injected", line)
    grepped = watched_pod.admin("logs", "agent", "ag1", "--grep", "(unclosed")
    assert grepped.code != 0 and "is no regular expression" in grepped.err and grepped.out == ""
    missing = watched_pod.admin("logs", "agent", "ag9")
    assert missing.code != 0 and "agent ag9 does not exist" in missing.err


def rss_kib(pid: int) -> int:
    return int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1))


def test_a_flood_of_10000_lines_keeps_memory_and_disk_bounded_and_is_counted(watched_pod):
    machine = watched_pod.rack.machines[1].name
    agent = watched_pod.agents[machine]
    before = rss_kib(agent.pid)
    done = subprocess.run([str(BIN / "vipu-sim"), "fault", str(watched_pod.rack_path), "--log", f"{machine}=flooding " + "y" * 80,
                           "--log-repeat", "10000"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    log = machine_log_path(watched_pod.rack_path, machine)
    assert log.stat().st_size <= ROTATE_BYTES and log.with_suffix(".log.1").stat().st_size <= ROTATE_BYTES + 1024

    def read() -> float:
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{watched_pod.rack.machines[1].exporter_port}/metrics", timeout=5).read()
        return float(re.search(rf'vipu_agent_log_lines_total\{{machine="{machine}"\}} (\S+)', scraped.decode()).group(1))

    wait_until(lambda: read() >= ROTATE_BYTES // 110, what="the agent to read at least the last whole file of the flood")
    flooded = f"flooding {'y' * 80}"

    def thousand_collected() -> bool:
        shown = watched_pod.admin("logs", "agent", "ag2", "-n", "1000").lines
        # the flood's, but for a line saying that a rotation between two reads may have lost some
        return len(shown) == 1000 and sum(line.endswith(flooded) for line in shown) >= 999 and shown[-1].endswith(flooded)

    wait_until(thousand_collected, timeout=30, what="the flood's lines collected by the controller")
    assert rss_kib(agent.pid) - before < 20_000
    with sqlite3.connect(watched_pod.db_url.removeprefix("sqlite:///")) as db:
        kept = db.execute("SELECT count(*) FROM machine_log_lines WHERE agent_id = 'ag2'").fetchone()[0]
    assert kept <= KEPT_MACHINE_LOG_LINES
