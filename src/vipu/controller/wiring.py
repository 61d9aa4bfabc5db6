"""The controller's use cases wired to one store, one agent gateway and the allocations' owners.

`vipu.controller.server.Controller` serves them over gRPC; tests build them alone, over simulated
machines reached in memory, and drive them directly.
"""

from __future__ import annotations

from collections.abc import Callable

from vipu.controller.core.agents import AgentCalls, AgentGateway
from vipu.controller.core.changes import ChangeFeed
from vipu.controller.core.owners import Owners
from vipu.controller.core.sharing import DEFAULT_SHARING, SharingPolicy
from vipu.controller.loops.health import HealthPass
from vipu.controller.usecases.accounts import AccountService
from vipu.controller.usecases.agents import AgentService, no_takeover
from vipu.controller.usecases.allocations import AllocationService
from vipu.controller.usecases.clusters import ClusterService
from vipu.controller.usecases.clustertests import ClusterTestService
from vipu.controller.usecases.links import LinkLedger
from vipu.controller.usecases.partitions import PartitionService
from vipu.controller.usecases.remediation import LinkRemediation
from vipu.controller.usecases.requests import RequestService
from vipu.controller.usecases.telemetry import TelemetryService
from vipu.model.compaction import DEFAULT_BUDGET, Budget
from vipu.model.linkhealth import DEFAULT_POLICY, DEFAULT_REMEDIATION, DEFAULT_RETENTION, RemediationPolicy, Retention, TrendPolicy
from vipu.model.waiting import DEFAULT_LIMITS, QueueLimits
from vipu.store.store import Store


class ControllerServices:
    def __init__(self, store: Store, gateway: AgentGateway, changes: ChangeFeed | None = None, workers: int = 32,
                 limits: QueueLimits = DEFAULT_LIMITS, takeover_grant: Callable[[str], str] = no_takeover,
                 link_policy: TrendPolicy = DEFAULT_POLICY, link_retention: Retention = DEFAULT_RETENTION,
                 link_remediation: RemediationPolicy = DEFAULT_REMEDIATION, compaction: Budget = DEFAULT_BUDGET,
                 sharing: SharingPolicy = DEFAULT_SHARING):
        """`workers`: threads for each kind of agent calls, and the user end-point's (which bounds the
        waiting calls that may block there)."""
        self.store = store
        self.gateway = gateway
        self.calls = AgentCalls(gateway, workers)
        self.owners = Owners(store, self.calls, changes, limits, compaction, sharing)
        self.partitions = PartitionService(store, self.owners)
        self.accounts = AccountService(store, self.owners)
        self.requests = RequestService(self.partitions, workers, changes.max_watchers if changes is not None else 8)
        self.allocations = AllocationService(store, self.owners)
        self.links = LinkLedger(store, gateway, link_policy, link_retention, workers=min(workers, 8), tell=self.owners.links_changed,
                                remediation=link_remediation)
        self.remediation = LinkRemediation(store, gateway, self.links, link_remediation)
        if link_remediation.attempts:
            self.links.on_failed = self.remediation.start
        self.clustertests = ClusterTestService(store, gateway, self.owners, changes, workers, self.links)
        self.clusters = ClusterService(store, self.allocations, self.clustertests.busy)
        self.agents = AgentService(store, gateway, self.clusters, self.owners, takeover_grant)
        self.health = HealthPass(store, self.owners, gateway, workers)
        self.telemetry = TelemetryService(store, gateway, self.owners, workers=min(workers, 8))

    def stop(self, reason: str) -> None:
        """Stop deciding (deposed, or stopping) and let go of the threads; the store and gateway stay open."""
        self.clustertests.shutdown()
        self.owners.stop(reason)
        self.health.close()
        self.links.close()
        self.telemetry.close()
        self.remediation.close()
        self.calls.close()
