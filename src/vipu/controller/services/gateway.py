"""The services' view of the agents: what they can ask of an IPU-Machine.

The services depend on this interface only; `vipu.controller.agentclient` implements it over
gRPC, and unit tests can implement it in memory. Every method raises the `vipu.model.errors`
families: `Unavailable` when the agent cannot be reached, `HardwareFailure` or `Conflict` when
it refuses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from vipu.model.clustertests import Observation, Probe
from vipu.model.configuration import AgentSettings
from vipu.model.entities import MachineInventory
from vipu.model.errors import VipuError


class AgentGateway(Protocol):
    def inventory(self, host: str, port: int) -> MachineInventory: ...

    def apply(self, host: str, port: int, settings: AgentSettings) -> None: ...

    def clear(self, host: str, port: int, partition_id: str) -> None: ...

    def apply_all(self, targets: Sequence[tuple[str, int, AgentSettings]]) -> list[VipuError | None]:
        """`apply` on several agents at once, (host, port, settings) each; each one's error, or
        None where it succeeded, in order."""
        ...

    def clear_all(self, targets: Sequence[tuple[str, int]], partition_id: str) -> list[VipuError | None]:
        """`clear` of one partition on several agents at once, (host, port) each; as `apply_all`."""
        ...

    def partitions(self, host: str, port: int) -> list[AgentSettings]: ...

    def diagnose(self, host: str, port: int, probe: Probe, ipus: dict[int, int], seed: int) -> Observation: ...

    def claim(self, host: str, port: int, takeover_grant: str = "") -> str:
        """Hold the agent's machine, so that it obeys this controller only (on a TLS link); with a
        grant from the site's agent-link authority, take it from another controller. `PermissionDenied`
        when another holds it; the controller it was taken from, or ""."""
        ...

    def release(self, host: str, port: int) -> None:
        """Let go of the machine, for another controller to claim."""
        ...

    def forget(self, host: str, port: int) -> None:
        """Release whatever the gateway keeps for an agent that was removed."""
