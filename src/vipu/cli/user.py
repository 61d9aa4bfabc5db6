"""`vipu`: the user's client of the user end-point (default port 8090)."""

from __future__ import annotations

import math
import sys
import typing
from datetime import UTC
from pathlib import Path

import click
from click.core import ParameterSource

from vipu.cli.common import (
    CONTEXT,
    CommandGroup,
    cancel_request_command,
    capacity_command,
    connection_options,
    echo_json,
    given,
    ipuof_dir_option,
    json_option,
    lazy_module,
    open_client,
    pass_client,
    render_pairs,
    render_table,
    reporting,
    requests_command,
    reservations_command,
    run,
    split_list,
    succeed,
)
from vipu.client.settings import client_settings
from vipu.model import times
from vipu.model.errors import InvalidArgument, VipuError
from vipu.model.waiting import MAX_WAIT_SECONDS

if typing.TYPE_CHECKING:
    from vipu.api.protos import vipuuser_pb2 as pb
    from vipu.client import user as user_client
    from vipu.client.user import UserClient
    from vipu.ipuof import files as ipuof_files
    from vipu.model import ipuof_attributes
else:  # imported when first used: `vipu --help` and a usage mistake need none of them (bench.cli_speed)
    pb = lazy_module("vipu.api.protos.vipuuser_pb2")
    user_client = lazy_module("vipu.client.user")
    ipuof_files = lazy_module("vipu.ipuof.files")
    ipuof_attributes = lazy_module("vipu.model.ipuof_attributes")

# The API's enumerations by the names the command line takes.
SYNC_TYPES = {"c2-compatible": "ST_GS2_DEFAULT", "c2-independent-rails": "ST_GS2_INDEPENDENT_RAILS",
              "pod-native-default": "ST_POD_NATIVE_DEFAULT", "pod-native-replicated-pipeline": "ST_POD_NATIVE_REPLICATED_PIPELINE"}
COUNT = click.IntRange(0, 2**32 - 1)  # what a uint32 field can carry; the server judges the value
IPULINK_ROUTINGS = {"dnc": "IRT_DNC", "swnc": "IRT_SWNC", "btnc": "IRT_BTNC", "ringswnc": "IRT_RINGSWNC"}
DEFAULT_WAIT_SECONDS = 3600


def sync_name(number: int) -> str:
    return next((name for name, constant in SYNC_TYPES.items() if getattr(pb, constant) == number), "-")


def ild_routing(value: int) -> str:
    return pb.IpuLinkRoutingType.Name(value).removeprefix("IRT_") if value else "DEFAULT"


def gw_routing(value: int) -> str:
    return pb.GatewayRoutingType.Name(value).removeprefix("GRT_") if value else "DEFAULT"


def ready_state(value: int) -> str:
    return pb.PartitionReadyState.Name(value).removeprefix("PS_")


class Duration(click.ParamType):
    """A duration option: its value in seconds (`times.parse_duration`)."""

    name = "duration"

    def convert(self, value, param, ctx) -> int:
        if isinstance(value, int):
            return value
        try:
            return times.parse_duration(str(value))
        except ValueError as error:
            self.fail(str(error), param, ctx)


def expected_end(partition: pb.Partition, status: pb.PartitionStatus) -> str:
    """When a partition is expected to end, from its start and expected duration; "-" if unknown."""
    end = times.expected_end(partition.created.ToDatetime(tzinfo=UTC) if partition.HasField("created") else None,
                             status.expected_seconds)
    return "-" if end is None else f"{times.utc_text(end)} ({times.duration_text(status.expected_seconds)} after its start)"




@click.group(cls=CommandGroup, context_settings=CONTEXT, invoke_without_command=True)
@connection_options(default_port=8090)
@click.version_option(package_name="vipu", prog_name="vipu")
@click.pass_context
def cli(ctx, api_timeout, server_version, **options):
    """Request and release IPU partitions from a V-IPU controller."""
    with reporting("vipu"):
        settings = client_settings(given(options))
    open_client(ctx, lambda: user_client.UserClient(settings, api_timeout), server_version)


@cli.group(cls=CommandGroup)
def create():
    """Create a partition."""


@cli.group(name="list", cls=CommandGroup)
def list_():
    """List partitions, allocations or IPU attributes."""


@cli.group(cls=CommandGroup)
def get():
    """Show a partition."""


@cli.group(cls=CommandGroup)
def remove():
    """Remove a partition, or cancel a request waiting for room."""


@cli.group(cls=CommandGroup)
def reset():
    """Reset a partition."""


@cli.group(cls=CommandGroup)
def update():
    """Change a partition."""


def write_ipuof_files(user: UserClient, config: pb.PartitionConfig, partition_id: str, directory: Path) -> list[Path]:
    """Write a new partition's IPUoF files; if they cannot be written, remove the partition again."""
    try:
        return ipuof_files.write(directory, partition_id, config)
    except OSError as error:
        user.remove_partition(partition_id)
        raise InvalidArgument(
            f"cannot write its IPUoF configuration to {directory}: {error.strerror}; the partition was removed again"
        ) from error


@create.command("partition")
@click.argument("partition_id")
@click.option("--size", type=COUNT, required=True, help="Number of IPUs, a power of two.")
@click.option("--num-gcds", type=COUNT, default=1, show_default=True, help="Graph compilation domains to split the partition into.")
@click.option("--num-replicas", type=COUNT, default=0, help="Total model replicas. Default: one per GCD.")
@click.option("--allocation", "allocation_id", default="", help="Take the IPUs from this allocation.")
@click.option("--cluster", "cluster_id", default="", help="Take the IPUs from an allocation of this cluster.")
@click.option("--reconfigurable", is_flag=True, help="Make the partition fabric-reconfigurable (c2-compatible sync).")
@click.option("--sync-type", type=click.Choice(sorted(SYNC_TYPES)), default=None, help="Global sync configuration.")
@click.option("--ipulink-routing", type=click.Choice(sorted(IPULINK_ROUTINGS)), default=None,
              help="IPU-Link routing. Default: chosen from the partition's shape.")
@click.option("--num-ipulinkdomains", "num_segments", type=COUNT, default=0,
              help="IPU-Link domains to span (over GW-Links). Default: one when it fits.")
@click.option("--index", type=COUNT, default=None,
              help="With --reconfigurable: place the partition at this index, the index-th run of SIZE IPUs of its allocation "
                   "(its machines in order); the sync type is then c2-compatible.")
@click.option("--disable-auto-reset", is_flag=True, help="Do not reset the partition automatically after errors.")
@click.option("--keep-on-error", is_flag=True,
              help="If an agent fails, keep the partition in ERROR, holding its IPUs, for inspection. Default: leave nothing.")
@click.option("--relocatable", is_flag=True,
              help="Move the partition to other IPUs of its allocation, keeping its id, when its machines fail.")
@click.option("--may-move", is_flag=True,
              help="Consent that compaction moves the partition even while IPUoF clients are attached (vipu update partition "
                   "changes it later).")
@click.option("--expected-duration", "expected_seconds", type=Duration(), default=None, metavar="DURATION",
              help="How long the partition is expected to run from its start: 90s, 30m, 2h, 1d. Default: unknown.")
@click.option("--reservation", default="", help="Make the partition in this reservation (vipu list reservations), one of whose "
              "users you are.")
@click.option("--account", default="", help="Make the partition on this account (vipu-admin list accounts), one of whose users you "
              "are. Default: your only account.")
@click.option("--preemptible", is_flag=True,
              help="Let the partition be reclaimed (removed after a notice) while your account runs it on quota borrowed from "
                   "another account of its cohort that asks for it back.")
@click.option("--wait", is_flag=True, help="If there is no room now, wait in the allocation's queue until the partition starts.")
@click.option("--timeout", type=click.IntRange(1, MAX_WAIT_SECONDS), default=DEFAULT_WAIT_SECONDS, show_default=True,
              help="With --wait: give up after this many seconds, saying why it waited.")
@ipuof_dir_option
@pass_client
def create_partition(user, partition_id, size, num_gcds, num_replicas, allocation_id, cluster_id, reconfigurable,
                     sync_type, ipulink_routing, num_segments, index, disable_auto_reset, keep_on_error, relocatable, may_move,
                     expected_seconds, reservation, account, preemptible, wait, timeout, ipuof_dir):
    """Create a partition and write its IPUoF configuration."""
    if allocation_id and cluster_id:
        raise click.UsageError("give --allocation or --cluster, not both")
    if not wait and click.get_current_context().get_parameter_source("timeout") is ParameterSource.COMMANDLINE:
        raise click.UsageError("--timeout needs --wait")
    with reporting("create partition", partition_id):
        config = user.create_partition(  # interrupted while it waits, the request is withdrawn
            partition_id, size, num_gcds=num_gcds, num_replicas=num_replicas, cluster_id=cluster_id,
            allocation_id=allocation_id, reconfigurable=reconfigurable,
            sync_type=getattr(pb, SYNC_TYPES[sync_type]) if sync_type else pb.ST_UNDEFINED,
            ipulink_routing=getattr(pb, IPULINK_ROUTINGS[ipulink_routing]) if ipulink_routing else pb.IRT_UNDEFINED,
            num_ipulink_segments=num_segments, disable_auto_reset=disable_auto_reset, keep_on_error=keep_on_error,
            index=index, relocatable=relocatable, may_move=may_move, expected_seconds=expected_seconds or 0,
            reservation=reservation, account=account, preemptible=preemptible, wait=timeout if wait else 0,
            on_wait=_say_where_it_waits)
        write_ipuof_files(user, config, partition_id, ipuof_dir or ipuof_files.default_dir())
    succeed("create partition", partition_id)


def _say_where_it_waits(queued: pb.QueuedRequest) -> None:
    """On a terminal, a line on standard error each time a waiting request's place or reason changes."""
    if sys.stderr.isatty():
        click.echo(f"waiting ({queued.partition_id}): number {queued.position} in allocation {queued.allocation_id}'s queue: "
                   f"{queued.reason}", err=True)


@remove.command("partition")
@click.argument("partition_id")
@click.option("--force", is_flag=True, help="Forget the partition even if its agents cannot be cleared.")
@ipuof_dir_option
@pass_client
def remove_partition(user, partition_id, force, ipuof_dir):
    """Remove a partition and delete its IPUoF configuration."""
    directory = ipuof_dir or ipuof_files.default_dir()
    with reporting("remove partition", partition_id):
        key = own_attach_key(user, directory, partition_id)
        uncleared = user.remove_partition(partition_id, force=force)
        try:
            ipuof_files.remove(directory, partition_id, key)
        except OSError as error:
            raise InvalidArgument(f"the partition is removed, but not its IPUoF files in {directory}: {error.strerror}") from error
    succeed("remove partition", partition_id)
    if uncleared:
        click.echo(f"remove partition ({partition_id}): warning: agent(s) {', '.join(uncleared)} did not confirm the clear; "
                   "their IPUs stay out of use until the controller sees them cleared.", err=True)


def own_attach_key(user: UserClient, directory: Path, partition_id: str) -> str | None:
    """In the shared system directory, where another controller's partition of the same id may
    have its files, the attach key of this controller's partition (whose files alone go); None
    elsewhere: a partition's files there are its own."""
    if not ipuof_files.shared(directory) or not ipuof_files.present(directory, partition_id):
        return None
    try:
        return user.ipuof_config(partition_id).gcd_configs[0].attributes.get(ipuof_attributes.ATTACH_KEY_ATTRIBUTE, "")
    except VipuError:
        return ""  # not this controller's to tell: its removal says why, and no file goes


@reset.command("partition")
@click.argument("partition_id")
@click.option("--relocate", is_flag=True,
              help="Move it to other IPUs of its allocation, off the machines that failed it (or all of its own), "
                   "and rewrite its IPUoF configuration.")
@ipuof_dir_option
@pass_client
def reset_partition(user, partition_id, relocate, ipuof_dir):
    """Reset a partition: clear and re-apply its configuration."""
    with reporting("reset partition", partition_id):
        user.reset_partition(partition_id, relocate=relocate)
        if relocate:
            directory = ipuof_dir or ipuof_files.default_dir()
            try:
                config = user.ipuof_config(partition_id)
                ipuof_files.remove(directory, partition_id, config.gcd_configs[0].attributes.get(ipuof_attributes.ATTACH_KEY_ATTRIBUTE))
                ipuof_files.write(directory, partition_id, config)
            except OSError as error:
                raise InvalidArgument(f"the partition moved, but its IPUoF files in {directory} could not be rewritten: "
                                      f"{error.strerror}") from error
    succeed("reset partition", partition_id)


@update.command("partition")
@click.argument("partition_id")
@click.option("--may-move/--no-may-move", default=None,
              help="Consent, or no longer, that compaction moves the partition even while IPUoF clients are attached.")
@pass_client
def update_partition(user, partition_id, may_move):
    """Change a partition of yours: its consent to be moved while attached."""
    if may_move is None:
        raise click.UsageError("nothing to change: give --may-move or --no-may-move")
    with reporting("update partition", partition_id):
        user.update_partition(partition_id, may_move=may_move)
    succeed("update partition", partition_id)


@list_.command("partitions")
@click.option("--allocation", "allocation_id", default="", help="Only the partitions of this allocation.")
@json_option
@pass_client
def list_partitions(user, allocation_id, as_json):
    """List the partitions."""
    with reporting("list partitions"):
        partitions = user.list_partitions(allocation_id)
    if as_json:
        return echo_json({"partitions": partitions})
    rows = [
        [p.id, p.spec.cluster_id, str(p.spec.num_ipulink_segments), gw_routing(p.spec.gw_routing_type),
         ild_routing(p.spec.ipulink_routing_type), str(len(p.spec.ipus)), str(p.spec.num_gcds), ready_state(p.ready_state)]
        for p in partitions
    ]
    click.echo(render_table(["Partition", "Cluster", "ILDs", "GW Routing", "ILD Routing", "Size", "GCDs", "State"], rows))


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float]) -> str:
    """Percentages as a line of bars, one per value ("·" where none was read)."""
    return "".join("·" if math.isnan(v) else SPARKS[min(len(SPARKS) - 1, int(v / 100 * len(SPARKS)))] for v in values)


def _reading(message, field: str, form: str) -> str:
    return form.format(getattr(message, field)) if message.HasField(field) else "-"


def show_telemetry(user, partition_id: str, as_json: bool) -> None:
    with reporting("get partition", partition_id):
        reply = user.partition_telemetry(partition_id)
    if as_json:
        return echo_json(reply)
    rows = [[ipu.agent_id, str(ipu.index), str(ipu.routing_id), _reading(ipu, "utilisation", "{:.0f}"),
             _reading(ipu, "temperature", "{:.1f}"), _reading(ipu, "power", "{:.0f}"), _reading(ipu, "clock_mhz", "{:.0f}"),
             f"{ipu.memory_used / 2**20:.0f}" if ipu.HasField("memory_used") else "-",
             _reading(ipu, "ecc_errors", "{}"), _reading(ipu, "age_seconds", "{:.1f}")] for ipu in reply.ipus]
    click.echo(render_table(["Agent", "IPU", "Routing ID", "Util %", "Temp °C", "Power W", "Clock MHz", "Memory MiB", "ECC Errors",
                             "Age s"], rows))
    if not reply.history:
        click.echo("Utilisation over its life: not collected yet")
        return
    means = [sum(v for v in s.utilisation if not math.isnan(v)) / max(1, sum(1 for v in s.utilisation if not math.isnan(v)))
             if any(not math.isnan(v) for v in s.utilisation) else math.nan for s in reply.history]
    first, last = reply.history[0].at, reply.history[-1].at
    click.echo(f"Utilisation over its life ({times.utc_text(first)} to {times.utc_text(last)}, mean of its IPUs, 0 to 100 %):")
    click.echo(sparkline(means))


@get.command("partition")
@click.argument("partition_id")
@click.option("--ipu-configs", is_flag=True, help="Print the IPUoF configuration as JSON.")
@click.option("--gcd", type=COUNT, default=None, help="Only this GCD's IPUoF configuration.")
@click.option("--telemetry", is_flag=True, help="What its IPUs measure now, and their utilisation over its life.")
@json_option
@pass_client
def get_partition(user, partition_id, ipu_configs, gcd, telemetry, as_json):
    """Show a partition: its shape, state and IPUs, its IPUoF configuration, or its telemetry."""
    if telemetry:
        return show_telemetry(user, partition_id, as_json)
    with reporting("get partition", partition_id):
        if ipu_configs:
            config = user.ipuof_config(partition_id, gcd)
        else:
            status = user.partition_status(partition_id)  # first: its refusal says why another's partition is not shown
            partition = user.get_partition(partition_id)
    if ipu_configs:
        numbered = [(gcd if gcd is not None else index, ipuof_files.document(c)) for index, c in enumerate(config.gcd_configs)]
        if as_json:  # one JSON document, nothing around it
            return echo_json([{"gcd": number, "ipuof_config": document} for number, document in numbered])
        for number, document in numbered:
            click.echo(f"IPUoF configuration of partition {partition_id}, GCD {number}:")
            echo_json(document)
        return
    if as_json:
        return echo_json({"partition": partition, "status": status})
    spec = partition.spec
    click.echo(render_pairs([
        ("Partition ID", partition.id),
        ("Cluster", spec.cluster_id),
        ("Allocation", spec.allocation_id),
        ("Size", str(len(spec.ipus))),
        ("GCDs", str(spec.num_gcds)),
        ("Replicas", str(spec.num_replicas)),
        ("ILDs", str(spec.num_ipulink_segments)),
        ("ILD Routing", ild_routing(spec.ipulink_routing_type)),
        ("GW Routing", gw_routing(spec.gw_routing_type)),
        ("Sync Type", sync_name(spec.sync_type)),
        ("Reconfigurable", "yes" if spec.reconfigurable else "no"),
        ("State", ready_state(status.ready_state)),
        ("Operation", pb.PartitionOperationState.Name(status.operation_state).removeprefix("POS_")),
        ("Auto-reset Retries", f"{status.auto_reset_retry_count}/{status.max_auto_reset_retries}"),
        ("Last Auto-reset", times.utc_text(status.last_auto_reset_time.ToDatetime() if status.HasField("last_auto_reset_time") else None)),
        ("Power Cycled", times.utc_text(status.last_power_cycle_time.ToDatetime() if status.HasField("last_power_cycle_time") else None)),
        ("Relocatable", "yes" if status.relocatable else "no"),
        ("May move", "yes" if status.may_move else "no"),
        ("Expected end", expected_end(partition, status)),
        ("Reservation", status.reservation or "-"),
        ("Account", (status.account + (" (preemptible)" if status.preemptible else "")) if status.account else "-"),
        ("Relocated", status.relocation or "-"),
        ("Placement", status.placement_note or "-"),
        ("Links", list(status.link_warnings) or "-"),
        *((("Drain", list(status.drain_notices)),) if status.drain_notices else ()),
        ("Errors", list(status.errors) or "-"),
    ]))
    rows = [[str(i.routing_id), str(i.routing_id // (len(spec.ipus) // spec.num_gcds)), i.agent_id, str(i.agent_ipu_index),
             str(i.ipulink_domain_topology_id), str(i.topology_id)] for i in spec.ipus]
    click.echo(render_table(["Routing ID", "GCD", "Agent", "IPU", "ILD", "Topology ID"], rows))


@list_.command("allocations")
@json_option
@pass_client
def list_allocations(user, as_json):
    """List the allocations you can create partitions in."""
    with reporting("list allocations"):
        allocations = user.list_allocations()
    if as_json:
        return echo_json({"allocations": allocations})
    click.echo(render_table(["Allocation ID", "Agents"], [[a.id, " ".join(a.spec.agent_ids)] for a in allocations]))


@list_.command("ipu-attrs")
@click.option("--agents", default=None, help="Only these agents: ag1,ag2,...")
@json_option
@pass_client
def list_ipu_attrs(user, agents, as_json):
    """List the attributes of the IPUs you can use."""
    with reporting("list ipu-attrs"):
        entries = user.ipu_attributes(split_list(agents))
    if as_json:
        return echo_json({"entries": entries})
    rows = []
    for entry in entries:
        for n, index in enumerate(sorted(entry.ipu_attributes)):
            attributes = entry.ipu_attributes[index].attributes
            names = sorted(attributes)
            rows.append([entry.agent if n == 0 else "", str(index), names, [attributes[k] for k in names]])
    click.echo(render_table(["Agent", "IPU", "Attribute", "Value"], rows, top_rule=False))


capacity_command(list_)
requests_command(list_)
reservations_command(list_)
cancel_request_command(remove, "your own, or anyone's for an administrator")


def main() -> None:
    run(cli, "vipu")
