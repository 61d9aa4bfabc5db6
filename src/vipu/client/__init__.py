"""vipu's Python client: the library under `vipu`, `vipu-admin`, `vipu-ipuof`, the Slurm programs
and the Kubernetes proxy.

    from vipu.client import UserClient

    with UserClient.connect("ctrl.example.com") as vipu:
        config = vipu.create_partition("train", size=4)
        print([p.id for p in vipu.list_partitions()])
        vipu.remove_partition("train")

- `UserClient` (the user end-point, 8090) and `AdminClient` (the admin end-point, 8091) find the
  controller as the CLIs do (arguments, environment, configuration file, replica lists), speak
  TLS when given certificates, and call with a deadline.
- Results are the API's protobuf messages; failures raise the families of `vipu.model.errors`
  (`NotFound`, `Conflict`, `Unavailable`, ...), all `VipuError`.
- `vipu.client.retry` is the one retry policy: `verdict(error)` says whether to try again now,
  later or never; a lost race (`ConcurrentUpdate`) is retried by the client itself.
- `settings` finds the controller, `connection` makes the calls. Nothing here imports the CLIs.

Names are imported on first use, so that a program pays only for the end-point it speaks.
"""

from __future__ import annotations

import importlib
import typing

from vipu.model.errors import (
    AlreadyExists,
    ConcurrentUpdate,
    Conflict,
    HardwareFailure,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Standby,
    Unauthenticated,
    Unavailable,
    VipuError,
)

if typing.TYPE_CHECKING:
    from vipu.client.admin import AdminClient
    from vipu.client.connection import Stream
    from vipu.client.retry import RetryPolicy, Verdict, verdict
    from vipu.client.settings import ClientSettings
    from vipu.client.user import UserClient

_LAZY = {"UserClient": "vipu.client.user", "AdminClient": "vipu.client.admin", "RetryPolicy": "vipu.client.retry",
         "Verdict": "vipu.client.retry", "verdict": "vipu.client.retry", "ClientSettings": "vipu.client.settings",
         "Stream": "vipu.client.connection"}

__all__ = ["AdminClient", "AlreadyExists", "ClientSettings", "ConcurrentUpdate", "Conflict", "HardwareFailure", "InvalidArgument",
           "NotFound", "PermissionDenied", "RetryPolicy", "Standby", "Stream", "Unauthenticated", "Unavailable", "UserClient", "Verdict",
           "VipuError", "verdict"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vipu.client' has no attribute {name!r}")
