"""The interface an agent uses to drive one IPU-Machine.

A backend introspects its machine and applies or clears partition settings. It raises the
`vipu.model.errors` families: `Conflict` when the request clashes with what the machine already
holds, `HardwareFailure` when the hardware cannot do it (a cable not where it should be, a link
that does not train), `InvalidArgument` for settings that make no sense for this machine.

IPUoF clients' attachments last (until detached, lapsed or their partition's settings cleared or
replaced) so that the controller can tell a partition in use from an idle one, and fence an idle
one against new attaches while it moves it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from vipu.model.clustertests import Observation, Probe
from vipu.model.configuration import AgentSettings
from vipu.model.entities import MachineInventory
from vipu.model.linkhealth import LinkReading

DEFAULT_HOLD_SECONDS = 60.0  # how long an IPUoF attachment lasts unless the client says, renews or detaches it
MAX_HOLD_SECONDS = 86400.0
MAX_FENCE_SECONDS = 3600.0  # a fence always lapses: a controller that dies mid-move cannot lock a partition out for long


@dataclass(frozen=True)
class PartitionAttachments:
    """Who uses a partition's IPUs on one machine now: what the controller asks before it moves it."""

    partition_id: str
    attached_clients: int  # client sessions attached to some IPU of the partition
    oldest_attached_at: float  # when the longest-standing attached, seconds since the epoch; 0 when none
    fenced_until: float  # when the fence against new attaches lapses, seconds since the epoch; 0 when none stands


class MachineBackend(ABC):
    name: str = ""
    version: str = ""

    @abstractmethod
    def inventory(self) -> MachineInventory:
        """What the machine is: serial, versions, IPUs, IPUoF end-point."""

    @abstractmethod
    def apply(self, settings: AgentSettings) -> None:
        """Configure the machine for one partition; applying the same settings again is harmless."""

    @abstractmethod
    def clear(self, partition_id: str) -> None:
        """Remove one partition's configuration; clearing an unknown partition is harmless."""

    @abstractmethod
    def partitions(self) -> list[AgentSettings]:
        """The partition settings the machine holds now."""

    @abstractmethod
    def diagnose(self, probe: Probe, ipus: dict[int, int], seed: int) -> Observation:
        """Run one cluster-test step; `ipus` maps the IPUs a traffic step uses to their routing ids."""

    @abstractmethod
    def link_counters(self) -> list[LinkReading]:
        """Every link's corrected-error and recovery counters and state now, with each chassis
        port's cable identity: read without disturbing the links (partitions may be using them)."""

    @abstractmethod
    def reset_link(self, place: str) -> None:
        """Retrain one link (`LinkReading.place`); InvalidArgument for a place the machine has no link at."""

    @abstractmethod
    def ipuof_attach(self, partition_id: str, device_id: int, chip_id: str, attach_key: str, session: str = "",
                     hold_seconds: float = 0.0) -> None:
        """Let an IPUoF client attach to one IPU, if that IPU is configured for `partition_id`, the
        client presents that partition's attach key and no fence stands (`attachments`). The
        client's `session` stays attached for `hold_seconds` (0: DEFAULT_HOLD_SECONDS) unless it
        detaches; attaching again renews it."""

    @abstractmethod
    def ipuof_run(self, partition_id: str, device_id: int, chip_id: str, routing_id: int, seed: int, attach_key: str,
                  session: str = "") -> int:
        """Run the test program on an IPU; its result. It renews the session's attachment, or
        attaches it anew as `ipuof_attach` does."""

    @abstractmethod
    def ipuof_detach(self, partition_id: str, device_id: int, session: str) -> None:
        """End a session's attachment of one IPU; one already ended is no error."""

    @abstractmethod
    def attachments(self, partition_ids: Sequence[str], fence_seconds: float = 0.0) -> list[PartitionAttachments]:
        """The clients attached to each partition (none named: every partition the machine holds).
        With `fence_seconds`, each named partition the machine holds with none attached is fenced
        in the same step: new attaches are refused until the fence lapses or the partition's
        settings are cleared or applied again."""

    def power_lost(self) -> None:  # noqa: B027 (a real fabric loses it by itself: nothing to do by default)
        """The machine's power went off (another capability's driver turned it off or cycled it):
        forget what does not survive that. Real fabrics lose it themselves."""

    def silent(self) -> bool:
        """Whether the machine is playing dead (a simulated fault); real machines never say so."""
        return False
