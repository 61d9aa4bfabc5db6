"""`vipu-web`: the dashboard, a process of its own beside vipu-server."""

from __future__ import annotations

import ipaddress
import logging
import sys
from pathlib import Path

import click

from vipu import __version__
from vipu.api.listening import listening_socket
from vipu.api.tls import DEFAULT_DIRECTORY, TlsFiles, forwarding_proof
from vipu.client.settings import DEFAULT_HOST, ClientSettings
from vipu.model.errors import InvalidArgument, VipuError


def controller_settings(host: str, port: int, secure: bool, tls: TlsFiles) -> ClientSettings:
    """How the dashboard reaches vipu-server: in secure mode over mutual TLS, with the client
    certificate the site issued (the viewers' keys are added per session)."""
    if not secure:
        return ClientSettings(host, port)
    needed = (tls.ca_for(tls.client_dir), tls.client_cert, tls.client_key, tls.server_cert, tls.server_key)
    missing = [str(path) for path in needed if not path.is_file()]
    if missing:
        raise InvalidArgument(f"secure mode needs {', '.join(missing)} (vipu-server --init --secure makes them in --tls-dir)")
    settings = ClientSettings(host, port, server_cert=needed[0], client_cert=tls.client_cert, client_key=tls.client_key)
    settings.addresses  # noqa: B018 - refuse a malformed host now
    return settings


def proxy_network(given: str) -> str:
    """A trusted proxy's address or network, as uvicorn takes it; InvalidArgument for anything else."""
    try:
        return str(ipaddress.ip_network(given.strip(), strict=False))
    except ValueError:
        raise InvalidArgument(f"--trusted-proxy {given!r} is not an IP address or network (e.g. 10.0.0.5, 10.0.0.0/24)") from None


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="vipu-web")
@click.option("--listen-address", default="0.0.0.0", show_default=True, help="Address the dashboard listens on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8093, show_default=True, help="Port of the dashboard.")
@click.option("-H", "--api-host", default=DEFAULT_HOST, show_default=True, envvar="VIPU_CLI_API_HOST",
              help="vipu-server's host; replicas of a highly available controller as H1,H2.")
@click.option("--api-port", type=click.IntRange(1, 65535), default=8090, show_default=True, help="vipu-server's user end-point.")
@click.option("--admin-port", type=click.IntRange(1, 65535), default=8091, show_default=True, help="vipu-server's admin end-point.")
@click.option("--secure", is_flag=True,
              help="HTTPS with the server certificate of --tls-dir, a login with a user id and access key, and mutual TLS to "
                   "vipu-server with the client certificate there.")
@click.option("--tls-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DIRECTORY, show_default=True,
              help="The certificates vipu-server --init --secure made (server/, client/).")
@click.option("--trusted-proxy", "trusted_proxies", multiple=True, metavar="ADDRESS",
              help="A reverse proxy in front of the dashboard (an address or network) whose X-Forwarded-For is believed, so "
                   "that logins through it count by the browser's address; repeat for more. None by default.")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def main(listen_address, port, api_host, api_port, admin_port, secure, tls_dir, trusted_proxies, log_level):
    """Serve the dashboard: the racks, the cabling, the partitions and the cluster tests of one
    vipu-server, live, read through its public API."""
    try:
        import uvicorn

        from vipu.web.app import create_app
        from vipu.web.connections import GuardedH11Protocol
        from vipu.web.sessions import Sessions
    except ImportError as missing:
        click.echo(f"vipu-web: the dashboard needs vipu's web extra ({missing.name} is missing): pip install 'vipu[web]'", err=True)
        sys.exit(2)

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tls = TlsFiles(tls_dir)
    try:
        settings = controller_settings(api_host, api_port, secure, tls)
        proof = forwarding_proof(tls) if secure else ""  # the server key, which HTTPS needs too
        proxies = [proxy_network(given) for given in trusted_proxies]
        listening = listening_socket(listen_address, port)
    except VipuError as error:
        click.echo(f"vipu-web: {error.message}", err=True)
        sys.exit(2)
    sessions = Sessions(settings, admin_port, secure, proof)
    app = create_app(sessions, ", ".join(settings.addresses))
    # A login's address is the socket's, or what a trusted proxy says; never an X-Forwarded-For anyone may send.
    server = uvicorn.Server(uvicorn.Config(app, host=listen_address, port=port, log_level="warning", access_log=False,
                                           http=GuardedH11Protocol,  # idle and slow connections bounded (vipu.web.connections)
                                           proxy_headers=bool(proxies), forwarded_allow_ips=proxies or None,
                                           timeout_graceful_shutdown=2, ssl_certfile=str(tls.server_cert) if secure else None,
                                           ssl_keyfile=str(tls.server_key) if secure else None))
    logging.getLogger("vipu.web").info("vipu-web %s for vipu-server at %s: %s://%s:%d/", __version__, ", ".join(settings.addresses),
                                       "https" if secure else "http", listen_address, port)
    try:
        server.run(sockets=[listening])
    except KeyboardInterrupt:  # uvicorn stopped on Ctrl-C and raised it again: a stop asked for, said in no more words
        pass
    finally:
        sessions.close()
