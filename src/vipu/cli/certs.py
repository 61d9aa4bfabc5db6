"""`vipu-certs`: more certificates from a site's agent-link authority.

`vipu-server --tls-init` makes the site's authorities, one certificate for every agent and one for
the controller. These commands issue the others a site needs, from the TLS directory that holds
the agent-link authority's key:

    vipu-certs agent m01 --hosts m01.rack1,10.1.0.11 --out /etc/vipu-agent
    vipu-certs controller tenant-a --out tenant-a-certs/controller

An agent's certificate covers only the names and addresses it is reached by. A controller's
name is what agents know it by: a machine held by `tenant-a` obeys that controller only.
"""

from __future__ import annotations

from pathlib import Path

import click

from vipu.api.tls import DEFAULT_DAYS, DEFAULT_DIRECTORY, TlsFiles, issue_link_certificate
from vipu.cli.common import CONTEXT, CommandGroup, reporting, run
from vipu.model.entities import check_id

tls_dir_option = click.option("--tls-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DIRECTORY,
                              show_default=True, help="The site's TLS directory, made by vipu-server --tls-init.")
days_option = click.option("--days", type=click.IntRange(1, 3650), default=DEFAULT_DAYS, show_default=True,
                           help="Days the certificate is valid.")


@click.group(cls=CommandGroup, context_settings=CONTEXT)
def cli():
    """Certificates from a site's agent-link authority, for agents and controllers."""


def issue_certificate(kind: str, name: str, out: Path | None, tls_dir: Path, days: int, hosts: str | None = None) -> None:
    with reporting(f"issue {kind} certificate", name):
        check_id(f"{kind} certificate", name)
        out = out or tls_dir / f"{kind}s-{name}"
        host_list = [h.strip() for h in hosts.split(",") if h.strip()] if hosts is not None else None
        issue_link_certificate(TlsFiles(tls_dir), name, out, hosts=host_list, days=days)
    click.echo(f"issue {kind} certificate ({name}): success. Written to {out}.")


@cli.command("agent")
@click.argument("name")
@click.option("--hosts", required=True, help="Names and addresses the controller reaches the agent by: H1,H2,...")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory to write agent.pem, agent-key.pem and ca.pem to (the agent's --tls-dir). "
                   "Default: agents-NAME in the TLS directory.")
@tls_dir_option
@days_option
def agent(name, hosts, out, tls_dir, days):
    """Issue a certificate for one agent."""
    issue_certificate("agent", name, out, tls_dir, days, hosts)


@cli.command("controller")
@click.argument("name")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory to write controller.pem, controller-key.pem and ca.pem to (the controller/ directory of "
                   "that controller's TLS directory). Default: controllers-NAME in the TLS directory.")
@tls_dir_option
@days_option
def controller(name, out, tls_dir, days):
    """Issue a certificate for another controller of the site (a tenant's, say); agents know it by NAME."""
    issue_certificate("controller", name, out, tls_dir, days)


def main() -> None:
    run(cli, "vipu-certs")
