"""A viewer's source and its watch, over real gRPC against a user end-point that plays vipu-server's
part as each test steers it: a watch ended after a change of users, a key refused, a controller
gone silent without closing its connection."""

from __future__ import annotations

import queue
import threading
from contextlib import contextmanager

import pytest

from tests.functional.harness import wait_until
from tests.ports import free_port
from vipu.api.protos import vipuuser_pb2, vipuuser_pb2_grpc
from vipu.api.serving import serve
from vipu.api.status import GuardInterceptor
from vipu.client.settings import ClientSettings
from vipu.model.errors import Unauthenticated
from vipu.web import sources
from vipu.web.sessions import Sessions
from vipu.web.sources import Source, Viewer

STALL = "stall"


class UserEndPoint(vipuuser_pb2_grpc.UserServiceServicer):
    """Empty lists, and watches that say what the test puts in `say`: a list of topics, None to
    end the watch, STALL to say nothing more until the caller cancels (a controller stopped with
    its connection open). With `heartbeat` set, a watch with nothing to say beats that often."""

    def __init__(self):
        self.port = free_port()
        self.say: queue.Queue = queue.Queue()
        self.heartbeat = 60.0
        self.watches = 0  # placed
        self.beats = 0
        self.refusing = False  # every call refused, as for a replaced key
        self.refusals = 0
        self._server = serve(lambda s: vipuuser_pb2_grpc.add_UserServiceServicer_to_server(self, s), "127.0.0.1", self.port,
                             GuardInterceptor(authenticate=self.admit))

    @contextmanager
    def admit(self, method, metadata, peer):
        if self.refusing:
            self.refusals += 1
            raise Unauthenticated("invalid user id or access key for user alice")
        yield

    def ListPartitions(self, request, context):
        return vipuuser_pb2.ListPartitionsReply()

    def ListAllocations(self, request, context):
        return vipuuser_pb2.ListAllocationsReply()

    def WatchChanges(self, request, context):
        self.watches += 1
        yield vipuuser_pb2.Change()
        while context.is_active():
            try:
                said = self.say.get(timeout=self.heartbeat)
            except queue.Empty:
                self.beats += 1
                yield vipuuser_pb2.Change()
                continue
            if said is None:
                return
            if said == STALL:
                cancelled = threading.Event()
                context.add_callback(cancelled.set)
                cancelled.wait(30)
                return
            yield vipuuser_pb2.Change(topics=said)

    def stop(self) -> None:
        self.say.put(None)  # a watch waiting for its next word ends (its thread would hold up the test run's exit)
        self._server.stop(0)


@pytest.fixture
def end_point():
    serving = UserEndPoint()
    yield serving
    serving.stop()


@pytest.fixture
def source(end_point):
    """An open-mode viewer's source, its watch in place."""
    viewing = Source(ClientSettings("127.0.0.1", end_point.port), free_port(), Viewer("", admin=False))
    wait_until(lambda: viewing.watching, timeout=10, what="the watch")
    yield viewing
    viewing.close()


def test_after_a_change_of_users_the_watch_is_placed_again_at_once_and_the_pages_see_no_break(end_point, source):
    told = []
    source.listen(lambda parts: told.append((source.watching, parts)))
    end_point.say.put(["users"])
    end_point.say.put(None)  # as the controller ends every watch after a change of users
    wait_until(lambda: told, timeout=10, what="the pages to be told")
    assert told == [(True, set(sources.PARTS))]  # the watch placed again: everything the viewer now may see is read
    assert end_point.watches == 2 and source.problem == ""


def test_a_watch_that_says_nothing_not_even_a_heartbeat_is_given_up_and_placed_again(end_point, monkeypatch):
    monkeypatch.setattr(sources, "QUIET_SECONDS", 3.0)  # 15 beats: a stalled thread on a loaded machine is not silence
    monkeypatch.setattr(sources, "RETRY_SECONDS", 0.1)
    end_point.heartbeat = 0.2
    source = Source(ClientSettings("127.0.0.1", end_point.port), free_port(), Viewer("", admin=False))
    try:
        wait_until(lambda: source.watching, timeout=10, what="the watch")
        wait_until(lambda: end_point.beats >= 20, timeout=20, what="four seconds of heartbeats, more than the quiet allowed")
        assert end_point.watches == 1 and source.watching  # a watch that beats is kept
        end_point.say.put(STALL)
        wait_until(lambda: not source.watching, timeout=10, what="the silent watch to be given up")
        assert source.problem == "vipu-server said nothing for 3 s"
        wait_until(lambda: end_point.watches == 2 and source.watching, timeout=10, what="a new watch")
    finally:
        source.close()


def test_a_key_the_controller_refuses_ends_its_sessions_at_once_and_is_not_tried_again(end_point):
    sessions = Sessions(ClientSettings("127.0.0.1", end_point.port), admin_port=free_port(), secure=True)
    try:
        session = sessions.login("alice", "alices-key-alices-key")
        source = sessions.source(session)
        assert source is not None
        wait_until(lambda: source.watching, timeout=10, what="the watch")
        ended = []
        source.listen(lambda parts: ended.append(sessions.source(session) is None))
        end_point.refusing = True  # the key replaced; the controller ends the watch after that change of users
        end_point.say.put(["users"])
        end_point.say.put(None)
        wait_until(lambda: ended, timeout=10, what="the pages to be told")
        assert ended == [True]  # by then the session had ended, for the page's event stream to say so
        source._thread.join(10)
        assert not source._thread.is_alive() and end_point.refusals == 1 and source.refused
        with pytest.raises(Unauthenticated):
            source.partitions()  # without asking the controller again
        assert end_point.refusals == 1
    finally:
        sessions.close()
