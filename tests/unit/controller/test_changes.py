"""The change feed behind WatchChanges: who hears of what, when a watch ends, and its bound."""

from __future__ import annotations

import threading

import pytest

from vipu.controller.core.changes import KEPT_CHANGES, ChangeFeed, Topic
from vipu.model.entities import OPEN_ACCESS, Access
from vipu.model.errors import Unavailable

ALICE = Access("alice", frozenset({"a1"}))


def test_a_user_hears_of_their_allocations_partitions_and_the_configuration_never_of_tests():
    feed = ChangeFeed()
    for topic, allocation in ((Topic.PARTITIONS, "a2"), (Topic.TESTS, ""), (Topic.PARTITIONS, "a1"), (Topic.CONFIGURATION, "")):
        feed.publish(topic, allocation)
    assert feed.wait(0, ALICE, timeout=0) == (4, {Topic.PARTITIONS, Topic.CONFIGURATION})
    assert feed.wait(0, OPEN_ACCESS, timeout=0) == (4, {Topic.PARTITIONS, Topic.CONFIGURATION, Topic.TESTS})
    assert feed.wait(2, ALICE, timeout=0) == (4, {Topic.PARTITIONS, Topic.CONFIGURATION})
    assert feed.wait(4, ALICE, timeout=0) == (4, set())


def test_a_wait_ends_at_the_first_change_the_watcher_may_see():
    feed = ChangeFeed()
    looks = threading.Semaphore(0)  # released each time the waiter looks at the feed, holding its lock

    def looking() -> bool:
        looks.release()
        return True

    seen: list = []
    waiting = threading.Thread(target=lambda: seen.append(feed.wait(0, ALICE, timeout=30, wanted=looking)))
    waiting.start()
    assert looks.acquire(timeout=5)  # it looked, found nothing, and waits: a publish now wakes it
    feed.publish(Topic.PARTITIONS, "a2")  # another tenant's: alice looks and goes on waiting
    assert looks.acquire(timeout=5)
    feed.publish(Topic.TESTS)
    assert looks.acquire(timeout=5)
    assert seen == []
    feed.publish(Topic.PARTITIONS, "a1")
    waiting.join(5)
    assert seen == [(3, {Topic.PARTITIONS})]


def test_a_waiter_judges_each_change_once_however_many_it_may_not_see_pile_up():
    judged: list[str] = []

    class Judged(Access):
        def may_use(self, allocation_id: str) -> bool:
            judged.append(allocation_id)
            return super().may_use(allocation_id)

    feed = ChangeFeed()
    looks = threading.Semaphore(0)

    def looking() -> bool:
        looks.release()
        return True

    waiting = threading.Thread(target=lambda: feed.wait(0, Judged("alice", frozenset({"a1"})), timeout=30, wanted=looking))
    waiting.start()
    assert looks.acquire(timeout=5)
    for _ in range(100):  # another tenant's: each wakes alice's waiter, which reads only what is new
        feed.publish(Topic.PARTITIONS, "a2")
        assert looks.acquire(timeout=5)
    feed.publish(Topic.PARTITIONS, "a1")
    waiting.join(5)
    assert judged == ["a2"] * 100 + ["a1"]


def test_a_watcher_too_far_behind_hears_that_everything_it_may_see_changed():
    feed = ChangeFeed()
    for _ in range(KEPT_CHANGES + 1):
        feed.publish(Topic.PARTITIONS, "a2")
    assert feed.wait(0, ALICE, timeout=0)[1] == {Topic.PARTITIONS, Topic.CONFIGURATION, Topic.USERS}
    assert feed.wait(1, ALICE, timeout=0)[1] == set()  # the kept changes, none of them alice's


def test_a_watch_starts_empty_beats_when_quiet_and_ends_after_a_change_of_users():
    feed = ChangeFeed()
    watch = feed.watch(ALICE, wanted=lambda: True, heartbeat=0.01)
    assert next(watch) == set()  # in place
    assert next(watch) == set()  # a heartbeat
    feed.publish(Topic.PARTITIONS, "a1")
    assert next(watch) == {Topic.PARTITIONS}
    feed.publish(Topic.USERS)
    assert next(watch) == {Topic.USERS}
    with pytest.raises(StopIteration):
        next(watch)


def test_a_watcher_that_goes_away_gives_its_place_back_at_once():
    feed = ChangeFeed(max_watchers=1)
    gone = threading.Event()
    watch = feed.watch(OPEN_ACCESS, wanted=lambda: not gone.is_set(), heartbeat=60)
    assert next(watch) == set()
    waiting = threading.Thread(target=lambda: list(watch))  # for a change, or a minute of quiet
    waiting.start()
    with pytest.raises(Unavailable):
        next(feed.watch(OPEN_ACCESS, wanted=lambda: True))
    gone.set()
    feed.wake()  # as the end-point does when a call ends
    waiting.join(5)
    assert not waiting.is_alive()
    assert next(feed.watch(OPEN_ACCESS, wanted=lambda: True)) == set()  # its place


def test_one_user_holds_at_most_their_share_of_the_places_and_open_mode_only_the_total():
    feed = ChangeFeed(max_watchers=5, max_per_user=2)
    alices = [feed.watch(ALICE, wanted=lambda: True) for _ in range(3)]
    assert next(alices[0]) == next(alices[1]) == set()
    with pytest.raises(Unavailable, match=r"^user alice watches this controller's changes 2 times already, as often as one"):
        next(alices[2])
    bobs = feed.watch(Access("bob", frozenset()), wanted=lambda: True)
    assert next(bobs) == set()
    alices[0].close()  # its call ended
    alices.append(feed.watch(ALICE, wanted=lambda: True))
    assert next(alices[-1]) == set()
    anonymous = [feed.watch(OPEN_ACCESS, wanted=lambda: True) for _ in range(3)]  # a user's share does not bound them
    assert next(anonymous[0]) == next(anonymous[1]) == set()
    with pytest.raises(Unavailable, match=r"^5 clients watch this controller's changes already"):
        next(anonymous[2])


def test_watchers_have_a_bounded_number_of_places_and_closing_ends_every_watch():
    feed = ChangeFeed(max_watchers=2)
    watches = [feed.watch(OPEN_ACCESS, wanted=lambda: True) for _ in range(3)]
    next(watches[0]), next(watches[1])
    with pytest.raises(Unavailable, match="2 clients watch"):
        next(watches[2])
    ended = threading.Thread(target=lambda: list(watches[0]))
    ended.start()
    feed.close()
    ended.join(5)
    assert not ended.is_alive()
    assert list(watches[1]) == []
    assert next(feed.watch(OPEN_ACCESS, wanted=lambda: True)) == set()  # a place is free again
