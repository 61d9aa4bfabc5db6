"""The agent's OpenMetrics exporter (`http://HOST:PORT/metrics`, port 2112 on real machines).

Each scrape reads the backend, so the figures are never stale. Requests refused as malformed at
the machine's gRPC end-points (agent and IPUoF) are counted too: a client sending garbage is seen
here, while the log notes it only at a bounded rate.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily

from vipu.api.status import service_and_method
from vipu.backends.base import MachineBackend
from vipu.model.errors import Unavailable


class MachineCollector:
    def __init__(self, backend: MachineBackend):
        self.backend = backend

    def collect(self):
        inventory = self.backend.inventory()
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


class MachineMetrics:
    """One machine's metrics, in a registry of its own (a process may serve several machines)."""

    def __init__(self, backend: MachineBackend):
        self.registry = CollectorRegistry()
        self.registry.register(MachineCollector(backend))
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
