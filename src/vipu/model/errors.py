"""The one exception root of vipu and its few families.

Each family maps to exactly one gRPC status code (in `vipu.api.status`) and so to one kind of
CLI message. Services raise the most specific family; servicers translate in one place. A
message is a single sentence without a trailing full stop: the CLI adds its own framing.
"""

from __future__ import annotations


class VipuError(Exception):
    """Anything vipu refuses or fails to do, with a message fit for the user."""

    temporary = False

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidArgument(VipuError):
    """The request itself is wrong: a bad id, size or combination of options."""


class NotFound(VipuError):
    """The request names an entity that does not exist."""


class AlreadyExists(VipuError):
    """The request would create an entity whose id is taken."""


class Conflict(VipuError):
    """The request is valid but the current state forbids it: in use, no room, under test."""


class NoRoom(Conflict):
    """Valid, but there is no room for it now: a request that may wait for room. `allocations`
    names those it could fit in, were partitions to end; `held_free`, how many IPUs were free but
    held for the first waiting request, which placement kept it off (whether or not they alone
    would have made room)."""

    def __init__(self, message: str, allocations: tuple[str, ...] = (), held_free: int = 0):
        super().__init__(message)
        self.allocations = allocations
        self.held_free = held_free


class ConcurrentUpdate(Conflict):
    """Another request changed the same entities between this one's read and its write."""

    temporary = True


class Unavailable(VipuError):
    """A machine or service needed for the request cannot be reached; trying later may work."""

    temporary = True


class OutcomeUnknown(Unavailable):
    """A change may or may not have been made: its commit's answer was lost (the connection went
    during COMMIT), or the thread committing it gave no word in time. Never taken for "not done":
    what the store holds says which, and the message says how to look."""


class Standby(Unavailable):
    """This controller is a standby replica: another holds the lead and serves (at `leader`, when known)."""

    def __init__(self, message: str, leader: str = ""):
        super().__init__(message)
        self.leader = leader


class HardwareFailure(VipuError):
    """An agent was reached but its hardware refused or failed the operation."""


class PermissionDenied(VipuError):
    """The caller may not do this."""


class Unauthenticated(VipuError):
    """The caller could not be identified."""


def one_line(message: str) -> str:
    """The message with control characters (from names a caller sent, say) escaped: a refusal is one line."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in message)
