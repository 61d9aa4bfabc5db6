"""Client configuration: where `vipu` finds its controller.

In order of precedence: the command-line options, the environment (`VIPU_CLI_API_HOST`,
`VIPU_CLI_API_PORT`), the configuration file named by `--config` or else the system-wide
`/etc/vipu/vipu-cli.hcl`, and finally localhost:8090. Configuration files are HCL key/value
lines such as `api-host = "ctrl.example.com"` and `api-port = 8090`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from vipu.model.errors import InvalidArgument

SYSTEM_CONFIG = Path("/etc/vipu/vipu-cli.hcl")
DEFAULT_HOST = "localhost"
DEFAULT_PORT = 8090

_LINE = re.compile(r'^\s*([A-Za-z_][\w-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|(-?\d+)|(true|false))\s*(?:(?:#|//).*)?$')


def parse_hcl(text: str, source: str) -> dict[str, str | int | bool]:
    """The key/value pairs of a flat HCL file; anything else is refused with its line number."""
    values: dict[str, str | int | bool] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip() or raw.strip().startswith(("#", "//")):
            continue
        match = _LINE.match(raw)
        if match is None:
            raise InvalidArgument(f"{source}, line {number}: expected key = \"text\", key = number or key = true|false")
        key, text_value, number_value, flag = match.groups()
        if text_value is not None:
            values[key] = re.sub(r"\\(.)", r"\1", text_value)
        elif number_value is not None:
            values[key] = int(number_value)
        else:
            values[key] = flag == "true"
    return values


@dataclass(frozen=True)
class ClientSettings:
    host: str
    port: int


def client_settings(config_path: Path | None, host: str | None, port: int | None) -> ClientSettings:
    path = config_path or (SYSTEM_CONFIG if SYSTEM_CONFIG.is_file() else None)
    values: dict = {}
    if path is not None:
        try:
            values = parse_hcl(path.read_text(), str(path))
        except OSError as error:
            raise InvalidArgument(f"cannot read {path}: {error.strerror}") from error
    host = host or os.environ.get("VIPU_CLI_API_HOST") or str(values.get("api-host", DEFAULT_HOST))
    if port is None:
        raw = os.environ.get("VIPU_CLI_API_PORT") or values.get("api-port", DEFAULT_PORT)
        try:
            port = int(raw)
        except (TypeError, ValueError):
            raise InvalidArgument(f"the API port must be a number, not {raw!r}") from None
    if not 1 <= port <= 65535:
        raise InvalidArgument(f"the API port must be from 1 to 65535, not {port}")
    return ClientSettings(host, port)
