"""What the user and admin clients share: settings, the connection, closing."""

from __future__ import annotations

from pathlib import Path

from vipu.client.connection import Connection
from vipu.client.retry import RetryPolicy
from vipu.client.settings import ClientSettings, Given, client_settings

DEFAULT_TIMEOUT = 60.0


class EndpointClient:
    """A client of one end-point of vipu-server; use it in a `with` block, or `close()` it."""

    PORT_KEY, PORT_ENV, DEFAULT_PORT = "api-port", "VIPU_CLI_API_PORT", 8090

    def __init__(self, settings: ClientSettings, timeout: float = DEFAULT_TIMEOUT, retry: RetryPolicy | None = None):
        self.connection = Connection(settings, timeout, retry)

    @classmethod
    def connect(cls, host: str | None = None, port: int | None = None, *, config: Path | str | None = None,
                user_id: str | None = None, access_key: str | None = None, server_cert: Path | str | None = None,
                client_cert: Path | str | None = None, client_key: Path | str | None = None,
                timeout: float = DEFAULT_TIMEOUT, retry: RetryPolicy | None = None, environment: bool = True):
        """A client with the settings the CLIs would use: what is given here, else the environment
        (`VIPU_CLI_API_HOST`, ...; not with `environment` false), else the configuration file
        (`config`, or /etc/vipu/vipu-cli.hcl), else the defaults. `host` may list replicas: `h1,h2:8090`."""

        def path(value: Path | str | None) -> Path | None:
            return None if value is None else Path(value)

        given = Given(config=path(config), host=host, port=port, user_id=user_id, access_key=access_key,
                      server_cert=path(server_cert), client_cert=path(client_cert), client_key=path(client_key),
                      environment=environment)
        return cls(client_settings(given, cls.PORT_KEY, cls.PORT_ENV, cls.DEFAULT_PORT), timeout, retry)

    @property
    def settings(self) -> ClientSettings:
        return self.connection.settings

    def version(self) -> str:
        """The version of the vipu-server that answers."""
        return self.connection.server_version()

    def close(self) -> None:
        self.connection.close()

    def __enter__(self):
        return self

    def __exit__(self, *_) -> None:
        self.close()
