"""The controller's changes, counted as they happen, for clients that keep a live view.

vipu-web redraws a page when something it shows has changed. Rather than have it poll every
list, the controller publishes each change here once it is visible to readers (a partition's
once its owner publishes the commit, the configuration's, users' and cluster tests' once
committed), and the `WatchChanges` stream tells each watcher the topics changed since it last
heard, as far as it may see them: a user hears of the partitions of their own allocations, of
the configuration and of users (which decide what they see), never of cluster tests.

A watcher holds one of the end-point's threads while it waits, so watchers have a bounded number
of places (`MAX_WATCHERS`), of which one user of secure mode holds at most `MAX_WATCHERS_PER_USER`
so that no user can take them all; one past either is refused as temporarily unavailable, not
queued (vipu-web then reads afresh every 2 s, and tries to watch again). A watcher that goes away
gives its place back at once: the end-point `wake`s the feed when a call ends, and every wait
looks at `wanted()`.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum

from vipu.model.entities import Access
from vipu.model.errors import Unavailable

MAX_WATCHERS = 8
MAX_WATCHERS_PER_USER = 2  # a dashboard's and one more; open mode has no users, and only the total
KEPT_CHANGES = 4096  # a watcher further behind than this is told that everything changed
HEARTBEAT_SECONDS = 10.0


class Topic(str, Enum):
    PARTITIONS = "partitions"
    CONFIGURATION = "configuration"  # agents (their status too), clusters, allocations
    USERS = "users"
    TESTS = "tests"  # cluster test runs and their progress


@dataclass(frozen=True)
class Change:
    revision: int
    topic: Topic
    allocation_id: str = ""  # the allocation of the partition changed


def visible(change: Change, access: Access) -> bool:
    """Whether a caller may hear of a change."""
    if change.topic is Topic.PARTITIONS:
        return access.may_use(change.allocation_id)
    return change.topic in topics_for(access)


def topics_for(access: Access) -> set[Topic]:
    """The topics a caller may hear of, at least in part."""
    return set(Topic) if access.unrestricted else set(Topic) - {Topic.TESTS}


class ChangeFeed:
    def __init__(self, max_watchers: int = MAX_WATCHERS, max_per_user: int = MAX_WATCHERS_PER_USER):
        self.max_watchers = max_watchers
        self.max_per_user = max_per_user
        self._condition = threading.Condition()
        self._revision = 0
        self._recent: deque[Change] = deque(maxlen=KEPT_CHANGES)
        self._watchers: Counter[str] = Counter()  # user id ("" in open mode) -> the places they hold
        self._closed = False

    @property
    def revision(self) -> int:
        with self._condition:
            return self._revision

    def publish(self, topic: Topic, allocation_id: str = "") -> None:
        with self._condition:
            self._revision += 1
            self._recent.append(Change(self._revision, topic, allocation_id))
            self._condition.notify_all()

    def wake(self) -> None:
        """Let every waiter look again (one of them has gone away)."""
        with self._condition:
            self._condition.notify_all()

    def close(self) -> None:
        """The controller stops: waiters return at once, and no wait blocks from now on."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()

    @contextmanager
    def watcher(self, user_id: str = "") -> Iterator[None]:
        """One watcher's place, or Unavailable when every place is taken, or when the user (of
        secure mode) holds as many as one may."""
        with self._condition:
            if self._watchers.total() >= self.max_watchers:
                raise Unavailable(f"{self.max_watchers} clients watch this controller's changes already; try again later")
            if user_id and self._watchers[user_id] >= self.max_per_user:
                raise Unavailable(f"user {user_id} watches this controller's changes {self.max_per_user} times already, "
                                  "as often as one user may; end a watch or try again later")
            self._watchers[user_id] += 1
        try:
            yield
        finally:
            with self._condition:
                self._watchers[user_id] -= 1
                if not self._watchers[user_id]:
                    del self._watchers[user_id]

    def watch(self, access: Access, wanted: Callable[[], bool], heartbeat: float = HEARTBEAT_SECONDS) -> Iterator[set[Topic]]:
        """One watcher's changes: at once no topics (the watch is in place), then the topics
        changed as they change, and no topics after every `heartbeat` seconds of quiet, while
        `wanted()` and the feed is open. After a change of users it ends, so that the watcher
        comes back with what it now may see (a user removed or whose key was replaced does not)."""
        with self.watcher(access.user_id):
            after = self.revision
            yield set()
            while wanted() and not self._closed:
                after, topics = self.wait(after, access, heartbeat, wanted)
                if self._closed or not wanted():
                    return
                yield topics
                if Topic.USERS in topics:
                    return

    def wait(self, after: int, access: Access, timeout: float, wanted: Callable[[], bool] = lambda: True) -> tuple[int, set[Topic]]:
        """The topics `access` may see changed after revision `after`, and the revision to wait
        after next; waits up to `timeout` seconds for one if there is none yet (then the topics
        are empty), and no longer once `wanted()` is false. Revisions count every change, so they
        are not shown to callers."""
        seen: set[Topic] = set()
        scanned = after  # each look reads only the changes published since the last

        def ready() -> bool:
            nonlocal scanned
            if self._revision > scanned:
                seen.update(self._seen_since(scanned, access))
                scanned = self._revision
            return bool(seen) or self._closed or not wanted()

        with self._condition:
            self._condition.wait_for(ready, timeout)
            return scanned, seen

    def _seen_since(self, after: int, access: Access) -> set[Topic]:
        if self._revision <= after:
            return set()
        if not self._recent or self._recent[0].revision > after + 1:  # fell behind what is kept
            return topics_for(access)
        seen = set()
        for change in reversed(self._recent):  # the newest first: a waiter near the end reads only what is new
            if change.revision <= after:
                break
            if visible(change, access):
                seen.add(change.topic)
        return seen
