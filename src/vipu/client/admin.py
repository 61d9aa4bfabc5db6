"""`AdminClient`: agents, clusters, allocations, users and cluster tests, through the admin end-point."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from vipu.api.convert import cluster_from_proto
from vipu.api.protos import admin_pb2 as pb
from vipu.api.protos import admin_pb2_grpc as pb_grpc
from vipu.api.protos import vipuuser_pb2 as user_pb
from vipu.client.base import EndpointClient
from vipu.model.errors import InvalidArgument
from vipu.model.linkhealth import LinkName
from vipu.model.times import parse_duration
from vipu.model.topology import ClusterLayout, agent_ilds

POWER_CALL_SECONDS = 420.0  # the controller waits 300 s for a machine to get there, and 30 s for its owner at each end
DRAIN_CALL_SECONDS = 150.0  # the controller waits up to 60 s for the machines' owners to take the word, and 60 s for their moves
_AGO_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since_time(value: str, now: float | None = None) -> float:
    """The `since` of `list_links` and `get_link` as a person gives it: a time ago (30m, 12h, 7d)
    or a date and time (2026-11-01, 2026-11-01T08:00, UTC unless it names its zone); 0 for none.
    One parser for every client that takes it (vipu-admin's --since, the dashboard's ?since=)."""
    if not value:
        return 0.0
    if value[-1:] in _AGO_UNITS and value[:-1].replace(".", "", 1).isdigit():
        return (time.time() if now is None else now) - float(value[:-1]) * _AGO_UNITS[value[-1]]
    return _moment(value, "a time ago (30m, 12h, 7d)", "2026-11-01T08:00")


def by_time(value: str, now: float | None = None) -> float:
    """A drain's deadline (`drain_agents`'s `deadline`) as a person gives it: a time from now (30m,
    2h, 1d, 1h30m) or a date and time (2026-12-07T08:00, UTC unless it names its zone); 0 for none."""
    if not value:
        return 0.0
    try:
        return (time.time() if now is None else now) + parse_duration(value)
    except ValueError:
        return _moment(value, "a time from now (30m, 2h, 1d)", "2026-12-07T08:00")


def _moment(value: str, or_else: str, example: str) -> float:
    """A date and time as a person writes it, UTC unless it names its zone, in seconds since the
    epoch; InvalidArgument saying the two forms it may take otherwise."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidArgument(f"{value!r} is neither {or_else} nor a date and time ({example})") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


class AdminClient(EndpointClient):
    """What an administrator does. Results are the API's messages (`vipu.api.protos.admin_pb2`);
    failures raise the families of `vipu.model.errors`, which `vipu.client.retry.verdict` judges."""

    PORT_KEY, PORT_ENV, DEFAULT_PORT = "api-admin-port", "VIPU_ADMIN_API_PORT", 8091

    def _call(self, method: str, request, no_deadline: bool = False, at_least: float = 0.0):
        return self.connection.call(pb_grpc.AdminServiceStub, method, request, no_deadline=no_deadline, at_least=at_least)

    # Agents

    def create_agent(self, agent_id: str, host: str, port: int, take_over: bool = False,
                     takeover_grant: str = "") -> pb.CreateAgentReply:
        """Register an agent; `take_over` takes its machine from the controller holding it, with the
        site's authority key if the controller has it, or with `takeover_grant` made for it by the site."""
        return self._call("CreateAgent", pb.CreateAgentRequest(id=agent_id, host=host, port=port, take_over=take_over,
                                                               takeover_grant=takeover_grant))

    def list_agents(self) -> list[pb.Agent]:
        return list(self._call("ListAgents", pb.ListRequest()).agents)

    def get_agent(self, agent_id: str) -> pb.Agent:
        return self._call("GetAgent", pb.GetRequest(id=agent_id))

    def remove_agent(self, agent_id: str, force: bool = False) -> list[str]:
        """Remove an agent; with `force`, what depended on it too: what was removed."""
        return list(self._call("RemoveAgent", pb.RemoveRequest(id=agent_id, force=force)).removed)

    def discover_agents(self, auto_add: bool = False) -> pb.DiscoverAgentsReply:
        return self._call("DiscoverAgents", pb.DiscoverAgentsRequest(auto_add=auto_add))

    # Clusters

    def create_cluster(self, cluster_id: str, agent_ids: tuple[str, ...], *, topology: int = pb.ILD_TOPOLOGY_MESH,
                       num_ipulinkdomains: int = 1, cluster_topology: int = pb.GW_TOPOLOGY_UNSPECIFIED) -> pb.Cluster:
        return self._call("CreateCluster", pb.CreateClusterRequest(
            id=cluster_id, agent_ids=agent_ids, topology=topology,  # type: ignore[arg-type]
            num_ipulinkdomains=num_ipulinkdomains, cluster_topology=cluster_topology))  # type: ignore[arg-type]

    def list_clusters(self) -> list[pb.Cluster]:
        return list(self._call("ListClusters", pb.ListRequest()).clusters)

    def get_cluster(self, cluster_id: str) -> pb.Cluster:
        return self._call("GetCluster", pb.GetRequest(id=cluster_id))

    def remove_cluster(self, cluster_id: str, force: bool = False) -> list[str]:
        return list(self._call("RemoveCluster", pb.RemoveRequest(id=cluster_id, force=force)).removed)

    def power_agent(self, agent_id: str, action: str, force: bool = False) -> pb.PowerAgentReply:
        """Power an agent's machine on, off, reset or cycle it (waiting until it gets there), or read
        its power state (`status`); forced, even with ACTIVE partitions there, which then fail and
        are reset once it answers again. A machine may take minutes to get there: the call waits
        POWER_CALL_SECONDS, longer than the controller's own bound."""
        return self._call("PowerAgent", pb.PowerAgentRequest(agent_id=agent_id, action=action, force=force), at_least=POWER_CALL_SECONDS)

    def drain_agents(self, agent_ids: list[str], reason: str, deadline: float = 0.0) -> list[pb.Agent]:
        """Drain the agents' machines, all or none (see `vipu-admin drain agent`), the partitions
        still there at `deadline` (seconds since the epoch; 0: none) then removed: the agents as they are then."""
        request = pb.DrainAgentsRequest(agent_ids=agent_ids, reason=reason, deadline=deadline)
        return list(self._call("DrainAgents", request, at_least=DRAIN_CALL_SECONDS).agents)

    def machines_of_link(self, link: str) -> list[str]:
        """The agents at both ends of a link's cable (AGENT:PORT, AGENT:syncN, AGENT:gwN), as its
        cluster is cabled; the agent alone for a link inside its machine."""
        name = LinkName.parse(link)
        if name.kind is None:
            return [name.agent_id]
        cluster_id = self.get_agent(name.agent_id).cluster_id
        if not cluster_id:
            raise InvalidArgument(f"agent {name.agent_id} is in no cluster, so no cable of its is known: drain the agent itself")
        for cable in self.cabling(cluster_id).cables:
            ends = ((cable.lower_agent_id, cable.lower_port), (cable.upper_agent_id, cable.upper_port))
            if cable.kind == name.kind.value and (name.agent_id, name.port) in ends:
                return [cable.lower_agent_id, cable.upper_agent_id]
        raise InvalidArgument(f"no cable of cluster {cluster_id} ends at {link}")

    def machines_of_domain(self, domain: str) -> list[str]:
        """The agents of an IPU-Link domain, CLUSTER:INDEX (cl0:0 the lowest), in rack order."""
        cluster_id, _, index = domain.rpartition(":")
        if not cluster_id or not index.isdigit():
            raise InvalidArgument(f"{domain!r} names no IPU-Link domain: give CLUSTER:INDEX (cl0:0)")
        ilds = ClusterLayout.of(cluster_from_proto(self.get_cluster(cluster_id))).ilds
        if int(index) >= len(ilds):
            raise InvalidArgument(f"cluster {cluster_id} has {len(ilds)} IPU-Link domain(s), numbered from 0: not {index}")
        return list(ilds[int(index)])

    def agent_ilds(self) -> dict[str, int]:
        """The IPU-Link domain of each agent of a cluster, in its cluster (0 the lowest)."""
        return agent_ilds(cluster_from_proto(cluster) for cluster in self.list_clusters())

    def resume_agents(self, agent_ids: list[str]) -> list[pb.Agent]:
        """End the drain of the agents' machines, all or none."""
        return list(self._call("ResumeAgents", pb.ResumeAgentsRequest(agent_ids=agent_ids), at_least=DRAIN_CALL_SECONDS).agents)

    # Allocations

    def create_allocation(self, allocation_id: str, cluster_id: str, *, agent_ids: tuple[str, ...] = (),
                          size: int = 0) -> pb.Allocation:
        """An allocation of these machines, or of `size` IPUs on consecutive free machines."""
        return self._call("CreateAllocation", pb.CreateAllocationRequest(
            id=allocation_id, cluster_id=cluster_id, agent_ids=agent_ids, size=size))

    def list_allocations(self) -> list[pb.Allocation]:
        return list(self._call("ListAllocations", pb.ListRequest()).allocations)

    def capacity(self, size: int = 0, *, allocation_id: str = "", cluster_id: str = "") -> user_pb.GetCapacityReply:
        """Room now in every allocation (or the one named, or a cluster's), as `UserClient.capacity`."""
        return self._call("GetCapacity", user_pb.GetCapacityRequest(size=size, allocation_id=allocation_id, cluster_id=cluster_id))

    def list_queued(self, allocation_id: str = "") -> list[user_pb.QueuedRequest]:
        """The requests waiting for room in every allocation (or one), each queue in order."""
        return list(self._call("ListQueued", user_pb.ListQueuedRequest(allocation_id=allocation_id)).requests)

    def cancel_queued(self, partition_id: str) -> None:
        """Cancel any user's request that waits for room."""
        self._call("CancelQueued", user_pb.CancelQueuedRequest(partition_id=partition_id))

    def create_reservation(self, name: str, start: float, end: float, reason: str, *, agent_ids: list[str] | None = None,
                           size: int = 0, allocation_id: str = "", maintenance: bool = False,
                           users: list[str] | None = None, accounts: list[str] | None = None) -> user_pb.Reservation:
        """Reserve machines, or `size` IPUs of an allocation, from `start` to `end` (seconds since the
        epoch): a maintenance window, or for `users` and the partitions of `accounts`."""
        return self._call("CreateReservation", pb.CreateReservationRequest(
            name=name, agent_ids=agent_ids or [], size=size, allocation_id=allocation_id, start=start, end=end, reason=reason,
            maintenance=maintenance, users=users or [], accounts=accounts or []))

    def apply_template(self, template: str, allocation_id: str, prefix: str = "", dry_run: bool = False,
                       account: str = "") -> pb.ApplyTemplateReply:
        """Make a template's partitions ("4x16") in an allocation (on `account`), all or none; with `dry_run`, where they would go."""
        return self._call("ApplyTemplate", pb.ApplyTemplateRequest(template=template, allocation_id=allocation_id, prefix=prefix,
                                                                   dry_run=dry_run, account=account))

    def remove_reservation(self, name: str) -> None:
        self._call("RemoveReservation", pb.RemoveRequest(id=name))

    def list_reservations(self, allocation_id: str = "") -> list[user_pb.Reservation]:
        """Every allocation's reservations (or one's), by start."""
        return list(self._call("ListReservations", user_pb.ListReservationsRequest(allocation_id=allocation_id)).reservations)

    def create_account(self, account: pb.Account) -> pb.Account:
        return self._call("CreateAccount", pb.CreateAccountRequest(account=account))

    def update_account(self, account: pb.Account, fields: list[str]) -> pb.Account:
        """Set the fields named as `account` has them: users, cohort, quotas (all of them); or quota
        (those given, each in its allocation) or no_quota (none in the allocations of those given)."""
        return self._call("UpdateAccount", pb.UpdateAccountRequest(account=account, fields=fields))

    def list_accounts(self) -> list[pb.Account]:
        return list(self._call("ListAccounts", pb.ListRequest()).accounts)

    def remove_account(self, name: str) -> None:
        self._call("RemoveAccount", pb.RemoveAccountRequest(name=name))

    def report_usage(self, by: str, since: float, until: float, allocation_id: str = "") -> list[pb.UsageRow]:
        """IPU-seconds used between `since` and `until` (seconds since the epoch), by account or by user."""
        return list(self._call("ReportUsage", pb.UsageReportRequest(by=by, since=since, until=until, allocation_id=allocation_id)).rows)

    def get_allocation(self, allocation_id: str) -> pb.Allocation:
        return self._call("GetAllocation", pb.GetRequest(id=allocation_id))

    def remove_allocation(self, allocation_id: str, force: bool = False) -> list[str]:
        return list(self._call("RemoveAllocation", pb.RemoveRequest(id=allocation_id, force=force)).removed)

    def compact_allocation(self, allocation_id: str, dry_run: bool = True) -> pb.CompactReply:
        """The plan of moves that frees the largest shape broken up in the allocation, carried out
        unless `dry_run`."""
        return self._call("CompactAllocation", pb.CompactRequest(allocation_id=allocation_id, dry_run=dry_run))

    # Users (secure mode)

    def create_user(self, user_id: str, allocation_ids: tuple[str, ...] = (), admin: bool = False) -> pb.UserKeyReply:
        """A user and their access key, which the reply carries this once."""
        return self._call("CreateUser", pb.CreateUserRequest(id=user_id, allocation_ids=allocation_ids, admin=admin))

    def list_users(self) -> list[pb.User]:
        return list(self._call("ListUsers", pb.ListRequest()).users)

    def get_user(self, user_id: str) -> pb.User:
        return self._call("GetUser", pb.GetRequest(id=user_id))

    def update_user(self, user_id: str, *, give: tuple[str, ...] = (), deny: tuple[str, ...] = (),
                    rotate_key: bool = False) -> pb.UserKeyReply:
        return self._call("UpdateUser", pb.UpdateUserRequest(
            id=user_id, give_allocations=give, deny_allocations=deny, rotate_key=rotate_key))

    def remove_user(self, user_id: str) -> None:
        self._call("RemoveUser", pb.RemoveRequest(id=user_id))

    # Cluster tests

    def cabling(self, cluster_id: str) -> pb.Cabling:
        """The cluster's cables, each with the verdict of its latest cluster test (passed, failed
        with the tests' lines, untested)."""
        return self._call("GetCabling", pb.GetRequest(id=cluster_id))

    def list_links(self, agent_id: str = "", unhealthy: bool = False, since: float = 0.0, partition_id: str = "") -> list[pb.Link]:
        """The links in the link ledger: one machine's or all; only the suspect and failed ones;
        only those whose health changed since a time (seconds since the epoch); only those a
        partition runs over now."""
        request = pb.ListLinksRequest(agent_id=agent_id, unhealthy=unhealthy, since=since, partition_id=partition_id)
        return list(self._call("ListLinks", request).links)

    def get_link(self, name: str, history: bool = False, since: float = 0.0, before: float = 0.0, limit: int = 0) -> pb.Link:
        """One link (`ag3:5`), with its samples, summaries, events and cables when `history`: the
        newest `limit` readings and events (0: the server's page) within `since` and `before`; how
        many older ones were left out, which `before` set to the first one sent reads next."""
        return self._call("GetLink", pb.GetLinkRequest(name=name, history=history, since=since, before=before, limit=limit))

    def read_machine_log(self, agent_id: str, after: int = 0, since: float = 0.0, grep: str = "", limit: int = 0,
                         wait: float = 0.0) -> pb.ReadMachineLogReply:
        """An agent's machine's log lines after line `after` (0: the latest `limit`), stamped at or
        after `since`, matching the regular expression `grep`; waiting up to `wait` seconds (at
        most 30) for one to come. The reply's `last` is the next call's `after`."""
        request = pb.ReadMachineLogRequest(agent_id=agent_id, after=after, since=since, grep=grep, limit=limit, wait_seconds=wait)
        return self._call("ReadMachineLog", request, at_least=wait + 10)

    def list_telemetry(self) -> list[pb.AgentTelemetry]:
        """Every machine's telemetry as the controller last collected it, with the partition each IPU runs."""
        return list(self._call("ListTelemetry", pb.ListRequest()).agents)

    def test_cluster(self, cluster_id: str, tests: tuple[str, ...] = (), wait: bool = True,
                     agent_ids: tuple[str, ...] = ()) -> pb.ClusterTestReport:
        """Run the cluster tests named (Sync-Link, Cabling, ...; none: the default suite), on the
        whole cluster or on these (drained) machines alone. With `wait`, the call lasts as long as
        the tests; without, it returns once they started."""
        return self._call("TestCluster", pb.TestClusterRequest(cluster_id=cluster_id, tests=tests, wait=wait, agent_ids=agent_ids),
                          no_deadline=wait)

    def cluster_test_status(self) -> pb.ClusterTestReport:
        """The results of the last finished test; a Conflict says why there are none."""
        return self._call("GetClusterTestStatus", pb.ListRequest())

    def cluster_test_progress(self) -> pb.ClusterTestReport:
        """The run under way (its state running, the test it is at, the results so far), or else
        the last run, however it ended."""
        return self._call("GetClusterTestProgress", pb.ListRequest())

    def stop_cluster_test(self) -> str:
        """Stop the running test after its current step; the cluster it was testing."""
        return self._call("StopClusterTest", pb.ListRequest()).cluster_id
