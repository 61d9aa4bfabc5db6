"""JSON over HTTP to the V-IPU proxy, from the operator and the launcher's init program."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


def call(method: str, url: str, body: dict | None = None, timeout: float = 60.0) -> tuple[int, dict]:
    """The status and JSON reply; an error status comes back as `{"detail": ...}`. Raises OSError
    when the proxy cannot be reached."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, json.loads(reply.read() or b"{}")
    except urllib.error.HTTPError as error:
        try:
            detail = json.loads(error.read() or b"{}").get("detail", error.reason)
        except ValueError:
            detail = error.reason
        return error.code, {"detail": detail if isinstance(detail, str) else json.dumps(detail)}
