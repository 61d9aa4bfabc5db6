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
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from vipu.api.protos import admin_pb2, vipuuser_pb2
from vipu.client import AdminClient, Conflict, PermissionDenied, Stream, Unauthenticated, UserClient, VipuError
from vipu.client.settings import ClientSettings

log = logging.getLogger(__name__)

RETRY_SECONDS = 2.0
TIMEOUT_SECONDS = 15.0

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
    def __init__(self, settings: ClientSettings, admin_port: int, viewer: Viewer):
        self.viewer = viewer
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
        self._stream: Stream | None = None
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"watch-{viewer.user_id or 'open'}", daemon=True)
        self._thread.start()

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

    def cabling(self, cluster_id: str) -> admin_pb2.Cabling:
        return self._admin().cabling(cluster_id)

    def _admin(self) -> AdminClient:
        if self.admin is None:
            raise PermissionDenied("only administrators see the pod's machines, cabling and cluster tests")
        return self.admin

    def _read(self, part: str, fetch: Callable[[], object]):
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
            except Unauthenticated:
                self.refused = True
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
        while not self._closed.is_set():
            try:
                self._stream = self.user.watch_changes()
                first = True
                for change in self._stream:
                    if first:  # in place: whatever was read before may have missed a change
                        self.problem, first = "", False
                        self._changed(set(PARTS), watching=True)
                        self._read_all()
                    elif change.topics:
                        self._changed({p for topic in change.topics for p in _CHANGED_BY.get(topic, ())}, watching=True)
            except Unauthenticated as error:
                self.refused, self.problem = True, error.message
            except VipuError as error:
                self.problem = error.message
            if self._closed.is_set():
                return
            self._changed(set(PARTS), watching=False)
            if self.problem:
                log.info("watching vipu-server's changes for %s: %s", self.viewer.user_id or "the dashboard", self.problem)
            self._closed.wait(RETRY_SECONDS)

    def close(self) -> None:
        self._closed.set()
        if self._stream is not None:
            self._stream.cancel()
        self.user.close()
        if self.admin is not None:
            self.admin.close()
