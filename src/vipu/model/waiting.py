"""How long waiting, and a partition's expected run, may last, and how many may wait, which the
controller enforces and clients check alike (a module of its own, so that a command line's checks
import nothing else)."""

from dataclasses import dataclass

# The longest a request may wait: no request waits without a deadline.
MAX_WAIT_SECONDS = 7 * 24 * 3600
# The longest one waiting call (the API's WaitPartition) lasts; clients call again until their own deadline.
WAIT_CALL_SECONDS = 20
# The longest expected duration of a partition the user API carries (a uint32 of seconds, about 136 years).
MAX_EXPECTED_SECONDS = 2**32 - 1


def ends_in_time(duration: float | None, needed_at: float | None, now: float) -> bool:
    """Whether work expected to run `duration` (None: unknown), started `now`, ends by `needed_at`
    (None: unknown): the queue's rule for starting on IPUs held for its first request."""
    return duration is not None and needed_at is not None and now + duration <= needed_at


@dataclass(frozen=True)
class QueueLimits:
    """How many requests may wait: for one user of secure mode, and in all; and how long one waits
    that nobody asks after (its waiter gone) before it is withdrawn."""

    per_user: int = 100
    total: int = 10_000
    lease_seconds: float = 60.0  # three of a waiter's longest calls (WAIT_CALL_SECONDS): a live waiter renews it well before


DEFAULT_LIMITS = QueueLimits()
