"""How a caller names itself to vipu-server in secure mode: two gRPC metadata entries."""

from __future__ import annotations

USER_ID_KEY = "vipu-user-id"
ACCESS_KEY_KEY = "vipu-access-key"


def metadata(user_id: str, access_key: str) -> tuple[tuple[str, str], ...]:
    return ((USER_ID_KEY, user_id), (ACCESS_KEY_KEY, access_key)) if user_id or access_key else ()
