"""`vipu-admin`: the administrator's client of the admin end-point (default port 8091)."""

from __future__ import annotations

import sys
import time
import typing
from datetime import UTC, datetime
from pathlib import Path

import click

from vipu.api.atomic import write_text_for_readers
from vipu.api.convert import account_from_proto, account_uses_from_proto, cluster_from_proto, drain_from_proto, reservation_from_proto
from vipu.cli.common import (
    CONTEXT,
    CommandGroup,
    cancel_request_command,
    capacity_command,
    connection_options,
    echo_json,
    fail,
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
from vipu.client.admin import by_time
from vipu.client.admin import since_time as client_since_time
from vipu.client.settings import ClientSettings, client_settings, write_client_config
from vipu.model import slurm_topology
from vipu.model.accounts import account_lines
from vipu.model.errors import InvalidArgument, VipuError
from vipu.model.linkhealth import growth
from vipu.model.reasons import span
from vipu.model.times import utc_text
from vipu.model.topology import ClusterLayout

if typing.TYPE_CHECKING:
    from vipu.api.protos import admin_pb2 as pb
    from vipu.client import admin as admin_client
    from vipu.client.admin import AdminClient
    from vipu.ipuof import files as ipuof_files
    from vipu.model import entities
else:  # imported when first used, as in vipu's CLI: help and usage mistakes need none of them
    pb = lazy_module("vipu.api.protos.admin_pb2")
    admin_client = lazy_module("vipu.client.admin")
    ipuof_files = lazy_module("vipu.ipuof.files")
    entities = lazy_module("vipu.model.entities")

# The API's cluster topologies by the names the command line takes.
TOPOLOGIES = {"mesh": "ILD_TOPOLOGY_MESH", "torus": "ILD_TOPOLOGY_TORUS"}


def topology_name(number: int) -> str:
    return "torus" if number == pb.ILD_TOPOLOGY_TORUS else "mesh"  # unspecified is a mesh


def force_option(command):
    """--force, and where the IPUoF files of the partitions it removes are, to delete them too."""
    command = ipuof_dir_option(command)
    return click.option("--force", is_flag=True, help="Also remove everything that depends on it, and say what.")(command)


@click.group(cls=CommandGroup, context_settings=CONTEXT, invoke_without_command=True)
@connection_options(default_port=8091)
@click.version_option(package_name="vipu", prog_name="vipu-admin")
@click.pass_context
def cli(ctx, api_timeout, server_version, **options):
    """Administer a V-IPU controller: agents, clusters, allocations, users and cluster tests."""
    with reporting("vipu-admin"):
        settings = client_settings(given(options), port_key="api-admin-port", port_env="VIPU_ADMIN_API_PORT", default_port=8091)
    open_client(ctx, lambda: admin_client.AdminClient(settings, api_timeout), server_version)


@cli.group(cls=CommandGroup)
def create():
    """Create an agent, cluster, allocation or user."""


@cli.group(name="list", cls=CommandGroup)
def list_():
    """List agents, clusters, allocations or users."""


@cli.group(cls=CommandGroup)
def get():
    """Show one agent, cluster, allocation or user."""


@cli.group(cls=CommandGroup)
def remove():
    """Remove an agent, cluster, allocation or user."""


@cli.group(cls=CommandGroup)
def apply():
    """Apply a partition template to an allocation."""


def report_removal(kind: str, entity_id: str, removed: list[str], ipuof_dir: Path | None) -> None:
    """The success line and what went with it; the IPUoF files of the partitions that went are
    deleted from the IPUoF directory, as `vipu remove partition` deletes them."""
    succeed(f"remove {kind}", entity_id)
    if removed:
        click.echo(f"removed with it: {', '.join(removed)}")
    directory = ipuof_dir or ipuof_files.default_dir()
    for partition_id in (item.removeprefix("partition ") for item in removed if item.startswith("partition ")):
        try:
            ipuof_files.remove(directory, partition_id)
        except OSError as error:
            click.echo(f"the IPUoF files of partition {partition_id} in {directory} are left: {error.strerror}", err=True)


# Agents


@create.command("agent")
@click.argument("agent_id")
@click.option("--host", required=True, help="Host or IP address of the agent (the IPU-Gateway management interface).")
@click.option("--port", required=True, type=click.IntRange(1, 65535), help="Port the agent listens on.")
@click.option("--take-over", is_flag=True,
              help="Take the machine from the controller holding it (secure mode; the controller needs the site's "
                   "agent-link authority key). Its partitions there are cleared.")
@pass_client
def create_agent(admin, agent_id, host, port, take_over):
    """Register the agent of an IPU-Machine; in secure mode this controller then holds the machine."""
    with reporting("create agent", agent_id):
        admin.create_agent(agent_id, host, port, take_over=take_over)
    succeed("create agent", agent_id)


@list_.command("agents")
@json_option
@pass_client
def list_agents(admin, as_json):
    """List the agents."""
    with reporting("list agents"):
        agents = admin.list_agents()
    if as_json:
        return echo_json({"agents": agents})
    rows = [[a.id, a.host, str(a.port), a.status, a.cluster_id or "-", a.allocation_id or "-", _drain_text(a)] for a in agents]
    click.echo(render_table(["Agent ID", "Host", "Port", "Status", "Cluster", "Allocation", "Drain"], rows))


def _drain_text(agent) -> str:
    """An agent's drain as the model lists it (`Drain.listing`), or "-"."""
    return drain_from_proto(agent.drain).listing(agent.drain.partition_ids) if agent.HasField("drain") else "-"


def _version_label(component: str) -> str:
    words = component.replace("-", " ").replace("ipuof", "IPUoF").replace("ipum", "IPU-M").replace("bmc", "BMC").split()
    return " ".join(w if any(c.isupper() for c in w) else w.capitalize() for w in words) + " Version"


@get.command("agent")
@click.argument("agent_id")
@json_option
@pass_client
def get_agent(admin, agent_id, as_json):
    """Show an agent, its machine and which partition holds each IPU."""
    with reporting("get agent", agent_id):
        agent = admin.get_agent(agent_id)
    if as_json:
        return echo_json(agent)
    inv = agent.inventory
    exporter = f"http://{agent.host}:{inv.exporter_port}/metrics" if inv.exporter_port else "off"
    pairs = [
        ("Agent ID", agent.id),
        ("Host", agent.host),
        ("Port", str(agent.port)),
        ("Status", agent.status),
        ("Exporter", exporter),
        ("Platform", inv.platform),
        ("Manufacturer", inv.manufacturer),
        ("Discovery Mode", agent.discovery_mode),
        ("Backend", f"{inv.backend} {inv.backend_version}".strip()),
        *((_version_label(k), v) for k, v in sorted(inv.versions.items())),
        ("Board Serial Number", inv.machine_serial),
        ("Board Part Number", inv.board_part_number),
        ("IPUoF End-point", f"{inv.ipuof_host}:{inv.ipuof_port} (RDMA {inv.rdma_port})"),
        ("Num of IPUs", str(len(inv.ipus))),
        ("Cluster", agent.cluster_id or "-"),
        ("Allocation", agent.allocation_id or "-"),
    ]
    if agent.last_error:
        pairs.append(("Last Error", agent.last_error))
    if agent.HasField("drain"):
        pairs.append(("Drain", _drain_text(agent)))
    pairs.append(("Capabilities", ", ".join(inv.capabilities) or "fabric, diagnostics"))
    condition = agent.condition
    if condition.power_state:
        pairs.append(("Power", condition.power_state))
    if condition.health:
        failing = [f"{c.component} {c.health}" for c in condition.components if c.health != "OK"]
        pairs.append(("Health", condition.health + (f" ({', '.join(failing)})" if failing else "")))
    pairs += [(f"{component.kind.capitalize()} {component.id}",
               " ".join(part for part in (component.manufacturer, component.model, component.serial and f"serial {component.serial}",
                                          component.firmware and f"firmware {component.firmware}") if part))
              for component in inv.components]
    click.echo(render_pairs(pairs))
    chips = {ipu.index: ipu.chip_id for ipu in inv.ipus}
    rows = [
        [str(u.index), chips.get(u.index, ""), u.partition_id or "-", u.partition_state or "free",
         str(u.routing_id) if u.partition_id else "-", str(u.gcd_id) if u.partition_id else "-"]
        for u in agent.ipus
    ]
    click.echo(render_table(["IPU", "Chip ID", "Partition", "State", "Routing ID", "GCD"], rows))
    if inv.cables:
        click.echo(render_table(["Port", "Cable Serial", "Vendor", "Model"], [[c.port, c.serial, c.vendor, c.model] for c in inv.cables]))
    if condition.events:
        click.echo(render_table(["Event", "Component", "Severity", "What"],
                                [[_when(e.at), e.component, e.severity, e.message] for e in condition.events]))


@cli.command("power")
@click.argument("action", type=click.Choice(["on", "off", "cycle", "reset", "status"]))
@click.argument("kind", type=click.Choice(["agent"]))
@click.argument("agent_id")
@click.option("--force", is_flag=True, help="Even with ACTIVE partitions there: they fail, and are reset once the machine answers again.")
@json_option
@pass_client
def power(admin, action, kind, agent_id, force, as_json):
    """Power an agent's machine on, off, cycle or reset it, or show its power state.

    Needs a machine with the power capability (its BMC); other than on and status, refused while a
    partition is ACTIVE there unless --force."""
    with reporting(f"power {action} agent", agent_id):
        reply = admin.power_agent(agent_id, action, force)
    if as_json:
        return echo_json(reply)
    for partition_id in reply.failed_partitions:
        click.echo(f"partition {partition_id} failed; it is reset once agent {agent_id} answers again")
    click.echo(f"agent {agent_id}: power {reply.power_state}")


def _machines(admin, kind: str, names: tuple[str, ...]) -> list[str]:
    """The agents that `drain` and `resume` name: themselves, both ends of each link's cable, or each IPU-Link domain's."""
    if kind == "agent":
        return list(names)
    found = [agent for name in names for agent in (admin.machines_of_link(name) if kind == "link" else admin.machines_of_domain(name))]
    return list(dict.fromkeys(found))


def when(value: str, option: str, now: float | None = None) -> float:
    """A moment an option gives (`vipu.client.admin.by_time`: a time from now or a date and time),
    refused as a bad option value."""
    try:
        return by_time(value, now)
    except InvalidArgument as bad:
        raise click.BadParameter(bad.message, param_hint=option) from None


@cli.command("drain")
@click.argument("kind", type=click.Choice(["agent", "link", "domain"]))
@click.argument("names", metavar="ID...", nargs=-1, required=True)
@click.option("--reason", required=True, help="Why (a repair, say): shown to operators and to the users of its partitions.")
@click.option("--by", "by", default=None, metavar="WHEN",
              help="Remove the partitions still there then: a time from now (2h, 1d) or a date and time in UTC (2026-12-07T08:00). "
                   "Without it they are left to finish.")
@json_option
@pass_client
def drain(admin, kind, names, reason, by, as_json):
    """Drain machines, for a repair say: nothing new is placed on them. Name agents, links
    (AGENT:PORT, AGENT:syncN, AGENT:gwN: the machines at both ends of the cable) or IPU-Link
    domains (CLUSTER:INDEX).

    Their relocatable partitions move elsewhere while idle (now, or at a later health pass while a
    client is attached); the others are left to finish, or are removed at --by as a forced remove
    removes them (their users see when). All or none; the drain stands, across restarts, until
    `vipu-admin resume`."""
    deadline = when(by or "", "--by")
    with reporting(f"drain {kind}", ", ".join(names)):
        agents = admin.drain_agents(_machines(admin, kind, names), reason, deadline)
    if as_json:
        return echo_json({"agents": agents})
    for agent in agents:
        click.echo(f"agent {agent.id}: {_drain_text(agent)}")


@cli.command("resume")
@click.argument("kind", type=click.Choice(["agent", "link", "domain"]))
@click.argument("names", metavar="ID...", nargs=-1, required=True)
@pass_client
def resume(admin, kind, names):
    """End the drain of machines (agents, links' ends or IPU-Link domains, as `drain` names
    them): partitions are placed there again. All or none."""
    with reporting(f"resume {kind}", ", ".join(names)):
        agents = admin.resume_agents(_machines(admin, kind, names))
    for agent in agents:
        click.echo(f"agent {agent.id} resumed")


@remove.command("agent")
@click.argument("agent_id")
@force_option
@pass_client
def remove_agent(admin, agent_id, force, ipuof_dir):
    """Remove an agent (with --force, also its cluster, allocations and partitions)."""
    with reporting("remove agent", agent_id):
        removed = admin.remove_agent(agent_id, force)
    report_removal("agent", agent_id, removed, ipuof_dir)


# The link ledger


def since_time(value: str | None) -> float:
    """--since as seconds since the epoch (`vipu.client.admin.since_time`), refused as a bad option value."""
    try:
        return client_since_time(value or "")
    except InvalidArgument as bad:
        raise click.BadParameter(bad.message) from None


def _last_reading(link) -> list[tuple[str, str]]:
    """The link's last kept reading, or dashes for a link known only from a cluster test's verdict."""
    if not link.HasField("last"):
        return [("Corrected Errors", "-"), ("Recoveries", "-"), ("Up", "-"), ("Read (UTC)", "not read yet")]
    last = link.last
    return [("Corrected Errors", str(last.corrected_errors)), ("Recoveries", str(last.recovery_events)), ("Up", "yes" if last.up else "no"),
            ("Read (UTC)", _when(last.at))]


def _when(seconds: float) -> str:
    """A moment in a column whose heading says (UTC)."""
    return utc_text(seconds, labelled=False)


since_option = click.option("--since", default=None, metavar="WHEN",
                            help="A time ago (30m, 12h, 7d) or a date and time in UTC (2026-11-01T08:00).")


@list_.command("links")
@click.option("--suspect", is_flag=True, help="Only the links that are suspect or failed.")
@click.option("--machine", "agent_id", default="", metavar="AGENT", help="Only this agent's machine's links.")
@click.option("--partition", "partition_id", default="", metavar="ID", help="Only the links this partition runs over now.")
@since_option
@json_option
@pass_client
def list_links(admin, suspect, agent_id, partition_id, since, as_json):
    """List the links of the link ledger, with their health and why."""
    with reporting("list links"):
        links = admin.list_links(agent_id, suspect, since_time(since), partition_id)
    if as_json:
        return echo_json({"links": links})
    rows = [[link.name, link.kind, link.health, _when(link.changed_at), link.cable.serial or "-",
             *((str(link.last.corrected_errors), str(link.last.recovery_events)) if link.HasField("last") else ("-", "-")), link.reason]
            for link in links]
    click.echo(render_table(["Link", "Kind", "Health", "Since (UTC)", "Cable", "Errors", "Recoveries", "Reason"], rows))


@get.command("link")
@click.argument("name", metavar="AGENT:PLACE")
@click.option("--history", is_flag=True, help="Its samples, older summaries, events and cables too.")
@since_option
@click.option("--before", default=None, metavar="WHEN", help="With --history: only what came before then, as --since reads it "
              "(the page before one that said older readings were left out).")
@click.option("--limit", type=click.IntRange(1, 10_000), default=None,
              help="With --history: the newest readings and events at most, each. Default: the server's page, 10,000.")
@json_option
@pass_client
def get_link(admin, name, history, since, before, limit, as_json):
    """Show a link (ag3:5, ag3:sync2, ag3:gw1, ag3:ipu1:4C): its health and why, its cable, and with
    --history what the ledger kept of it, a page at a time."""
    with reporting("get link", name):
        link = admin.get_link(name, history, since_time(since), since_time(before), limit or 0)
    if as_json:
        return echo_json(link)
    cable = f"{link.cable.serial} ({link.cable.vendor} {link.cable.model}, since {_when(link.cable.first_seen)})" if link.cable.serial \
        else "-"
    click.echo(render_pairs([("Link", link.name), ("Kind", link.kind), ("Health", link.health), ("Reason", link.reason),
                             ("Since (UTC)", _when(link.changed_at)), ("Cable", cable),
                             ("Quarantined", "yes" if link.quarantined else (f"no: {link.breaker}" if link.breaker else "no")),
                             *_last_reading(link)]))
    if not history:
        return
    if link.events:
        click.echo(render_table(["Event (UTC)", "Health", "Reason", "Partitions"],
                                [[_when(e.at), e.health, e.reason, ",".join(e.partitions) or "-"] for e in link.events]))
    if len(link.cables) > 1:
        click.echo(render_table(["Cable", "Vendor", "Model", "First Seen (UTC)", "Replaced"],
                                [[c.serial, c.vendor, c.model, _when(c.first_seen), c.replaced or "-"] for c in link.cables]))
    rows = [[f"{_when(s.start)} - {_when(s.end)}", str(s.samples), str(s.down), str(s.corrected_growth), str(s.recovery_growth)]
            for s in link.summaries]
    previous = None
    for sample in link.samples:
        counters = (sample.corrected_errors, sample.recovery_events)
        rows.append([_when(sample.at), "1", "0" if sample.up else "1", *map(str, growth(previous, counters))])
        previous = counters
    click.echo(render_table(["Time (UTC)", "Samples", "Down", "Errors Grew", "Recoveries Grew"], rows))
    left_out = [f"{n} older {what}" for n, what in ((link.samples_left_out, "readings"), (link.events_left_out, "events")) if n]
    if left_out:
        first = min(t for t in (link.samples[0].at if link.samples else 0, link.events[0].at if link.events else 0) if t)
        exact = datetime.fromtimestamp(first, UTC).replace(tzinfo=None).isoformat(timespec="microseconds")
        click.echo(f"{' and '.join(left_out)} not shown: --before {exact} shows them")


# Machine logs

FOLLOW_WAIT_SECONDS = 10.0  # each wait of --follow at the controller, before it asks again


@cli.group(cls=CommandGroup)
def logs():
    """Read what machines logged."""


@logs.command("agent")
@click.argument("agent_id")
@since_option
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines as they come, until interrupted.")
@click.option("--grep", default="", metavar="REGEX", help="Only the lines that match this regular expression.")
@click.option("--lines", "-n", "limit", type=click.IntRange(1, 1000), default=100, show_default=True,
              help="The latest lines to print first, at most.")
@pass_client
def logs_agent(admin, agent_id, since, follow, grep, limit):
    """Print an agent's machine's log (its gateway's and its BMC's), as the controller collected it."""
    with reporting("logs agent", agent_id):
        reply = admin.read_machine_log(agent_id, since=since_time(since), grep=grep, limit=limit)
    try:
        while True:
            for line in reply.lines:
                click.echo(f"{_when(line.at)} {line.source}: {line.text}")
            if not follow:
                return
            with reporting("logs agent", agent_id):
                reply = admin.read_machine_log(agent_id, after=reply.last, grep=grep, wait=FOLLOW_WAIT_SECONDS)
    except KeyboardInterrupt:
        return


# Clusters


@create.command("cluster")
@click.argument("cluster_id")
@click.option("--agents", required=True, help="Agents in physical order, lowest in the rack first: ag1,ag2,...")
@click.option("--topology", type=click.Choice(sorted(TOPOLOGIES)), default="mesh", show_default=True,
              help="IPU-Link topology of each IPU-Link domain.")
@click.option("--num-ipulinkdomains", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="IPU-Link domains the agents form, in equal consecutive groups.")
@click.option("--cluster-topology", type=click.Choice(["looped"]), default=None,
              help="How IPU-Link domains are joined by GW-Links (looped, the default with several domains).")
@pass_client
def create_cluster(admin, cluster_id, agents, topology, num_ipulinkdomains, cluster_topology):
    """Group agents into a cluster with a known cabling topology."""
    with reporting("create cluster", cluster_id):
        admin.create_cluster(cluster_id, split_list(agents), topology=getattr(pb, TOPOLOGIES[topology]),
                             num_ipulinkdomains=num_ipulinkdomains,
                             cluster_topology=pb.GW_TOPOLOGY_LOOPED if cluster_topology else pb.GW_TOPOLOGY_UNSPECIFIED)
    succeed("create cluster", cluster_id)


def _cluster_shape(cluster: pb.Cluster) -> tuple[str, str]:
    looped = "looped" if cluster.cluster_topology == pb.GW_TOPOLOGY_LOOPED else "-"
    return topology_name(cluster.topology), looped


@list_.command("clusters")
@json_option
@pass_client
def list_clusters(admin, as_json):
    """List the clusters."""
    with reporting("list clusters"):
        clusters = admin.list_clusters()
    if as_json:
        return echo_json({"clusters": clusters})
    rows = []
    for c in clusters:
        topology, looped = _cluster_shape(c)
        rows.append([c.id, " ".join(c.agent_ids), topology, str(c.num_ipulinkdomains), looped,
                     " ".join(c.allocation_ids) or "-"])
    click.echo(render_table(["Cluster", "Agents", "Topology", "ILDs", "Cluster Topology", "Allocations"], rows))


@get.command("cluster")
@click.argument("cluster_id")
@json_option
@pass_client
def get_cluster(admin, cluster_id, as_json):
    """Show a cluster and its IPU-Link domains."""
    with reporting("get cluster", cluster_id):
        cluster = admin.get_cluster(cluster_id)
    if as_json:
        return echo_json(cluster)
    topology, looped = _cluster_shape(cluster)
    click.echo(render_pairs([
        ("Cluster ID", cluster.id),
        ("Topology", topology),
        ("Num of IPU-Link Domains", str(cluster.num_ipulinkdomains)),
        ("Cluster Topology", looped),
        ("Num of Agents", str(len(cluster.agent_ids))),
        ("Num of IPUs", str(len(cluster.agent_ids) * entities.IPUS_PER_MACHINE)),
        ("Allocations", " ".join(cluster.allocation_ids) or "-"),
    ]))
    per_ild = len(cluster.agent_ids) // max(cluster.num_ipulinkdomains, 1)
    rows = [[str(i // per_ild), str(i % per_ild), agent] for i, agent in enumerate(cluster.agent_ids)]
    click.echo(render_table(["ILD", "Position", "Agent"], rows))


@remove.command("cluster")
@click.argument("cluster_id")
@force_option
@pass_client
def remove_cluster(admin, cluster_id, force, ipuof_dir):
    """Remove a cluster (with --force, also its allocations and their partitions)."""
    with reporting("remove cluster", cluster_id):
        removed = admin.remove_cluster(cluster_id, force)
    report_removal("cluster", cluster_id, removed, ipuof_dir)


# Allocations


@create.command("allocation")
@click.argument("allocation_id")
@click.option("--cluster", "cluster_id", required=True, help="The cluster the machines come from.")
@click.option("--agents", default=None, help="These physically consecutive agents, in order: ag1,ag2,...")
@click.option("--size", type=click.IntRange(1, 2**32 - 1), default=None,
              help="Or this many IPUs, on consecutive free machines the controller picks.")
@pass_client
def create_allocation(admin, allocation_id, cluster_id, agents, size):
    """Make consecutive machines of a cluster available for partitions."""
    if (agents is None) == (size is None):
        raise click.UsageError("give either --agents or --size")
    with reporting("create allocation", allocation_id):
        admin.create_allocation(allocation_id, cluster_id, agent_ids=split_list(agents), size=size or 0)
    succeed("create allocation", allocation_id)


@list_.command("allocations")
@json_option
@pass_client
def list_allocations(admin, as_json):
    """List the allocations."""
    with reporting("list allocations"):
        allocations = admin.list_allocations()
    if as_json:
        return echo_json({"allocations": allocations})
    rows = [[a.id, a.cluster_id, " ".join(a.agent_ids), " ".join(a.partition_ids) or "-"] for a in allocations]
    click.echo(render_table(["Allocation ID", "Cluster", "Agents", "Partitions"], rows))


@get.command("allocation")
@click.argument("allocation_id")
@json_option
@pass_client
def get_allocation(admin, allocation_id, as_json):
    """Show an allocation."""
    with reporting("get allocation", allocation_id):
        allocation = admin.get_allocation(allocation_id)
    if as_json:
        return echo_json(allocation)
    click.echo(render_pairs([
        ("Allocation ID", allocation.id),
        ("Cluster", allocation.cluster_id),
        ("Agents", " ".join(allocation.agent_ids)),
        ("Num of IPUs", str(len(allocation.agent_ids) * entities.IPUS_PER_MACHINE)),
        ("Partitions", " ".join(allocation.partition_ids) or "-"),
    ]))


@remove.command("allocation")
@click.argument("allocation_id")
@force_option
@pass_client
def remove_allocation(admin, allocation_id, force, ipuof_dir):
    """Remove an allocation (with --force, also its partitions)."""
    with reporting("remove allocation", allocation_id):
        removed = admin.remove_allocation(allocation_id, force)
    report_removal("allocation", allocation_id, removed, ipuof_dir)


@create.command("reservation")
@click.argument("name")
@click.option("--agents", default=None, help="Reserve these machines, whole: ag1,ag2,... (of one allocation).")
@click.option("--size", type=click.IntRange(1, 2**32 - 1), default=None, help="Or this many IPUs, placed by the controller.")
@click.option("--allocation", "allocation_id", default="", help="With --size: the allocation (needed when there are several).")
@click.option("--start", default="now", show_default=True, metavar="WHEN",
              help="now, a time from now (2h, 1d) or a date and time in UTC (2026-12-12T02:00).")
@click.option("--end", required=True, metavar="WHEN", help="A time from now (6h), or a date and time in UTC; after --start.")
@click.option("--maintenance", is_flag=True,
              help="A maintenance window: its machines are drained while it lasts, and nothing runs into it.")
@click.option("--users", default=None, help="Or a reservation for these users (u1,u2,...), who make partitions in it with "
              "vipu create partition --reservation NAME.")
@click.option("--accounts", default=None, help="Or (and) for the partitions of these accounts (a1,a2,...), whoever makes them: a "
              "team's Slurm jobs and IPUJobs, say.")
@click.option("--reason", required=True, help="Why: shown to users whose requests it keeps off, and in listings.")
@pass_client
def create_reservation(admin, name, agents, size, allocation_id, start, end, maintenance, users, accounts, reason):
    """Set IPUs aside for a time: a maintenance window (--maintenance) or a reservation for users
    (--users). Until its start, only partitions expected to end by then (vipu create partition
    --expected-duration) are placed on them."""
    if (agents is None) == (size is None):
        raise click.UsageError("give either --agents or --size")
    if maintenance == bool(users or accounts):
        raise click.UsageError("give either --maintenance or --users/--accounts")
    now = time.time()
    starts, ends = (now if start == "now" else when(start, "--start", now)), when(end, "--end", now)
    with reporting("create reservation", name):
        made = reservation_from_proto(admin.create_reservation(
            name, starts, ends, reason, agent_ids=split_list(agents), size=size or 0, allocation_id=allocation_id,
            maintenance=maintenance, users=split_list(users), accounts=split_list(accounts)))
    click.echo(f"create reservation ({name}): success: {made.describe()}, {made.size} IPUs ({' '.join(made.agent_ids)})")


@remove.command("reservation")
@click.argument("name")
@pass_client
def remove_reservation(admin, name):
    """Remove a reservation or maintenance window (one under way ends at once: its machines resume)."""
    with reporting("remove reservation", name):
        admin.remove_reservation(name)
    succeed("remove reservation", name)


@cli.command("compact")
@click.argument("allocation_id")
@click.option("--dry-run", is_flag=True, help="Show the plan only: nothing moves.")
@json_option
@pass_client
def compact(admin, allocation_id, dry_run, as_json):
    """Move relocatable partitions of an allocation so that a larger shape comes free.

    The plan frees the largest shape broken up now, with the fewest moves the budget allows
    (vipu-server's --compaction-moves-per-hour and --compaction-partition-interval). Each move keeps
    the partition's id and attach key, and is made only if no IPUoF client is attached to it or
    its user consented (vipu update partition --may-move); it stops at the first move that may not
    be made, saying why.
    """
    with reporting("compact", allocation_id):
        reply = admin.compact_allocation(allocation_id, dry_run=dry_run)
    if as_json:
        return echo_json(reply)
    if not reply.moves:
        fail("compact", allocation_id, f"no plan: {reply.no_plan}")
    state = (lambda move: "planned") if dry_run else (lambda move: "moved" if move.moved else "not moved")
    click.echo(render_table(["Partition", "From", "To", "State"],
                            [[move.partition_id, getattr(move, "from"), move.to, state(move)] for move in reply.moves]))
    moves = f"{len(reply.moves)} move{'s' if len(reply.moves) != 1 else ''}"
    if dry_run:
        click.echo(f"compact ({allocation_id}): dry run: {moves} would free {reply.frees_ipus} IPUs at {reply.frees_at}.")
    elif reply.stopped:
        fail("compact", allocation_id, f"stopped after {sum(m.moved for m in reply.moves)} of {moves}: {reply.stopped}")
    else:
        click.echo(f"compact ({allocation_id}): success. {moves} freed {reply.frees_ipus} IPUs at {reply.frees_at}.")


@apply.command("template")
@click.argument("template", metavar="TEMPLATE")
@click.option("--allocation", "allocation_id", required=True, help="The allocation to split.")
@click.option("--prefix", default="", help="Name the partitions PREFIX1, PREFIX2, ... [default: the template and a dash: 4x16-1]")
@click.option("--account", default="", help="Make them on this account, held to its quota as a whole (needed where the "
              "allocation is shared by quotas).")
@click.option("--dry-run", is_flag=True, help="Show where the partitions would go: nothing is made.")
@json_option
@pass_client
def apply_template(admin, template, allocation_id, prefix, account, dry_run, as_json):
    """Split an allocation the same way again: make a template's partitions in one step, all or none.

    TEMPLATE is COUNTxSIZE parts joined by +: 4x16 (four partitions of 16 IPUs), 2x32, 2x16+8x4.
    They are placed together on the IPUs free now; if one does not fit, or cannot be made, nothing
    is left of any of them.
    """
    with reporting("apply template", template):
        reply = admin.apply_template(template, allocation_id, prefix=prefix, dry_run=dry_run, account=account)
    if as_json:
        return echo_json(reply)
    layout = ClusterLayout.of(cluster_from_proto(admin.get_cluster(reply.partitions[0].spec.cluster_id)))  # a template makes one at least
    rows = [[p.id, str(len(p.spec.ipus)), span(layout, ((i.agent_id, i.agent_ipu_index) for i in p.spec.ipus))] for p in reply.partitions]
    click.echo(render_table(["Partition", "Size", "IPUs"], rows))
    made = f"{len(reply.partitions)} partition{'s' if len(reply.partitions) != 1 else ''}"
    if dry_run:
        click.echo(f"apply template ({template}): dry run: {made} would be made in allocation {allocation_id}; nothing was.")
    else:
        click.echo(f"apply template ({template}): success: {made} made in allocation {allocation_id}.")


# Users


def write_user_config(admin: AdminClient, reply: pb.UserKeyReply, directory: Path) -> Path:
    """The new key's configuration file for `vipu`: this controller, this user, our TLS files."""
    mine = admin.settings
    settings = ClientSettings(mine.host, reply.user_port, reply.user.id, reply.access_key,
                              mine.server_cert, mine.client_cert, mine.client_key)
    path = directory / f"{reply.user.id}.vipu-cli.hcl"
    try:
        write_client_config(path, settings, admin_port=mine.port)  # so that vipu-admin --config finds this controller too
    except OSError as error:
        fail("write configuration", str(path), error.strerror or str(error))
    return path


def report_key(admin: AdminClient, action: str, reply: pb.UserKeyReply, directory: Path) -> None:
    """The key, shown this once, and the configuration file that holds it."""
    user_id = reply.user.id
    click.echo(f"{action} ({user_id}): success. Access key is '{reply.access_key}'.")
    path = write_user_config(admin, reply, directory)
    click.echo(f"vipu configuration file for the user '{user_id}' written: {path}")
    click.echo(f"Use 'vipu --config {path}' to switch to the user context.")


config_dir_option = click.option(
    "--config-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("."), show_default=True,
    help="Where to write the user's configuration file, USER.vipu-cli.hcl.",
)


@create.command("user")
@click.argument("user_id")
@click.option("--allocations", default=None, help="Allocations the user may create partitions in: A1,A2,...")
@click.option("--admin", "administrator", is_flag=True, help="Make the user an administrator.")
@config_dir_option
@pass_client
def create_user(admin, user_id, allocations, administrator, config_dir):
    """Create a user; print their access key, once, and write their vipu configuration file."""
    with reporting("create user", user_id):
        reply = admin.create_user(user_id, split_list(allocations), administrator)
    report_key(admin, "create user", reply, config_dir)


@list_.command("users")
@json_option
@pass_client
def list_users(admin, as_json):
    """List the users."""
    with reporting("list users"):
        users = admin.list_users()
    if as_json:
        return echo_json({"users": users})
    rows = [[u.id, "admin" if u.admin else "user", " ".join(u.allocation_ids) or "-"] for u in users]
    click.echo(render_table(["User", "Role", "Allocations"], rows))


@get.command("user")
@click.argument("user_id")
@json_option
@pass_client
def get_user(admin, user_id, as_json):
    """Show a user."""
    with reporting("get user", user_id):
        user = admin.get_user(user_id)
    if as_json:
        return echo_json(user)
    click.echo(render_pairs([("User ID", user.id), ("Role", "admin" if user.admin else "user"),
                             ("Allocations", " ".join(user.allocation_ids) or "-")]))


@cli.group(cls=CommandGroup)
def update():
    """Change a user."""


@update.command("user")
@click.argument("user_id")
@click.option("--give", default=None, help="Give these allocations to the user: A1,A2,...")
@click.option("--deny", default=None, help="Take these allocations from the user: A1,A2,...")
@click.option("--rotate-key", is_flag=True, help="Replace the user's access key; the old one stops working at once.")
@config_dir_option
@pass_client
def update_user(admin, user_id, give, deny, rotate_key, config_dir):
    """Give or deny a user allocations, or replace their access key."""
    if not (give or deny or rotate_key):
        raise click.UsageError("say what changes: --give, --deny or --rotate-key")
    with reporting("update user", user_id):
        reply = admin.update_user(user_id, give=split_list(give), deny=split_list(deny), rotate_key=rotate_key)
    if reply.access_key:
        return report_key(admin, "update user", reply, config_dir)
    succeed("update user", user_id)


@remove.command("user")
@click.argument("user_id")
@pass_client
def remove_user(admin, user_id):
    """Remove a user; their access key stops working at once."""
    with reporting("remove user", user_id):
        admin.remove_user(user_id)
    succeed("remove user", user_id)


# Accounts


def quota_message(allocation_id: str, ipus: str, limits: tuple[str, ...]) -> pb.AccountQuota | None:
    """The quota an option gives: IPUS (a number) with its shape limits, or none (`none`: no quota there)."""
    if ipus == "none":
        if limits:
            raise click.UsageError("--limit goes with a quota of IPUs, not with none")
        return None
    if not ipus.isdigit() or int(ipus) > 2**32 - 1:
        raise click.BadParameter(f"a quota is a number of IPUs (up to {2**32 - 1}), or none, not {ipus!r}", param_hint="IPUS")
    return pb.AccountQuota(allocation_id=allocation_id, ipus=int(ipus), limits=list(limits))


limit_option = click.option("--limit", "limits", multiple=True, metavar="SIZE+:partitions=N|SIZE+:ipus=N",
                            help="A limit by shape, again for each: 64+:partitions=2 (at most 2 partitions of 64 IPUs or more), "
                                 "16+:ipus=128 (at most 128 IPUs in partitions of 16 or more).")
quota_allocation_option = click.option("--allocation", "allocation_id", default="",
                                       help="The allocation the quota holds in. Default: each allocation without a quota of its own.")


@create.command("account")
@click.argument("name")
@click.option("--users", default=None, help="Its users: u1,u2,... (a user in one account makes partitions on it by default).")
@click.option("--cohort", default="", help="Its cohort: accounts of one cohort lend each other the quota they leave idle.")
@click.option("--quota", "ipus", default=None, metavar="IPUS", help="The IPUs it is guaranteed, and entitled to in fair share.")
@quota_allocation_option
@limit_option
@pass_client
def create_account(admin, name, users, cohort, ipus, allocation_id, limits):
    """Create an account: a team sharing the pod, with its users, cohort and quota."""
    if (limits or allocation_id) and ipus is None:
        raise click.UsageError("--allocation and --limit go with --quota")
    quota = quota_message(allocation_id, ipus, limits) if ipus is not None else None
    with reporting("create account", name):
        admin.create_account(pb.Account(name=name, users=list(split_list(users)), cohort=cohort, quotas=[quota] if quota else []))
    succeed("create account", name)


@update.command("account")
@click.argument("name")
@click.option("--users", default=None, help="Its users, all of them: u1,u2,... (an empty value: none).")
@click.option("--cohort", default=None, help="Its cohort (an empty value: none).")
@pass_client
def update_account(admin, name, users, cohort):
    """Change an account's users or cohort (its quotas: vipu-admin set quota)."""
    if users is None and cohort is None:
        raise click.UsageError("say what changes: --users or --cohort")
    fields = [f for f, v in (("users", users), ("cohort", cohort)) if v is not None]
    with reporting("update account", name):
        admin.update_account(pb.Account(name=name, users=list(split_list(users)), cohort=cohort or ""), fields)
    succeed("update account", name)


@cli.group(name="set", cls=CommandGroup)
def set_():
    """Set an account's quota."""


@set_.command("quota")
@click.argument("account")
@click.argument("ipus", metavar="IPUS|none")
@quota_allocation_option
@limit_option
@pass_client
def set_quota(admin, account, ipus, allocation_id, limits):
    """Set an account's quota in an allocation (or in each without one of its own): IPUS, with
    limits by shape, or none. A quota below what the account holds takes effect as its partitions
    end: nothing is evicted for it."""
    quota = quota_message(allocation_id, ipus, limits)
    with reporting("set quota", account):
        if quota is None:
            admin.update_account(pb.Account(name=account, quotas=[pb.AccountQuota(allocation_id=allocation_id)]), ["no_quota"])
        else:
            admin.update_account(pb.Account(name=account, quotas=[quota]), ["quota"])
    succeed("set quota", account)


@list_.command("accounts")
@json_option
@pass_client
def list_accounts(admin, as_json):
    """List the accounts: their users, cohort and quotas, and, in each allocation, what they hold
    against their quota, what they borrow, what waits, and their share of the use (decayed, as fair
    share counts it) against their entitled share."""
    with reporting("list accounts"):
        accounts = admin.list_accounts()
    if as_json:
        return echo_json({"accounts": accounts})
    rows = []
    for message in accounts:
        account = account_from_proto(message)
        for n, line in enumerate(account_lines(account, account_uses_from_proto(message))):
            use = line.use
            rows.append([account.name if n == 0 else "", (account.cohort or "-") if n == 0 else "",
                         (" ".join(account.users) or "-") if n == 0 else "", use.allocation_id if use else "-", line.quota_text,
                         str(use.ipus if use else 0), str(use.borrowed if use else 0), str(use.waiting if use else 0),
                         use.share_text() if use else "-"])
    click.echo(render_table(["Account", "Cohort", "Users", "Allocation", "Quota", "In use", "Borrowed", "Waiting",
                             "Share (used of entitled)"], rows))


@remove.command("account")
@click.argument("name")
@pass_client
def remove_account(admin, name):
    """Remove an account that holds no partition and has no request waiting (its usage records stay)."""
    with reporting("remove account", name):
        admin.remove_account(name)
    succeed("remove account", name)


@cli.group(cls=CommandGroup)
def report():
    """Report what was used."""


@report.command("usage")
@click.option("--by", type=click.Choice(["account", "user"]), default="account", show_default=True)
@click.option("--since", default="30d", show_default=True, metavar="WHEN",
              help="A time ago (12h, 7d) or a date and time in UTC (2026-11-01T00:00).")
@click.option("--until", default="", metavar="WHEN", help="A time ago or a date and time in UTC. Default: now.")
@click.option("--allocation", "allocation_id", default="", help="One allocation's use. Default: every allocation's.")
@json_option
@click.option("--csv", "as_csv", is_flag=True, help="Print comma-separated values.")
@pass_client
def report_usage(admin, by, since, until, allocation_id, as_json, as_csv):
    """IPU-hours used in a time window by account or by user, as Slurm's sreport gives them: the
    partitions that ended (their usage records) and those running, counted up to now."""
    if as_json and as_csv:
        raise click.UsageError("give --json or --csv, not both")
    now = time.time()
    try:
        start = client_since_time(since, now)
        end = client_since_time(until, now) if until else now
    except InvalidArgument as bad:
        raise click.BadParameter(bad.message) from None
    with reporting("report usage"):
        rows = admin.report_usage(by, start, end, allocation_id)
    heading = "Account" if by == "account" else "User"
    if as_json:
        return echo_json({"by": by, "since": utc_text(start), "until": utc_text(end),
                          "rows": [{by: r.key or "-", "ipu_hours": round(r.ipu_seconds / 3600, 3), "partitions": r.partitions}
                                   for r in rows]})
    if as_csv:
        click.echo(f"{by},ipu_hours,partitions")
        for r in rows:
            click.echo(f"{r.key},{r.ipu_seconds / 3600:.3f},{r.partitions}")
        return
    click.echo(f"Usage by {by} from {utc_text(start)} to {utc_text(end)}")
    click.echo(render_table([heading, "IPU-hours", "Partitions"], [[r.key or "-", f"{r.ipu_seconds / 3600:.2f}", str(r.partitions)]
                                                                   for r in rows]))


# Cluster tests

TEST_OPTIONS = {
    "sync": "Sync-Link", "cabling": "Cabling", "ipulink": "IPU-Link", "traffic": "Traffic",
    "gwlink": "GW-Link", "versions": "Version", "pfc_settings": "PFC-settings",
}


@cli.group(cls=CommandGroup)
def test():
    """Test a cluster's cabling, links, versions and settings."""


def print_test_report(report: pb.ClusterTestReport, as_json: bool = False) -> None:
    """The seed's results table, or the report as JSON; a failed test makes the command fail after it
    (one an idle-time test stopped, stepping aside for a partition, failed nothing)."""
    if as_json:
        echo_json(report)
    else:
        click.echo(f"Showing test results for cluster {report.cluster_id}")
        rows = [[r.test, f"{r.duration_seconds:.2f}s", f"{r.passed}/{r.total}", list(r.summary)] for r in report.results]
        click.echo(render_table(["Test Type", "Duration", "Passed", "Summary"], rows, top_rule=False))
    if any(r.status not in ("passed", "stopped") for r in report.results):
        fail("test cluster", report.cluster_id, "Some tests failed")


@test.command("cluster")
@click.argument("cluster_id", required=False)
@click.option("--sync", is_flag=True, help="The Sync-Link test.")
@click.option("--cabling", is_flag=True, help="The cabling test: every IPU-Link and GW-Link cable where it should be.")
@click.option("--ipulink", is_flag=True, help="The IPU-Link training test.")
@click.option("--traffic", is_flag=True, help="The traffic test: a program on windows of 16 IPUs, counting link errors.")
@click.option("--gwlink", is_flag=True, help="The GW-Link test.")
@click.option("--versions", is_flag=True, help="The version consistency test.")
@click.option("--pfc-settings", is_flag=True, help="The RNICs' PFC settings test.")
@click.option("--start", "mode", flag_value="start", help="Start the test and return at once.")
@click.option("--status", "mode", flag_value="status", help="Show the results of the last test.")
@click.option("--stop", "mode", flag_value="stop", help="Stop the test in progress.")
@click.option("--agents", default=None, help="Test these machines alone (drained ones, for the tests that drive links), "
                                             "and the cables between them: ag3,ag4.")
@json_option
@pass_client
def test_cluster(admin, cluster_id, mode, agents, as_json, **options):
    """Run the cluster test suite, or one test of it (which then runs whatever its dependencies say);
    on the whole cluster, or on drained machines alone while partitions run elsewhere (--agents)."""
    if agents is not None and mode in ("status", "stop"):
        raise click.UsageError(f"--agents names the machines a test starts on; --{mode} takes none")
    if mode == "status":
        with reporting("test cluster", "status"):
            report = admin.cluster_test_status()
        return print_test_report(report, as_json)
    if mode == "stop":
        with reporting("test cluster", "stop"):
            admin.stop_cluster_test()
        return None  # silent on success, as seed 002 shows
    if not cluster_id:
        raise click.UsageError("name the cluster to test, or use --status or --stop")
    tests = tuple(name for option, name in TEST_OPTIONS.items() if options[option])
    machines = tuple(split_list(agents))
    with reporting("test cluster", cluster_id):
        if mode is None and not as_json and sys.stdout.isatty():
            report = run_showing_progress(admin, cluster_id, tests, machines)
        else:
            report = admin.test_cluster(cluster_id, tests, wait=mode != "start", agent_ids=machines)
    if mode != "start":  # a started test says nothing, as seed 002 shows
        print_test_report(report, as_json)


PROGRESS_POLL_SECONDS = 0.25
ENDED = {"stopped": "The test was stopped", "interrupted": "The test was interrupted by a restart of the controller"}


def run_showing_progress(admin: AdminClient, cluster_id: str, tests: tuple[str, ...],
                         machines: tuple[str, ...] = ()) -> pb.ClusterTestReport:
    """Start the tests and show, on standard error, each as it starts and ends; the final report.
    Interrupting the command leaves the tests running (`--stop` stops them)."""
    from rich.console import Console  # only on a terminal

    console = Console(stderr=True, highlight=False)
    admin.test_cluster(cluster_id, tests, wait=False, agent_ids=machines)
    shown = 0
    try:
        with console.status(f"testing cluster {cluster_id}") as status:
            while True:
                try:
                    report = admin.cluster_test_progress()
                except VipuError as error:
                    fail("test cluster", cluster_id, f"{error.message}; the tests may go on "
                                                     "('vipu-admin test cluster --status' shows their results)")
                if report.cluster_id != cluster_id:  # ours ended and another began before this look
                    fail("test cluster", cluster_id, f"a test of cluster {report.cluster_id} began after this one ended; "
                                                     "'vipu-admin test cluster --status' shows the last results")
                for result in report.results[shown:]:
                    console.print(f"{result.test}: {result.status} ({result.passed}/{result.total}, {result.duration_seconds:.2f}s)")
                shown = len(report.results)
                if report.state != "running":
                    break
                status.update(f"{report.running_test or 'starting'} ({shown + 1} of {len(report.planned)})")
                time.sleep(PROGRESS_POLL_SECONDS)
    except KeyboardInterrupt:
        fail("test cluster", cluster_id, "interrupted; the tests go on ('vipu-admin test cluster --stop' stops them)")
    if report.state in ENDED:
        fail("test cluster", cluster_id, ENDED[report.state])
    return report


# Discovery


@cli.group(cls=CommandGroup)
def discover():
    """Find agents that announce themselves on the network."""


@discover.command("agents")
@click.option("--auto-add", is_flag=True, help="Add every discovered agent that is not registered yet, as HOST-PORT.")
@json_option
@pass_client
def discover_agents(admin, auto_add, as_json):
    """List the agents heard on the interfaces vipu-server listens on (vipu-server -a)."""
    with reporting("discover agents"):
        reply = admin.discover_agents(auto_add)
    if as_json:
        return echo_json(reply)
    if auto_add:
        for agent_id in reply.added:
            click.echo(f"Added agent {agent_id}")
        for failure in reply.failures:
            click.echo(f"Could not add agent {failure}", err=True)
        if not reply.added and not reply.failures:
            click.echo("No new agents to add.")
        return
    rows = [[a.host, str(a.port), a.interface, f"{a.seconds_since_seen:.9f}s", a.auto_add_id] for a in reply.agents]
    click.echo(render_table(["Host", "Port", "Network Interface", "Time Since Last Seen", "Agent Auto-Add ID"], rows, top_rule=False))


# Slurm


@cli.group(cls=CommandGroup)
def export():
    """Write what another system needs to know of vipu, in its own format."""


@export.command("slurm-topology")
@click.option("--nodes", "node_machines", required=True, metavar="NODES:MACHINES...",
              help="The machines beside each Slurm node, as hostlists: 'n[1-4]:ag[1-4] n[5-8]:ag[5-8] login1:' "
                   "(vipu.conf's NodeMachines).")
@click.option("--form", type=click.Choice(slurm_topology.FORMATS), default="tree", show_default=True,
              help="tree: topology.conf for topology/tree; block: topology.conf for topology/block (Slurm 23.11 on); "
                   "yaml: topology.yaml (Slurm 24.11 on).")
@click.option("--user", "user_id", default="", metavar="USER",
              help="Only the allocations given to this user (Slurm's ApiUser; an administrator uses all). Default: every allocation.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the file there (replaced in one step) instead of printing it.")
@pass_client
def export_slurm_topology(admin, node_machines, form, user_id, output):
    """Slurm's network topology from vipu's IPU-Link domains and allocations: Slurm then places a
    job's nodes beside machines vipu can join into one partition."""
    with reporting("export slurm-topology"):
        mapping = slurm_topology.parse_node_machines(node_machines)
        agents = {agent.id for agent in admin.list_agents()}
        unknown = sorted({machine for machines in mapping.values() for machine in machines} - agents)
        if unknown:
            raise InvalidArgument(f"--nodes names machine {unknown[0]}, which is no agent of vipu's")
        user = admin.get_user(user_id) if user_id else None
        wanted = set(user.allocation_ids) if user is not None and not user.admin else None  # an administrator uses them all
        ilds = admin.agent_ilds()
        allocations = [(a.id, {agent: ilds[agent] for agent in a.agent_ids}) for a in admin.list_allocations()
                       if wanted is None or a.id in wanted]
        text = slurm_topology.slurm_topology(mapping, allocations).render(form)
        if output is None:
            click.echo(text, nl=False)
            return
        write_text_for_readers(output, text)
    click.echo(f"export slurm-topology ({output}): success.")


capacity_command(list_)
requests_command(list_)
reservations_command(list_)
cancel_request_command(remove, "anyone's")


def main() -> None:
    run(cli, "vipu-admin")
