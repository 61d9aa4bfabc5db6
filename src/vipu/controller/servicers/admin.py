"""The admin end-point: agents, clusters and allocations."""

from __future__ import annotations

import math

from vipu.api import convert
from vipu.api.protos import admin_pb2 as pb
from vipu.api.protos import admin_pb2_grpc as pb_grpc
from vipu.api.protos import vipuuser_pb2 as user_pb
from vipu.controller.auth import caller
from vipu.controller.infrastructure.discovery import DiscoveryListener
from vipu.controller.servicers.user import capacity_reply, queued_reply, reservations_reply
from vipu.controller.usecases.accounts import AccountService
from vipu.controller.usecases.agents import AgentService, AgentView
from vipu.controller.usecases.allocations import AllocationService
from vipu.controller.usecases.clusters import ClusterService
from vipu.controller.usecases.clustertests import WAIT_SECONDS, ClusterTestService
from vipu.controller.usecases.links import LinkLedger
from vipu.controller.usecases.partitions import PartitionService
from vipu.controller.usecases.requests import RequestService
from vipu.controller.usecases.telemetry import TelemetryService
from vipu.controller.usecases.users import UserService
from vipu.model.clustertests import TestRun, TestType
from vipu.model.entities import Role, User
from vipu.model.errors import Conflict, InvalidArgument, Unavailable
from vipu.model.hardware import PowerAction
from vipu.model.linkhealth import LinkName
from vipu.model.templates import Template


def _agent(view: AgentView) -> pb.Agent:
    return convert.agent_to_proto(view.agent, view.cluster_id, view.allocation_id, view.ipus, view.draining_partitions)


def _report(run: TestRun) -> pb.ClusterTestReport:
    return convert.test_report_to_proto(run.cluster_id, run.state.value, run.outcomes)


def _test_type(name: str) -> TestType:
    try:
        return TestType(name)
    except ValueError:
        raise InvalidArgument(f"unknown cluster test {name!r}; the tests are {', '.join(t.value for t in TestType)}") from None


def _power_action(name: str) -> PowerAction:
    try:
        return PowerAction(name)
    except ValueError:
        actions = ", ".join(a.value for a in PowerAction)
        raise InvalidArgument(f"unknown power action {name!r}; the actions are {actions} and status") from None


def _user(user: User) -> pb.User:
    return pb.User(id=user.id, admin=user.role is Role.ADMIN, allocation_ids=user.allocation_ids)


MOST_LOG_WAIT_SECONDS = 30.0  # a following read waits at most this long per call, then the client asks again

class AdminServicer(pb_grpc.AdminServiceServicer):
    def __init__(self, agents: AgentService, clusters: ClusterService, allocations: AllocationService,
                 clustertests: ClusterTestService, discovery: DiscoveryListener | None, users: UserService | None,
                 user_port: int, partitions: PartitionService, requests: RequestService, links: LinkLedger,
                 accounts: AccountService | None = None, telemetry: TelemetryService | None = None):
        self.partitions = partitions
        self.telemetry = telemetry
        self.accounts = accounts or AccountService(partitions.store, partitions.owners)
        self.links = links
        self.requests = requests
        self.agents = agents
        self.clusters = clusters
        self.allocations = allocations
        self.clustertests = clustertests
        self.discovery = discovery
        self.users = users  # None in open mode
        self.user_port = user_port

    def _users(self) -> UserService:
        if self.users is None:
            raise Conflict("this controller runs in open mode, without users; start vipu-server with --secure")
        return self.users

    def CreateAgent(self, request, context):
        agent = self.agents.create(request.id, request.host, request.port, take_over=request.take_over,
                                   takeover_grant=request.takeover_grant)
        return pb.CreateAgentReply(agent=convert.agent_to_proto(agent))

    def ListAgents(self, request, context):
        return pb.ListAgentsReply(agents=[_agent(view) for view in self.agents.list()])

    def GetAgent(self, request, context):
        return _agent(self.agents.get(request.id))

    def RemoveAgent(self, request, context):
        return pb.RemoveReply(removed=self.agents.remove(request.id, force=request.force))

    def PowerAgent(self, request, context):
        action = None if request.action == "status" else _power_action(request.action)
        state, failed = self.agents.power(request.agent_id, action, force=request.force)
        return pb.PowerAgentReply(power_state=state.value, failed_partitions=failed)

    def DrainAgents(self, request, context):
        drained = self.agents.drain(list(request.agent_ids), request.reason, caller().user_id, request.deadline)
        return pb.ListAgentsReply(agents=[_agent(view) for view in drained])

    def ResumeAgents(self, request, context):
        return pb.ListAgentsReply(agents=[_agent(view) for view in self.agents.resume(list(request.agent_ids))])

    def CreateCluster(self, request, context):
        return convert.cluster_to_proto(self.clusters.create(convert.cluster_request_from_proto(request)))

    def ListClusters(self, request, context):
        return pb.ListClustersReply(clusters=[convert.cluster_to_proto(c, a) for c, a in self.clusters.list()])

    def GetCluster(self, request, context):
        return convert.cluster_to_proto(*self.clusters.get(request.id))

    def RemoveCluster(self, request, context):
        return pb.RemoveReply(removed=self.clusters.remove(request.id, force=request.force))

    def CreateAllocation(self, request, context):
        allocation = self.allocations.create(request.id, request.cluster_id, tuple(request.agent_ids), request.size)
        return convert.admin_allocation_to_proto(allocation)

    def ListAllocations(self, request, context):
        return pb.ListAllocationsReply(allocations=[convert.admin_allocation_to_proto(a, p) for a, p in self.allocations.list()])

    def GetCapacity(self, request, context):
        return capacity_reply(self.partitions.capacity(request.size, request.allocation_id, request.cluster_id))

    def ListQueued(self, request, context):
        return queued_reply(self.requests.list(request.allocation_id))

    def CancelQueued(self, request, context):
        self.requests.cancel(request.partition_id, caller())
        return user_pb.CancelQueuedReply()

    def CreateReservation(self, request, context):
        view = self.partitions.reservations.create(
            request.name, request.start, request.end, request.reason, caller().user_id, agent_ids=tuple(request.agent_ids),
            size=request.size, allocation_id=request.allocation_id, maintenance=request.maintenance, users=tuple(request.users),
            accounts=tuple(request.accounts))
        return convert.reservation_to_proto(view.reservation, view.ipus_in_use)

    def RemoveReservation(self, request, context):
        return pb.RemoveReply(removed=[self.partitions.reservations.remove(request.id).name])

    def ListReservations(self, request, context):
        return reservations_reply(self.partitions.reservations.list(request.allocation_id))

    def CreateAccount(self, request, context):
        view = self.accounts.create(convert.account_from_proto(request.account))
        return convert.account_to_proto(view.account, view.use)

    def UpdateAccount(self, request, context):
        view = self.accounts.update(convert.account_from_proto(request.account), request.fields)
        return convert.account_to_proto(view.account, view.use)

    def ListAccounts(self, request, context):
        return pb.ListAccountsReply(accounts=[convert.account_to_proto(v.account, v.use) for v in self.accounts.list()])

    def RemoveAccount(self, request, context):
        self.accounts.remove(request.name)
        return pb.RemoveReply(removed=[request.name])

    def ReportUsage(self, request, context):
        rows = self.accounts.report(request.by or "account", request.since, request.until, request.allocation_id)
        return pb.UsageReportReply(rows=[pb.UsageRow(key=r.key, ipu_seconds=r.ipu_seconds, partitions=r.partitions) for r in rows])

    def GetAllocation(self, request, context):
        return convert.admin_allocation_to_proto(*self.allocations.get(request.id))

    def RemoveAllocation(self, request, context):
        return pb.RemoveReply(removed=self.allocations.remove(request.id, force=request.force))

    def CompactAllocation(self, request, context):
        return convert.compaction_to_proto(self.allocations.compact(request.allocation_id, dry_run=request.dry_run,
                                                                    asked_by="an administrator"))

    def ApplyTemplate(self, request, context):
        made = self.allocations.apply_template(request.allocation_id, Template.parse(request.template), request.prefix,
                                               dry_run=request.dry_run, account=request.account, access=caller())
        return pb.ApplyTemplateReply(partitions=[convert.partition_to_proto(p) for p in made], dry_run=request.dry_run)

    def TestCluster(self, request, context):
        tests = {_test_type(name) for name in request.tests}
        remaining = context.time_remaining()  # the caller's deadline bounds the wait for the run's end
        return _report(self.clustertests.start(request.cluster_id, tests, wait=request.wait,
                                               wait_seconds=WAIT_SECONDS if remaining is None else min(remaining, WAIT_SECONDS),
                                               machines=tuple(dict.fromkeys(request.agent_ids))))

    def GetClusterTestStatus(self, request, context):
        return _report(self.clustertests.status())

    def GetClusterTestProgress(self, request, context):
        run, running_test = self.clustertests.progress()
        return convert.test_report_to_proto(run.cluster_id, run.state.value, run.outcomes,
                                            running_test.value if running_test else "", tuple(t.value for t in run.tests))

    def StopClusterTest(self, request, context):
        return pb.StopClusterTestReply(cluster_id=self.clustertests.stop())

    def DiscoverAgents(self, request, context):
        if self.discovery is None:
            raise Conflict("agent discovery is off; start vipu-server with -a/--autodiscovery-listen-interfaces")
        sightings = self.discovery.sightings()
        reply = pb.DiscoverAgentsReply()
        if request.auto_add:
            added, failures = self.agents.auto_add([(s.host, s.port) for s in sightings])
            reply.added.extend(added)
            reply.failures.extend(failures)
        registered = {(v.agent.host, v.agent.port): v.agent.id for v in self.agents.list()}
        reply.agents.extend(
            pb.DiscoveredAgent(host=s.host, port=s.port, interface=s.interface, seconds_since_seen=s.seconds_since_seen,
                               auto_add_id=f"{s.host}-{s.port}", registered_as=registered.get((s.host, s.port), ""))
            for s in sightings
        )
        return reply

    def CreateUser(self, request, context):
        user, key = self._users().create(request.id, tuple(request.allocation_ids), admin=request.admin)
        return pb.UserKeyReply(user=_user(user), access_key=key, user_port=self.user_port)

    def ListUsers(self, request, context):
        return pb.ListUsersReply(users=[_user(u) for u in self._users().list()])

    def GetUser(self, request, context):
        return _user(self._users().get(request.id))

    def UpdateUser(self, request, context):
        user, key = self._users().update(request.id, tuple(request.give_allocations), tuple(request.deny_allocations),
                                         rotate=request.rotate_key)
        return pb.UserKeyReply(user=_user(user), access_key=key, user_port=self.user_port)

    def RemoveUser(self, request, context):
        self._users().remove(request.id)
        return pb.RemoveReply()

    def ListLinks(self, request, context):
        states = self.links.links(request.agent_id or None, request.unhealthy, request.since or None, request.partition_id)
        return pb.ListLinksReply(links=[convert.link_to_proto(state) for state in states])

    def GetLink(self, request, context):
        detail = self.links.detail(LinkName.parse(request.name), request.since, request.before, request.limit)
        return convert.link_history_to_proto(detail) if request.history else convert.link_to_proto(detail.state)

    def ReadMachineLog(self, request, context):
        if self.telemetry is None:
            raise Unavailable("this controller does not collect machine logs")
        for name, value in (("since", request.since), ("wait_seconds", request.wait_seconds)):
            if not math.isfinite(value) or value < 0:
                raise InvalidArgument(f"{name} must be a number of seconds from 0, not {value!r}")
        lines, last = self.telemetry.log(request.agent_id, request.after, request.since, request.grep, request.limit,
                                         min(request.wait_seconds, MOST_LOG_WAIT_SECONDS))
        return pb.ReadMachineLogReply(lines=[convert.log_line_to_proto(line) for line in lines], last=last)

    def ListTelemetry(self, request, context):
        if self.telemetry is None:
            raise Unavailable("this controller does not collect telemetry")
        held = {ipu.agent_id + ":" + str(ipu.index): p.id for p in self.partitions.list() for ipu in p.ipus}
        reply = pb.ListTelemetryReply()
        for agent_id, latest in sorted(self.telemetry.machines().items()):
            entry = reply.agents.add(agent_id=agent_id, telemetry=convert.telemetry_to_proto(latest.reading, latest.age_now()))
            for ipu in latest.reading.ipus:
                partition = held.get(f"{agent_id}:{ipu.index}")
                if partition:
                    entry.partitions[ipu.index] = partition
        return reply

    def GetCabling(self, request, context):
        state, cables = self.clustertests.cabling(request.id)
        return convert.cabling_to_proto(request.id, state.value if state is not None else "", cables)
