"""`vipu-ipuof`: prove a partition works by running the test program on all of its IPUs, or keep
it attached, as a job using it would be (the controller does not move a partition while a client
is attached to it).

    vipu-ipuof run --partition p1          # its files in ~/.ipuof.conf.d (or --ipuof-dir)
    vipu-ipuof run /path/p1_ipuof.conf     # or name the files
    IPUOF_CONFIG_PATH=/path/p1_ipuof.conf vipu-ipuof run
    IPUOF_VIPU_API_HOST=h IPUOF_VIPU_API_PARTITION_ID=p1 vipu-ipuof run   # asks vipu-server, as Poplar does
    vipu-ipuof attach p1 --hold 600        # attached for 10 minutes, or until Ctrl-C

Files out of date (the partition moved to other IPUs, `vipu reset partition --relocate` or a
relocatable partition's machine failing) are read again from vipu-server when the run fails on
them, rewritten in place, and the run made again: vipu-server is found from IPUOF_VIPU_API_HOST
and IPUOF_VIPU_API_PORT, else as `vipu` finds it (VIPU_CLI_API_HOST, its configuration file).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click

from vipu.backends.base import MAX_HOLD_SECONDS
from vipu.cli.common import CONTEXT, CommandGroup, ipuof_dir_option, reporting, run
from vipu.client.settings import ClientSettings
from vipu.client.user import UserClient
from vipu.ipuof import client as ipuof_client
from vipu.ipuof import files as ipuof_files
from vipu.model.errors import InvalidArgument, VipuError


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
    subject = partition_id or (configs[0].name if configs else os.environ.get("IPUOF_CONFIG_PATH")
                                                           or os.environ.get("IPUOF_VIPU_API_PARTITION_ID", "?"))
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
        elif os.environ.get("IPUOF_VIPU_API_PARTITION_ID"):
            paths = []
        else:
            raise InvalidArgument("name a partition (--partition), its IPUoF files, or set IPUOF_CONFIG_PATH "
                                  "or IPUOF_VIPU_API_HOST and IPUOF_VIPU_API_PARTITION_ID")
        gcds = [ipuof_client.read(path) for path in paths] if paths else _from_controller(os.environ)
        partitions = {gcd.partition_id for gcd in gcds}
        if len(partitions) > 1:
            raise InvalidArgument(f"the files belong to several partitions: {', '.join(sorted(partitions))}")
        rewritten = ""
        try:
            ipus = client.run(gcds, seed)
        except VipuError:
            fresh = _read_again(gcds, os.environ, timeout) if paths else None
            if fresh is None:
                raise
            gcds, rewritten = fresh
            ipus = client.run(gcds, seed)
        client.close()
    click.echo(f"run ({gcds[0].partition_id}): success. {ipus} IPUs in {len(gcds)} GCD(s) ran the test program{rewritten}.")


@cli.command("attach")
@click.argument("partition_id")
@ipuof_dir_option
@click.option("--hold", "hold_seconds", type=click.FloatRange(0, MAX_HOLD_SECONDS, min_open=True), required=True,
              metavar="SECONDS", help="How long to stay attached.")
@click.option("--timeout", type=click.FloatRange(0, min_open=True), default=30.0, show_default=True,
              help="Seconds to wait for each IPU.")
def attach(partition_id, ipuof_dir, hold_seconds, timeout):
    """Attach to every IPU of a partition and stay attached for --hold seconds, then detach; Ctrl-C
    (or SIGTERM) detaches sooner. Killed outright, the attachments lapse at the end of the hold."""
    client = ipuof_client.Client(timeout)
    with reporting("attach", partition_id):
        if not partition_id:
            raise InvalidArgument("name a partition")
        gcds = [ipuof_client.read(path) for path in ipuof_client.files_of(partition_id, ipuof_dir or ipuof_files.default_dir())]
        foreign = sorted({gcd.partition_id for gcd in gcds} - {partition_id})
        if foreign:
            raise InvalidArgument(f"its IPUoF files name partition {', '.join(foreign)}, not {partition_id}")
        ipus = client.attach(gcds, hold_seconds)
    ends = time.monotonic() + hold_seconds
    click.echo(f"attach ({partition_id}): success. {ipus} IPUs in {len(gcds)} GCD(s) attached for {hold_seconds:g} s; "
               "Ctrl-C detaches them sooner.")
    sys.stdout.flush()  # for whoever waits on this line through a pipe
    cut_short = ""
    try:
        while (left := ends - time.monotonic()) > 0:
            time.sleep(left)
    except KeyboardInterrupt:
        cut_short = " before the hold ended"
    with reporting("detach", partition_id):
        client.detach(gcds)
    client.close()
    click.echo(f"detach ({partition_id}): success. {ipus} IPUs detached{cut_short}.")


def _read_again(gcds: list[ipuof_client.GcdFile], env, timeout: float) -> tuple[list[ipuof_client.GcdFile], str] | None:
    """The partition's configuration from vipu-server, if it differs from its files', with the
    files rewritten from it, and what to say of them; None if it does not differ, or vipu-server
    cannot say (the run's own failure is then the answer). Files that cannot be rewritten (their
    directory not writable, say) do not stop the run on the fresh configuration."""
    partition_id = gcds[0].partition_id
    port = env.get("IPUOF_VIPU_API_PORT", "")
    try:
        with UserClient.connect(env.get("IPUOF_VIPU_API_HOST") or None, int(port) if port.isdigit() else None,
                                timeout=timeout) as user:
            config = user.ipuof_config(partition_id)
    except VipuError:
        return None
    current = {int(g.attributes.get("GCD Id", n)): g for n, g in enumerate(config.gcd_configs)}
    fresh = []
    for old in gcds:
        gcd = current.get(old.gcd_id)
        if gcd is None:
            return None
        fresh.append(ipuof_client.parse(ipuof_files.document(gcd), str(old.path), old.path))
    if [g.devices for g in fresh] == [g.devices for g in gcds]:
        return None
    try:
        for old in gcds:
            ipuof_files.write_gcd(old.path, current[old.gcd_id])
    except OSError as error:
        return fresh, (f"; its IPUoF files are out of date (it moved) and could not be rewritten ({error.strerror}), "
                       "so it ran on vipu-server's configuration")
    return fresh, "; its IPUoF files were out of date (it moved) and are rewritten"


def _from_controller(env) -> list[ipuof_client.GcdFile]:
    """The partition's configuration from vipu-server, as the IPUOF_VIPU_API_* variables say."""
    partition_id = env["IPUOF_VIPU_API_PARTITION_ID"]
    host = env.get("IPUOF_VIPU_API_HOST") or "localhost"
    port, gcd, timeout = (env.get(name, default) for name, default in (
        ("IPUOF_VIPU_API_PORT", "8090"), ("IPUOF_VIPU_API_GCD_ID", ""), ("IPUOF_VIPU_API_TIMEOUT", "50")))
    if not port.isdigit() or not (gcd == "" or gcd.isdigit()) or not timeout.replace(".", "", 1).isdigit():
        raise InvalidArgument(f"IPUOF_VIPU_API_PORT ({port!r}), IPUOF_VIPU_API_GCD_ID ({gcd!r}) and "
                              f"IPUOF_VIPU_API_TIMEOUT ({timeout!r}) must be numbers")
    with UserClient(ClientSettings(host=host, port=int(port)), float(timeout)) as user:
        config = user.ipuof_config(partition_id)
        where = user.connection.address
    gcds = [ipuof_client.parse(ipuof_files.document(g), f"GCD {n} of partition {partition_id} from {where}")
            for n, g in enumerate(config.gcd_configs)]
    if gcd:
        gcds = [g for g in gcds if g.gcd_id == int(gcd)]
        if not gcds:
            raise InvalidArgument(f"partition {partition_id} has no GCD {gcd}")
    return gcds


def main() -> None:
    run(cli, "vipu-ipuof")
