#!/usr/bin/env python3
"""Writes the Grafana dashboards that ship in deploy/grafana/, built with Grafana's own Foundation SDK
(its builders follow Grafana's dashboard schema, so what they build is a dashboard Grafana loads).

    python scripts/grafana.py           write deploy/grafana/*.json
    python scripts/grafana.py --check   exit 1 if a committed dashboard is not what this builds

Every query is evaluated by a real Prometheus scraping a simulated pod in
tests/functional/test_monitoring.py. Edit the dashboards here, not in their JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh

OUT = Path(__file__).resolve().parent.parent / "deploy" / "grafana"
IPU = "machine=~\"$machine\""


def _datasource() -> DataSourceRef:
    return DataSourceRef(type_val="prometheus", uid="${datasource}")


def query(expr: str, legend: str = "", ref: str = "A", instant: bool = False) -> prometheus.Dataquery:
    built = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(_datasource())
    if legend:
        built = built.legend_format(legend)
    return built.instant() if instant else built


def series(title: str, unit: str, *queries: prometheus.Dataquery, width: int = 12, description: str = "") -> timeseries.Panel:
    panel = timeseries.Panel().title(title).unit(unit).datasource(_datasource()).height(8).span(width)
    if description:
        panel = panel.description(description)
    for built in queries:
        panel = panel.with_target(built)
    return panel


def number(title: str, unit: str, expr: str, width: int = 4, description: str = "") -> stat.Panel:
    panel = stat.Panel().title(title).unit(unit).datasource(_datasource()).height(4).span(width).with_target(query(expr, instant=True))
    return panel.description(description) if description else panel


def listing(title: str, expr: str, width: int = 24, description: str = "") -> table.Panel:
    panel = (table.Panel().title(title).datasource(_datasource()).height(8).span(width)
             .with_target(query(expr, instant=True).format("table")))
    return panel.description(description) if description else panel


def base(title: str, uid: str, description: str) -> dashboard.Dashboard:
    return (dashboard.Dashboard(title).uid(uid).description(description).tags(["vipu"]).refresh("30s").time("now-6h", "now")
            .editable().timezone("utc")
            .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")))


def variable(name: str, label: str, expr: str, every: bool = False) -> dashboard.QueryVariable:
    built = (dashboard.QueryVariable(name).label(label).datasource(_datasource()).query(expr)
             .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED))
    return built.include_all(True).multi(True) if every else built


def pod_overview() -> dashboard.Dashboard:
    return (base("vipu: pod overview", "vipu-pod", "The whole pod at a glance: machines, partitions, IPUs in use, heat and power.")
            .with_row(dashboard.Row("Pod"))
            .with_panel(number("Machines Up", "none", 'sum(vipu_agents{status="Up"})'))
            .with_panel(number("Machines Down", "none", 'sum(vipu_agents{status="Down"})',
                               description="vipu-admin list agents says why each is Down."))
            .with_panel(number("Partitions", "none", "sum(vipu_partitions)"))
            .with_panel(number("IPUs in partitions", "percentunit", 'sum(vipu_ipus{use="partition"}) / sum(vipu_ipus)'))
            .with_panel(number("Hottest IPU", "celsius", "max(vipu_agent_ipu_temperature_celsius)"))
            .with_panel(number("IPUs' power", "watt", "sum(vipu_agent_ipu_power_watts)"))
            .with_row(dashboard.Row("IPUs"))
            .with_panel(series("Utilisation by machine", "percent",
                               query("avg by (machine) (vipu_agent_ipu_utilisation_percent)", "{{machine}}")))
            .with_panel(series("Hottest IPU by machine", "celsius",
                               query("max by (machine) (vipu_agent_ipu_temperature_celsius)", "{{machine}}")))
            .with_panel(series("IPUs by use", "none", query("sum by (use) (vipu_ipus)", "{{use}}")))
            .with_panel(series("Partitions by state", "none", query("sum by (state) (vipu_partitions)", "{{state}}")))
            .with_row(dashboard.Row("Controller"))
            .with_panel(series("Requests", "reqps", query("sum by (method) (rate(vipu_requests_total[5m]))", "{{method}}")))
            .with_panel(series("Request latency, 99th percentile", "s",
                               query("histogram_quantile(0.99, sum by (le, method) (rate(vipu_request_duration_seconds_bucket[5m])))",
                                     "{{method}}")))
            .with_panel(series("Store commits, 99th percentile", "s",
                               query("histogram_quantile(0.99, sum by (le) (rate(vipu_store_commit_seconds_bucket[5m])))", "commit"),
                               description="Every decision waits on its commit; VipuStoreWritesSlow fires above half a second."))
            .with_panel(series("Leader", "none", query("vipu_leader", "{{instance}}"),
                               description="1 while a replica leads (vipu-server --ha).")))


def machine() -> dashboard.Dashboard:
    return (base("vipu: machine", "vipu-machine", "One IPU-Machine's IPUs: utilisation, heat, power, clocks, memory and errors.")
            .with_variable(variable("machine", "Machine", "label_values(vipu_agent_ipu_utilisation_percent, machine)"))
            .with_panel(series("Utilisation", "percent", query(f"vipu_agent_ipu_utilisation_percent{{{IPU}}}", "IPU {{ipu}}")))
            .with_panel(series("Temperature", "celsius", query(f"vipu_agent_ipu_temperature_celsius{{{IPU}}}", "IPU {{ipu}}"),
                               query(f"vipu_agent_sensor_celsius{{{IPU}}}", "{{sensor}}", "B")))
            .with_panel(series("Power", "watt", query(f"vipu_agent_ipu_power_watts{{{IPU}}}", "IPU {{ipu}}"),
                               query(f"vipu_agent_sensor_watts{{{IPU}}}", "{{sensor}}", "B")))
            .with_panel(series("Clock", "rotmhz", query(f"vipu_agent_ipu_clock_mhz{{{IPU}}}", "IPU {{ipu}}"),
                               description="Below 1330 MHz: the IPU throttles, being too hot."))
            .with_panel(series("Memory used", "bytes", query(f"vipu_agent_ipu_memory_used_bytes{{{IPU}}}", "IPU {{ipu}}")))
            .with_panel(series("Errors, per 10 minutes", "none",
                               query(f"increase(vipu_agent_ipu_ecc_errors_total{{{IPU}}}[10m])", "ECC, IPU {{ipu}}"),
                               query(f"increase(vipu_agent_ipu_parity_errors_total{{{IPU}}}[10m])", "parity, IPU {{ipu}}", "B"),
                               query(f"increase(vipu_agent_ipu_link_errors_total{{{IPU}}}[10m])", "links, IPU {{ipu}}", "C")))
            .with_panel(series("Telemetry age", "s", query(f"vipu_agent_telemetry_age_seconds{{{IPU}}}", "{{machine}}"),
                               description="How old the readings served are: a slow BMC makes them older, never the scrape slower."))
            .with_panel(series("Log lines, per minute", "none",
                               query(f"rate(vipu_agent_log_lines_total{{{IPU}}}[5m]) * 60", "read"),
                               query(f"rate(vipu_agent_log_lines_dropped_total{{{IPU}}}[5m]) * 60", "dropped", "B")))
            .with_panel(listing("Who runs on its IPUs", f'vipu_agent_ipu_utilisation_percent{{{IPU}, partition!=""}}')))


def partition() -> dashboard.Dashboard:
    ipus = 'partition=~"$partition"'
    return (base("vipu: partition", "vipu-partition", "One partition's IPUs over its life, with who runs it.")
            .with_variable(variable("partition", "Partition", 'label_values(vipu_agent_ipu_utilisation_percent{partition!=""}, partition)'))
            .with_panel(number("Mean utilisation", "percent", f"avg(vipu_agent_ipu_utilisation_percent{{{ipus}}})", width=6))
            .with_panel(number("Hottest IPU", "celsius", f"max(vipu_agent_ipu_temperature_celsius{{{ipus}}})", width=6))
            .with_panel(number("Power", "watt", f"sum(vipu_agent_ipu_power_watts{{{ipus}}})", width=6))
            .with_panel(number("Memory used", "bytes", f"sum(vipu_agent_ipu_memory_used_bytes{{{ipus}}})", width=6))
            .with_panel(series("Utilisation", "percent",
                               query(f"vipu_agent_ipu_utilisation_percent{{{ipus}}}", "{{machine}} IPU {{ipu}}"), width=24))
            .with_panel(series("Temperature", "celsius", query(f"vipu_agent_ipu_temperature_celsius{{{ipus}}}", "{{machine}} IPU {{ipu}}")))
            .with_panel(series("Power", "watt", query(f"vipu_agent_ipu_power_watts{{{ipus}}}", "{{machine}} IPU {{ipu}}")))
            .with_panel(listing("Its IPUs and workload", f"vipu_agent_ipu_utilisation_percent{{{ipus}}}",
                                description="user, and the IPUJob and namespace or the Slurm job its front-end named.")))


def queue_and_quotas() -> dashboard.Dashboard:
    allocation = 'allocation=~"$allocation"'
    return (base("vipu: queue and quotas", "vipu-queue", "Who waits and for how long; each account's use against its quota.")
            .with_variable(variable("allocation", "Allocation", "label_values(vipu_queued_requests, allocation)", every=True))
            .with_panel(series("Requests waiting", "none", query(f"vipu_queued_requests{{{allocation}}}", "{{allocation}}")))
            .with_panel(series("Longest wait", "s", query(f"vipu_queue_oldest_wait_seconds{{{allocation}}}", "{{allocation}}"),
                               description="VipuQueueWaitLong fires above an hour."))
            .with_panel(series("IPUs by account", "none", query(f"vipu_account_ipus{{{allocation}}}", "{{account}} in {{allocation}}"),
                               query(f"vipu_account_quota_ipus{{{allocation}}}", "quota of {{account}} in {{allocation}}", "B")))
            .with_panel(series("IPU-hours used, per hour", "none",
                               query("rate(vipu_account_ipu_seconds_total[1h])", "{{account}}"),
                               description="An account's IPU-seconds per second: the IPUs it held on average.")))


def links() -> dashboard.Dashboard:
    return (base("vipu: links", "vipu-links", "The link ledger: links by health, the unhealthy ones, quarantine and remediation.")
            .with_panel(number("Suspect links", "none", 'sum(vipu_links{health="suspect"})', width=6))
            .with_panel(number("Failed links", "none", 'sum(vipu_links{health="failed"})', width=6))
            .with_panel(number("Quarantined", "none", "sum(vipu_link_quarantined)", width=6))
            .with_panel(number("Held by the breaker", "none", "sum(vipu_link_breaker_held)", width=6))
            .with_panel(series("Links by health", "none", query("sum by (health) (vipu_links)", "{{health}}")))
            .with_panel(series("Remediations", "none", query("vipu_link_remediations", "{{state}}")))
            .with_panel(listing("Unhealthy links", "vipu_link_unhealthy == 1",
                                description="vipu-admin get link LINK --history says why each is.")))


DASHBOARDS = {"vipu-pod.json": pod_overview, "vipu-machine.json": machine, "vipu-partition.json": partition,
              "vipu-queue.json": queue_and_quotas, "vipu-links.json": links}


def _without_nulls(value):
    """The SDK writes a field it was not given as null; Grafana takes a missing one as its default."""
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value


def rendered(build) -> str:
    document = json.loads(json.dumps(build().build(), cls=JSONEncoder))
    return json.dumps(_without_nulls(document), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main() -> int:
    check = sys.argv[1:] == ["--check"]
    stale = []
    for name, build in DASHBOARDS.items():
        text, path = rendered(build), OUT / name
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            OUT.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"deploy/grafana: {', '.join(stale)} not what scripts/grafana.py builds: run it", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
