"""One viewer's window on the controller: their clients, what was last read, and a watch saying
what to read again.

Every page is drawn from the public API with the viewer's own credentials, so a user sees what
the controller lets them see and nothing more. Reading every list for every page would load the
controller of a large pod for nothing, so a `Source` keeps what it read and reads a part again
only once `WatchChanges` says it changed; while the watch is not in place (the controller is
restarting, say) nothing is kept and pages read afresh, and the watch is tried again every
`RETRY_SECONDS`. Listeners (the pages' event streams) are told which parts changed. Once the
watch is in place its thread reads every part, so that the first page finds them read (reading
again at every change would read more often than pages redraw). One part is read by one thread
at a time; another wanting it meanwhile takes that read's result.

The controller ends every watch after a change of users; the watch is placed again at once. A
watch that hears nothing for `QUIET_SECONDS`, not even the controller's heartbeat, is given up as
broken: a controller that vanished without closing its connection (its host lost, its process
stopped) would otherwise leave the pages "Live" on what they last read. Once the controller
refuses the viewer's key (replaced, or the user removed) the source stops at once and tells
`on_refused`, which ends the viewer's sessions: every further try would cost the controller a
scrypt and count towards its lockout of the user from the dashboard's address.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from vipu.api.protos import admin_pb2, vipuuser_pb2
from vipu.client import AdminClient, Conflict, NotFound, PermissionDenied, Stream, Unauthenticated, Unavailable, UserClient, VipuError
from vipu.client.settings import ClientSettings

log = logging.getLogger(__name__)

RETRY_SECONDS = 2.0
TIMEOUT_SECONDS = 15.0
QUIET_SECONDS = 25.0  # the controller's heartbeat comes every 10 s: two of them missed, and then some

# The parts of what a viewer sees, and the topics of WatchChanges that change each.
PARTS = ("partitions", "allocations", "agents", "clusters", "tests")
_CHANGED_BY = {
    "partitions": {"partitions"},
    "configuration": {"agents", "clusters", "allocations"},
    "users": {"allocations"},
    "tests": {"tests"},
}


@dataclass(frozen=True)
class Viewer:
    user_id: str  # "" in open mode
    admin: bool  # sees the pod itself: agents, clusters, their cabling, cluster tests


def _tests(admin: AdminClient) -> admin_pb2.ClusterTestReport | None:
    try:
        return admin.cluster_test_progress()
    except Conflict:  # no test has run
        return None


class Source:
    def __init__(self, settings: ClientSettings, admin_port: int, viewer: Viewer,
                 on_refused: Callable[[Source], None] = lambda source: None):
        self.viewer = viewer
        self.on_refused = on_refused
        self.user = UserClient(settings, timeout=TIMEOUT_SECONDS)
        self.admin = AdminClient(replace(settings, port=admin_port), timeout=TIMEOUT_SECONDS) if viewer.admin else None
        self.problem = ""  # why the watch is not in place, for the pages to say
        self.refused = False  # the controller no longer accepts the viewer's credentials
        self._lock = threading.Lock()
        self._kept: dict[str, object] = {}
        self._generations = dict.fromkeys(PARTS, 0)  # each part's count of changes heard, to know a reading is current
        # One read of a part at a time, held across that one API call (bounded by TIMEOUT_SECONDS):
        # a page of a thousand machines should not make the controller list them twice at once.
        self._reading = {part: threading.Lock() for part in PARTS}
        self._watching = False
        self.version = 0  # counts the changes heard: a page drawn at one version learns of later ones when it listens
        self._listeners: set[Callable[[set[str]], None]] = set()
        self._stream: Stream | None = None  # the watch under way
        self._heard_at = 0.0  # when it last said anything (time.monotonic)
        self._closed = threading.Event()
        name = viewer.user_id or "open"
        self._thread = threading.Thread(target=self._watch, name=f"watch-{name}", daemon=True)
        self._thread.start()
        threading.Thread(target=self._end_quiet_watches, name=f"watch-guard-{name}", daemon=True).start()

    # Reading

    def partitions(self) -> list[vipuuser_pb2.Partition]:
        return self._read("partitions", lambda: self.user.list_partitions())  # type: ignore[return-value]

    def allocations(self) -> list[vipuuser_pb2.Allocation]:
        """The allocations the viewer may use (for an administrator, every one)."""
        return self._read("allocations", lambda: self.user.list_allocations())  # type: ignore[return-value]

    def agents(self) -> list[admin_pb2.Agent]:
        return self._read("agents", lambda: self._admin().list_agents())  # type: ignore[return-value]

    def clusters(self) -> list[admin_pb2.Cluster]:
        return self._read("clusters", lambda: self._admin().list_clusters())  # type: ignore[return-value]

    def tests(self) -> admin_pb2.ClusterTestReport | None:
        """The cluster test under way, or else the last one; None when none has run."""
        return self._read("tests", lambda: _tests(self._admin()))  # type: ignore[return-value]

    def accounts(self) -> list[admin_pb2.Account] | None:
        """The accounts, each with what it holds against its quota (read each time, as the
        reservations are); None for a viewer who is no administrator."""
        if self.admin is None:
            return None
        return self.admin.list_accounts()

    def reservations(self) -> list[vipuuser_pb2.Reservation]:
        """The reservations of the allocations the viewer may use (read each time: the change feed
        does not carry them); none when it cannot say (a controller from before them does not
        offer the call), so that the racks page, read first, is drawn all the same."""
        try:
            return self.user.list_reservations()
        except Unavailable:
            return []

    def telemetry_or_none(self) -> list[admin_pb2.AgentTelemetry] | None:
        """Every machine's telemetry as the controller last collected it (read each time: it changes
        by the second); None from a controller that does not collect it, so that the page goes without."""
        try:
            return self._admin().list_telemetry()
        except Unavailable:
            return None

    def machine_log(self, agent_id: str, grep: str = "", lines: int = 200) -> list:
        """A machine's latest log lines (those matching `grep`), oldest first."""
        return list(self._admin().read_machine_log(agent_id, grep=grep, limit=lines).lines)

    def cabling(self, cluster_id: str) -> admin_pb2.Cabling:
        return self._admin().cabling(cluster_id)

    def unhealthy_links(self) -> dict[str, admin_pb2.Link]:
        """The link ledger's suspect and failed links, by name."""
        return {link.name: link for link in self._admin().list_links(unhealthy=True)}

    def links_named(self, names: Iterable[str]) -> dict[str, admin_pb2.Link]:
        """These links as the ledger has them now, by name; one it has never read is left out. One
        call each: for a few links (the healthy ends of unhealthy cables), not for a pod's every
        link, which in one ListLinks outgrows a gRPC message on a large pod."""
        found = {}
        for name in names:
            with contextlib.suppress(NotFound):
                found[name] = self._admin().get_link(name)
        return found

    def link_history(self, name: str, since: float = 0.0) -> admin_pb2.Link:
        """One link with what the ledger kept of it from `since` (0: all): readings, summaries,
        events and cables."""
        return self._admin().get_link(name, history=True, since=since)

    def _admin(self) -> AdminClient:
        if self.admin is None:
            raise PermissionDenied("only administrators see the pod's machines, cabling and cluster tests")
        return self.admin

    def _read(self, part: str, fetch: Callable[[], object]):
        if self.refused:  # asking again would only cost the controller a scrypt, and count as a failed login
            raise Unauthenticated(self.problem)
        with self._lock:
            if self._watching and part in self._kept:
                return self._kept[part]
        with self._reading[part]:
            with self._lock:
                if self._watching and part in self._kept:  # read by the thread this one waited for
                    return self._kept[part]
                generation = self._generations[part]
            try:
                value = fetch()
            except Unauthenticated as error:
                self._refused(error.message)
                raise
            with self._lock:
                if self._watching and self._generations[part] == generation:  # no change heard while it was read
                    self._kept[part] = value
            return value

    def _read_all(self) -> None:
        """Read every part the viewer may see, before a page asks (on the watch's thread)."""
        readers = [self.partitions, self.allocations]
        if self.admin is not None:
            readers += [self.agents, self.clusters, self.tests]
        for read in readers:
            if self._closed.is_set():
                return
            try:
                read()
            except VipuError as error:  # a page reading it will meet the same and say so
                log.info("reading what %s sees: %s", self.viewer.user_id or "the dashboard", error.message)

    # Changes

    def listen(self, listener: Callable[[set[str]], None]) -> Callable[[], None]:
        """Tell `listener` the parts that change, from the watch's thread; returns how to stop."""
        with self._lock:
            self._listeners.add(listener)
        return lambda: self._unlisten(listener)

    def _unlisten(self, listener: Callable[[set[str]], None]) -> None:
        with self._lock:
            self._listeners.discard(listener)

    @property
    def watching(self) -> bool:
        return self._watching

    def _changed(self, parts: set[str], watching: bool) -> None:
        with self._lock:
            self._watching = watching
            self.version += 1
            for part in parts:
                self._generations[part] += 1
                self._kept.pop(part, None)
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(parts)
            except Exception:  # one page's stream failing must not stop the watch for the others
                log.exception("telling a page of a change failed")

    def _watch(self) -> None:
        logged = None  # the last problem logged: one that comes back every RETRY_SECONDS (a controller starting) is logged once
        while not self._closed.is_set():
            try:
                ended = self._follow()
            except Unauthenticated as error:
                self._refused(error.message)
                return
            except VipuError as error:
                ended = error.message
            if self._closed.is_set():
                return
            if ended is None:
                logged = None
                continue
            self.problem = ended
            self._changed(set(PARTS), watching=False)
            if ended != logged:
                log.info("watching vipu-server's changes for %s: %s%s", self.viewer.user_id or "the dashboard", ended,
                         f" (trying again every {RETRY_SECONDS:g} s)")
                logged = ended
            self._closed.wait(RETRY_SECONDS)

    def _follow(self) -> str | None:
        """Place a watch and follow it to its end: None when it ended as designed, after a change
        of users (to be placed again at once), else why it ended."""
        stream = self.user.watch_changes()
        with self._lock:
            self._stream, self._heard_at = stream, time.monotonic()
        first, users_changed = True, False
        for change in stream:
            with self._lock:
                self._heard_at = time.monotonic()
            if first:  # in place: whatever was read before may have missed a change
                self.problem, first = "", False
                self._changed(set(PARTS), watching=True)
                self._read_all()
                with self._lock:  # the reading took its time, not the watch's
                    self._heard_at = time.monotonic()
            elif "users" in change.topics:  # the last message: the watch placed again reads all the viewer now may see
                users_changed = True
            elif change.topics:
                self._changed({p for topic in change.topics for p in _CHANGED_BY.get(topic, ())}, watching=True)
        if stream.cancelled:
            return f"vipu-server said nothing for {QUIET_SECONDS:.0f} s"
        return None if users_changed else "vipu-server ended the watch"

    def _end_quiet_watches(self) -> None:
        """Cancel the watch once it has said nothing for QUIET_SECONDS (on a thread of its own)."""
        while not self._closed.wait(QUIET_SECONDS / 5):
            with self._lock:
                stream, quiet = self._stream, time.monotonic() - self._heard_at
            if stream is not None and quiet > QUIET_SECONDS:
                stream.cancel()

    def _refused(self, message: str) -> None:
        """The controller refuses the viewer's key: stop, and end the viewer's sessions now."""
        with self._lock:
            if self.refused:
                return
            self.refused, self.problem = True, message
        log.info("vipu-server refuses the key of %s (%s): their sessions end", self.viewer.user_id, message)
        self.on_refused(self)
        self.close()
        self._changed(set(PARTS), watching=False)  # the pages' event streams look, and find their session ended

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.cancel()
        self.user.close()
        if self.admin is not None:
            self.admin.close()
