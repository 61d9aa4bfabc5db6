"""How a caller names itself to vipu-server in secure mode: two gRPC metadata entries.

A front end that logs people in through its own address (the dashboard) may add two more: the
address of the person it acts for, and a proof that it holds the controller's server key. The
controller then counts that person's failed logins by their own address, not the front end's,
so that nobody can lock a user out of the front end for everyone by guessing at it.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress

USER_ID_KEY = "vipu-user-id"
ACCESS_KEY_KEY = "vipu-access-key"
FORWARDED_FOR_KEY = "vipu-forwarded-for"
FORWARDING_PROOF_KEY = "vipu-forwarding-proof"

_FORWARDING_LABEL = b"vipu: a front end holding the server key forwards the address it acts for"


def metadata(user_id: str, access_key: str) -> tuple[tuple[str, str], ...]:
    return ((USER_ID_KEY, user_id), (ACCESS_KEY_KEY, access_key)) if user_id or access_key else ()


def forwarding_proof(server_key: bytes) -> str:
    """A secret only holders of the server's private key (the controller, its dashboard) can work
    out; it reveals nothing of the key."""
    return hmac.new(server_key, _FORWARDING_LABEL, hashlib.sha256).hexdigest()


def forwarded(address: str, proof: str) -> tuple[tuple[str, str], ...]:
    """The metadata of a call made for someone at `address`."""
    return ((FORWARDED_FOR_KEY, address), (FORWARDING_PROOF_KEY, proof))


def forwarded_for(metadata: dict[str, str], proof: str | None) -> str:
    """The address a call says it is made for, if it proves it may say so; "" otherwise."""
    given = metadata.get(FORWARDING_PROOF_KEY, "")
    if not proof or not given or not hmac.compare_digest(given.encode(), proof.encode()):
        return ""
    try:
        return str(ipaddress.ip_address(metadata.get(FORWARDED_FOR_KEY, "")))
    except ValueError:
        return ""
