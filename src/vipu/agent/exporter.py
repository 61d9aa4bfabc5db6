"""The agent's OpenMetrics exporter (`http://HOST:PORT/metrics`, port 2112 on real machines).

A scrape reads what the fabric holds now (its partitions), and serves the telemetry the agent
last read on its own schedule (`vipu.agent.watch`) with its age, so it never waits on a slow BMC.
Each IPU's series carry the labels an operator joins on, as dcgm-exporter attributes GPUs to
pods: the machine, the IPU, and the partition it runs with its user and, where a front-end made
it, the IPUJob and namespace (Kubernetes) or the job (Slurm); an IPU in no partition has them
empty. A field the machine has no sensor for is left out, not given as 0. Requests refused as
malformed at the machine's gRPC end-points (agent and IPUoF) are counted too: a client sending
garbage is seen here, while the log notes it only at a bounded rate.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

from vipu.agent.watch import MachineWatch
from vipu.api.status import service_and_method
from vipu.backends.composed import ComposedMachine
from vipu.model.configuration import AgentSettings, attribution
from vipu.model.errors import Unavailable

IPU_LABELS = ["machine", "ipu", "partition", "user", "ipujob", "namespace", "slurm_job"]
# Each IPU field: (metric, help, kind, the IpuReading attribute)
IPU_FIELDS = (
    ("vipu_agent_ipu_utilisation_percent", "Percent of the last seconds the IPU ran a program", "gauge", "utilisation"),
    ("vipu_agent_ipu_temperature_celsius", "The IPU's temperature", "gauge", "temperature"),
    ("vipu_agent_ipu_power_watts", "The IPU's power draw", "gauge", "power"),
    ("vipu_agent_ipu_clock_mhz", "The IPU's clock", "gauge", "clock_mhz"),
    ("vipu_agent_ipu_memory_used_bytes", "In-processor memory a loaded program takes", "gauge", "memory_used"),
    ("vipu_agent_ipu_memory_total_bytes", "The IPU's in-processor memory", "gauge", "memory_total"),
    ("vipu_agent_ipu_ecc_errors", "Corrected ECC errors since the machine started", "counter", "ecc_errors"),
    ("vipu_agent_ipu_parity_errors", "Parity errors since the machine started", "counter", "parity_errors"),
    ("vipu_agent_ipu_link_errors", "Corrected errors on the IPU's links inside the machine", "counter", "link_errors"),
)


class MachineCollector:
    def __init__(self, backend: ComposedMachine, watch: MachineWatch | None = None):
        self.backend = backend
        self.watch = watch

    def collect(self):
        inventory = self.backend.fabric.inventory()  # not the BMC's hardware: a scrape never waits on a BMC
        info = InfoMetricFamily("vipu_agent_machine", "The IPU-Machine this agent drives")
        info.add_metric([], {"serial": inventory.serial, "platform": inventory.platform, "backend": inventory.backend})
        yield info
        try:
            partitions = self.backend.partitions()
        except Unavailable:  # powered off: it holds none
            partitions = []
        configured = sum(len(p.ipus) for p in partitions)
        ipus = GaugeMetricFamily("vipu_agent_ipus", "IPUs of the machine by use", labels=["use"])
        ipus.add_metric(["partition"], configured)
        ipus.add_metric(["free"], len(inventory.ipus) - configured)
        yield ipus
        yield GaugeMetricFamily("vipu_agent_partitions", "Partitions configured on the machine", value=len(partitions))
        if self.watch is not None:
            yield from self._telemetry(self.watch, partitions)
            yield from self._log_counts(self.watch)

    def _telemetry(self, watch: MachineWatch, partitions: list[AgentSettings]):
        machine = self.backend.machine_name
        reading, age = watch.latest()
        failures = CounterMetricFamily("vipu_agent_telemetry_read_failures", "Readings of the machine's telemetry that failed",
                                       labels=["machine"])
        failures.add_metric([machine], watch.telemetry_failures)
        yield failures
        age_family = GaugeMetricFamily("vipu_agent_telemetry_age_seconds", "Seconds since the telemetry served was read (since "
                                       "the agent started, before the first reading)", labels=["machine"])
        age_family.add_metric([machine], age)
        yield age_family
        if reading is None:
            return
        held = {ipu.index: settings for settings in partitions for ipu in settings.ipus}
        families = {name: (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(name, help_text, labels=IPU_LABELS)
                    for name, help_text, kind, _ in IPU_FIELDS}
        for ipu in reading.ipus:
            settings = held.get(ipu.index)
            labels = [machine, str(ipu.index), *attribution(settings)]
            for name, _, _, field in IPU_FIELDS:
                value = getattr(ipu, field)
                if value is not None:
                    families[name].add_metric(labels, value)
        yield from (family for family in families.values() if family.samples)
        for kind, unit in (("temperature", "celsius"), ("power", "watts")):
            sensors = GaugeMetricFamily(f"vipu_agent_sensor_{unit}", f"A machine sensor's {kind} reading (not one IPU's)",
                                        labels=["machine", "sensor"])
            for sensor in reading.sensors:
                if sensor.kind == kind:
                    sensors.add_metric([machine, sensor.name], sensor.value)
            if sensors.samples:
                yield sensors

    def _log_counts(self, watch: MachineWatch):
        machine = self.backend.machine_name
        for name, help_text, value in (
            ("vipu_agent_log_lines", "Lines of the machine's log the agent read", watch.log.last),
            ("vipu_agent_log_lines_dropped", "Lines of the machine's log that left the agent's tail before the controller "
                                             "collected them", watch.log.dropped),
        ):
            family = CounterMetricFamily(name, help_text, labels=["machine"])
            family.add_metric([machine], value)
            yield family


class MachineMetrics:
    """One machine's metrics, in a registry of its own (a process may serve several machines)."""

    def __init__(self, backend: ComposedMachine, watch: MachineWatch | None = None):
        self.registry = CollectorRegistry()
        self.registry.register(MachineCollector(backend, watch))
        self.malformed = Counter(
            "vipu_agent_malformed_requests", "Requests whose bytes were not the method's message, by service and method",
            ["service", "method"], registry=self.registry,
        )

    def count_malformed(self, method_path: str) -> None:
        self.malformed.labels(*service_and_method(method_path)).inc()

    def serve(self, host: str, port: int) -> None:
        try:
            start_http_server(port, addr=host, registry=self.registry)
        except OSError as error:
            raise Unavailable(f"cannot serve metrics on {host}:{port}: {error.strerror}") from error
