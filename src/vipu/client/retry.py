"""When to ask vipu-server again: the one retry policy of every client.

A failed call is judged by its error's family alone, which `vipu.api.status.error_from_rpc`
recovers from the status code and the family the server names in its trailer:

- `AGAIN`: temporary. The controller or an agent could not be reached, a standby answered, or
  another request won a race: the same call may succeed in a moment.
- `LATER`: the state forbids it now (no room, in use, under test, the id taken): it may succeed
  once other work ends, so a scheduler queues it (Slurm requeues the job, an IPUJob waits).
- `NEVER`: the request or the caller is wrong (invalid, not found, not permitted), or the
  hardware refused it: asking again cannot help, and the caller is told why.

An error of no known family (an internal error, a reset stream) is judged `AGAIN`: nothing says
the request was wrong. Credentials refused (`Unauthenticated`) are `LATER`: the same request
succeeds once an administrator mends them.

The Kubernetes proxy answers over HTTP; `http_status` and `verdict_of_http` carry the same
verdicts across it, so that its clients decide as a gRPC client would.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from vipu.model import errors


class Verdict(enum.Enum):
    AGAIN = "again"
    LATER = "later"
    NEVER = "never"


_NEVER = (errors.InvalidArgument, errors.NotFound, errors.PermissionDenied, errors.HardwareFailure)


def verdict(error: errors.VipuError) -> Verdict:
    if error.temporary or type(error) is errors.VipuError:
        return Verdict.AGAIN
    if isinstance(error, errors.Conflict | errors.AlreadyExists | errors.Unauthenticated):
        return Verdict.LATER
    if isinstance(error, _NEVER):
        return Verdict.NEVER
    return Verdict.AGAIN


_HTTP_STATUS: tuple[tuple[type[errors.VipuError], int], ...] = (
    (errors.InvalidArgument, 400), (errors.Unauthenticated, 401), (errors.PermissionDenied, 403), (errors.NotFound, 404),
    (errors.HardwareFailure, 422),  # a refusal without a closer status: the hardware failed the request
)


def http_status(error: errors.VipuError) -> int:
    """The HTTP status a service in front of vipu-server answers an error with."""
    named = next((status for family, status in _HTTP_STATUS if isinstance(error, family)), None)
    if named is not None:
        return named
    judged = verdict(error)
    if judged is Verdict.LATER:
        return 409
    return 503 if error.temporary else 500


def verdict_of_http(status: int) -> Verdict:
    """The verdict behind an HTTP error status from such a service (or from a proxy on the way)."""
    if status in (401, 409):
        return Verdict.LATER
    if 400 <= status < 500 and status not in (408, 429):
        return Verdict.NEVER
    return Verdict.AGAIN


@dataclass(frozen=True)
class RetryPolicy:
    """How often, and how long apart, to try again what may succeed: delays that double from
    `first_delay` to at most `longest_delay`, `attempts` tries in all (None: no end)."""

    attempts: int | None = 4
    first_delay: float = 0.05
    longest_delay: float = 2.0

    def delays(self) -> Iterator[float]:
        """The pause before each try after the first."""
        tries = itertools.count(1) if self.attempts is None else range(1, self.attempts)
        for n in tries:
            yield min(self.first_delay * 2 ** (n - 1), self.longest_delay)



def answered_early(asked: float, took: float) -> bool:
    """Whether a call asked to wait up to `asked` seconds that came back after `took` seconds with
    nothing settled came back well before its time: the server did not wait (its places for
    waiting calls were all taken, say), so calling again at once would spin. Such a client pauses
    first, by a RetryPolicy, as after a temporary error."""
    return took < asked / 2
