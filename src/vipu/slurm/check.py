"""`vipu-slurm-check`: checks a vipu.conf and that its controller answers."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from vipu.client.user import UserClient
from vipu.model.errors import VipuError, one_line
from vipu.slurm import config as slurm_config


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("path", required=False, type=click.Path(path_type=Path))
def check(path):
    """Check a vipu.conf (default: beside slurm.conf) and that its controller answers."""
    try:
        loaded = slurm_config.load(path)
        with UserClient(loaded.client_settings(), loaded.api_timeout) as user:
            version = user.version()
    except VipuError as error:
        click.echo(f"vipu-slurm-check ({path or 'vipu.conf'}): failed: {one_line(error.message)}", err=True)
        sys.exit(1)
    click.echo(f"{loaded.path}: vipu-server {version} at {loaded.api_host}:{loaded.api_port} answers; "
               f"IPUoF files go to {loaded.ipuof_dir}")
