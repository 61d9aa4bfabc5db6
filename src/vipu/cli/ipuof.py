"""`vipu-ipuof`: prove a partition works by running the test program on all of its IPUs.

    vipu-ipuof run --partition p1          # its files in ~/.ipuof.conf.d (or --ipuof-dir)
    vipu-ipuof run /path/p1_ipuof.conf     # or name the files
    IPUOF_CONFIG_PATH=/path/p1_ipuof.conf vipu-ipuof run
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from vipu.cli.common import CONTEXT, CommandGroup, ipuof_dir_option, reporting, run
from vipu.ipuof import client as ipuof_client
from vipu.ipuof import files as ipuof_files
from vipu.model.errors import InvalidArgument


@click.group(cls=CommandGroup, context_settings=CONTEXT)
def cli():
    """An IPUoF client for vipu partitions."""


@cli.command("run")
@click.argument("configs", nargs=-1, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--partition", "partition_id", default=None, help="Use this partition's IPUoF files.")
@ipuof_dir_option
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=1, show_default=True, help="Seed of the test program.")
@click.option("--timeout", type=float, default=30.0, show_default=True, help="Seconds to wait for each IPU.")
def run_program(configs, partition_id, ipuof_dir, seed, timeout):
    """Attach to every IPU of a partition and run the test program on each."""
    subject = partition_id or (configs[0].name if configs else os.environ.get("IPUOF_CONFIG_PATH", "?"))
    client = ipuof_client.Client(timeout)
    with reporting("run", subject):
        if partition_id and configs:
            raise InvalidArgument("name the partition or its files, not both")
        if partition_id:
            paths = ipuof_client.files_of(partition_id, ipuof_dir or ipuof_files.default_dir())
        elif configs:
            paths = list(configs)
        elif os.environ.get("IPUOF_CONFIG_PATH"):
            paths = [Path(os.environ["IPUOF_CONFIG_PATH"])]
        else:
            raise InvalidArgument("name a partition (--partition), its IPUoF files, or set IPUOF_CONFIG_PATH")
        gcds = [ipuof_client.read(path) for path in paths]
        partitions = {gcd.partition_id for gcd in gcds}
        if len(partitions) > 1:
            raise InvalidArgument(f"the files belong to several partitions: {', '.join(sorted(partitions))}")
        ipus = client.run(gcds, seed)
        client.close()
    click.echo(f"run ({gcds[0].partition_id}): success. {ipus} IPUs in {len(gcds)} GCD(s) ran the test program.")


def main() -> None:
    run(cli, "vipu-ipuof")
