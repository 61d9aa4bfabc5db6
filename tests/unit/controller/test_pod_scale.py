"""User operations and health passes at pod scale, on SQLite and PostgreSQL: nothing waits on
anything else without a deadline.

256 real simulated machines reached in memory, each answering every call in 20 ms (a test double
of the agents' network only). Large creates hold many agents at once while a health pass wants
each of them alone: before allocations had owners this hung, creates and pass together.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.unit.controller.test_services import InMemoryGateway
from vipu.backends.sim.rack import generate_rack, save_rack
from vipu.controller.wiring import ControllerServices
from vipu.model.entities import Cluster, IldTopology, PartitionRequest, ReadyState
from vipu.model.errors import VipuError
from vipu.store.store import Store

MACHINES = 256
ANSWER_SECONDS = 0.020
HANG_SECONDS = 60.0  # what a loaded CI machine may take, far below a hang's forever


class SlowGateway(InMemoryGateway):
    """Every call takes ANSWER_SECONDS once `slow` is set, as an agent across a network would."""

    def __init__(self, rack_path):
        super().__init__(rack_path)
        self.slow = False

    def machine(self, host, port):
        if self.slow:
            time.sleep(ANSWER_SECONDS)
        return super().machine(host, port)


@pytest.fixture
def large_pod(tmp_path, store_url):
    rack_path = tmp_path / "rack.yaml"
    rack = generate_rack(MACHINES, topology=IldTopology.TORUS)
    save_rack(rack, rack_path)
    gateway = SlowGateway(rack_path)
    store = Store(store_url)
    services = ControllerServices(store, gateway, workers=32)
    services.owners.load()
    for n, machine in enumerate(rack.machines, start=1):
        services.agents.create(f"ag{n}", machine.host, machine.port)
    services.clusters.create(Cluster("cl0", tuple(f"ag{n}" for n in range(1, MACHINES + 1)), IldTopology.TORUS))
    services.allocations.create("a1", "cl0", size=MACHINES * 4)
    gateway.slow = True
    yield services.partitions, services.health
    services.stop("the test is over")
    store.close()


def test_a_health_pass_and_four_large_creates_all_end_none_hanging(large_pod):
    partitions, health = large_pod
    outcomes: dict[str, object] = {}

    def run(name, work):
        try:
            outcomes[name] = work()
        except VipuError as error:
            outcomes[name] = error

    threads = [threading.Thread(target=run, args=("health pass", health.check_all), daemon=True)]
    threads += [threading.Thread(target=run, args=(f"p{n}", lambda n=n: partitions.create(PartitionRequest(f"p{n}", 64))),
                                 daemon=True) for n in range(4)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:  # a hang, not a speed: they end in a second or two here (bench/ measures speed)
        thread.join(timeout=max(0.0, HANG_SECONDS - (time.monotonic() - started)))
    stuck = [thread for thread in threads if thread.is_alive()]
    assert not stuck, f"{len(stuck)} of 5 still running after {HANG_SECONDS:g} s; ended: {sorted(outcomes)}"
    for n in range(4):
        created = outcomes[f"p{n}"]
        assert not isinstance(created, VipuError), created
        assert created.ready_state is ReadyState.ACTIVE
