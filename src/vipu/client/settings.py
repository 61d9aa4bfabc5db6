"""Client configuration: where the CLIs find their controller, and how they prove who they are.

In order of precedence: the command-line options, the environment (`VIPU_CLI_API_HOST`,
`VIPU_CLI_API_PORT`, `VIPU_CLI_API_USER_ID`, `VIPU_CLI_API_ACCESS_KEY`), the configuration file
named by `--config` or else the system-wide `/etc/vipu/vipu-cli.hcl`, and the defaults.
Configuration files are HCL key/value lines, as `vipu-admin create user` writes them:

    api-host = "ctrl.example.com"
    api-port = 8090
    api-user-id = "alice"
    api-access-key = "..."
    tls-server-cert = "/etc/vipu/vipu-certs/client/ca.pem"     # mutual TLS: all three, or none
    tls-client-cert = "/etc/vipu/vipu-certs/client/client.pem"
    tls-client-key = "/etc/vipu/vipu-certs/client/client-key.pem"

Relative paths in a file are relative to the file.

The host may list the replicas of a highly available controller, `h1,h2,h3`, each optionally
with a port of its own (`h1:8090`, `[fd00::1]:8090`); the CLIs try them in turn.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from vipu import textfiles
from vipu.model.errors import InvalidArgument

SYSTEM_CONFIG = Path("/etc/vipu/vipu-cli.hcl")
DEFAULT_HOST = "localhost"

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
    user_id: str = ""
    access_key: str = field(default="", repr=False)
    server_cert: Path | None = None  # the authority the server's certificate must come from
    client_cert: Path | None = None
    client_key: Path | None = None
    # a front end's calls for someone else (`credentials.forwarded`), its proof among them
    forwarded: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    @property
    def tls(self) -> bool:
        return self.server_cert is not None

    @property
    def addresses(self) -> list[str]:
        """`host:port` of each controller replica the host names, in order."""
        return [address(entry, self.port) for entry in self.host.split(",") if entry.strip()] or [address(DEFAULT_HOST, self.port)]


def address(entry: str, default_port: int) -> str:
    """`host:port` from a host, `host:port`, an IPv6 address or `[IPv6]:port`."""
    entry = entry.strip()
    if entry.startswith("["):
        host, closed, rest = entry[1:].partition("]")
        host, port = f"[{host}]", rest[1:] if rest.startswith(":") else rest or (None if closed else "")
    elif entry.count(":") == 1:
        host, _, port = entry.partition(":")
    else:
        host, port = (f"[{entry}]" if ":" in entry else entry), None
    if port is None:
        return f"{host}:{default_port}"
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535 or host in ("", "[]"):
        raise InvalidArgument(f"cannot understand the host {entry!r}: expected HOST, HOST:PORT or [IPV6]:PORT, with a port from 1 to 65535")
    return f"{host}:{int(port)}"


@dataclass(frozen=True)
class Given:
    """What the command line gave; None for what it did not."""

    config: Path | None = None
    host: str | None = None
    port: int | None = None
    user_id: str | None = None
    access_key: str | None = None
    server_cert: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    environment: bool = True  # whether VIPU_CLI_API_HOST and the like count; not where a file is the whole truth


CONFIG_LIMIT_BYTES = 1 << 20  # a client configuration is a few lines; anything this long is not one


def read_config_text(path: Path) -> str:
    """A configuration file's text, bounded (`vipu.textfiles`)."""
    return textfiles.read_text(path, CONFIG_LIMIT_BYTES, "a client configuration")


def client_settings(given: Given, port_key: str = "api-port", port_env: str = "VIPU_CLI_API_PORT",
                    default_port: int = 8090) -> ClientSettings:
    path = given.config or (SYSTEM_CONFIG if SYSTEM_CONFIG.is_file() else None)
    values: dict = {}
    if path is not None:
        values = parse_hcl(read_config_text(path), str(path))

    def chosen(flag, env: str, key: str, default=None):
        if flag is not None:
            return flag
        if given.environment and os.environ.get(env):
            return os.environ[env]
        return values.get(key, default)

    def file(flag: Path | None, key: str) -> Path | None:
        if flag is not None:
            return flag
        if key not in values:
            return None
        named = Path(str(values[key])).expanduser()
        return named if named.is_absolute() or path is None else path.parent / named

    raw_port = chosen(given.port, port_env, port_key, default_port)
    try:
        port = int(raw_port)
    except (TypeError, ValueError):
        raise InvalidArgument(f"the API port must be a number, not {raw_port!r}") from None
    if not 1 <= port <= 65535:
        raise InvalidArgument(f"the API port must be from 1 to 65535, not {port}")
    tls = (file(given.server_cert, "tls-server-cert"), file(given.client_cert, "tls-client-cert"),
           file(given.client_key, "tls-client-key"))
    if any(tls) and not all(tls):
        raise InvalidArgument("mutual TLS needs the server's certificate authority, a client certificate and its key: "
                              "give all three (--tls-server-cert, --tls-client-cert, --tls-client-key)")
    settings = ClientSettings(
        host=str(chosen(given.host, "VIPU_CLI_API_HOST", "api-host", DEFAULT_HOST)),
        port=port,
        user_id=str(chosen(given.user_id, "VIPU_CLI_API_USER_ID", "api-user-id", "")),
        access_key=str(chosen(given.access_key, "VIPU_CLI_API_ACCESS_KEY", "api-access-key", "")),
        server_cert=tls[0],
        client_cert=tls[1],
        client_key=tls[2],
    )
    settings.addresses  # noqa: B018 - refuse a malformed host now, not at the first call
    return settings


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def client_config_text(settings: ClientSettings, admin_port: int | None = None) -> str:
    """A configuration file's text for one user; certificate paths as given (relative ones are
    relative to the file)."""
    lines = [f"api-host = {_quoted(settings.host)}", f"api-port = {settings.port}"]
    if admin_port is not None:
        lines.append(f"api-admin-port = {admin_port}")
    lines += [f"api-user-id = {_quoted(settings.user_id)}", f"api-access-key = {_quoted(settings.access_key)}"]
    for key, file in (("tls-server-cert", settings.server_cert), ("tls-client-cert", settings.client_cert),
                      ("tls-client-key", settings.client_key)):
        if file is not None:
            lines.append(f"{key} = {_quoted(str(file))}")
    return "\n".join(lines) + "\n"


def write_client_config(path: Path, settings: ClientSettings, admin_port: int | None = None) -> None:
    """A configuration file for one user, readable by its owner only: it holds an access key."""
    def resolved(file: str | Path | None) -> Path | None:
        return None if file is None else Path(file).resolve()

    absolute = replace(settings, server_cert=resolved(settings.server_cert), client_cert=resolved(settings.client_cert),
                       client_key=resolved(settings.client_key))
    path.parent.mkdir(parents=True, exist_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        os.fchmod(out.fileno(), 0o600)  # a file that was there keeps its mode through O_CREAT
        out.write(client_config_text(absolute, admin_port))
