"""The change feed behind WatchChanges: who hears of what, when a watch ends, and its bound."""

from __future__ import annotations

import threading

import pytest

from vipu.controller.services.changes import KEPT_CHANGES, ChangeFeed, Topic
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
    seen: list = []
    waiting = threading.Thread(target=lambda: seen.append(feed.wait(0, ALICE, timeout=30)))
    waiting.start()
    feed.publish(Topic.PARTITIONS, "a2")  # another tenant's: alice goes on waiting
    feed.publish(Topic.TESTS)
    waiting.join(0.2)
    assert waiting.is_alive()
    feed.publish(Topic.PARTITIONS, "a1")
    waiting.join(5)
    assert seen == [(3, {Topic.PARTITIONS})]


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
