"""The controller's collection of machines' telemetry and log lines (`TelemetryService`), against a
scripted agent gateway and a real store: restarts of the agent and of the controller lose and
repeat no line, a following read waits for a line and goes on from where it was."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from tests.unit.store.test_store import agent
from vipu.controller.usecases.telemetry import TelemetryService
from vipu.model.configuration import AgentSettings, IpuSetting
from vipu.model.errors import InvalidArgument, NotFound
from vipu.model.telemetry import IpuReading, LogLine, TelemetryReading, WatchReport
from vipu.store.store import Store


class ScriptedAgent:
    """An agent's answers to Watch: a log of lines numbered by its run, which may restart."""

    def __init__(self):
        self.incarnation = "run1"
        self.lines: list[LogLine] = []
        self.asked: list[tuple[int, str]] = []

    def log(self, at: float, text: str) -> None:
        self.lines.append(LogLine(len(self.lines) + 1, at, "gateway", text))

    def restart(self, keeping: int) -> None:
        """A new run, which reads the last `keeping` lines of the machine's log again and numbers them afresh."""
        self.incarnation = f"run{int(self.incarnation[3:]) + 1}"
        self.lines = [dataclasses.replace(line, sequence=n) for n, line in enumerate(self.lines[-keeping:], start=1)]

    def watch(self, host, port, after_line, most_lines, incarnation="", timeout=0.0) -> WatchReport:
        self.asked.append((after_line, incarnation))
        after = after_line if incarnation == self.incarnation else 0
        reading = TelemetryReading(time.time(), (IpuReading(0, utilisation=50.0, temperature=60.0),))
        return WatchReport(reading, 0.5, tuple(line for line in self.lines if line.sequence > after), 0, self.incarnation)


class NoOwners:
    def all(self):
        return []


@pytest.fixture
def store(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'vipu.db'}")
    watched = agent(1)
    watched.inventory.capabilities = ("fabric", "telemetry", "logs")
    with store.transaction() as tx:
        tx.add_agent(watched)
    yield store
    store.close()


def collected(service: TelemetryService) -> None:
    service.collect_all()  # waits for the round's calls (these answer at once) and stores their lines
    assert not service._calling


def texts(service: TelemetryService) -> list[str]:
    return [line.text for line in service.log("ag1", limit=1000)[0]]


def test_an_agent_or_a_controller_that_restarts_loses_and_repeats_no_line(store):
    scripted = ScriptedAgent()
    service = TelemetryService(store, scripted, NoOwners())
    for n in range(5):
        scripted.log(100.0 + n, f"line {n}")
    collected(service)
    assert texts(service) == [f"line {n}" for n in range(5)]
    scripted.restart(keeping=3)  # sends lines 2..4 again, numbered 1..3
    scripted.log(200.0, "after the agent's restart")
    collected(service)
    assert texts(service) == [*(f"line {n}" for n in range(5)), "after the agent's restart"]
    restarted = TelemetryService(store, scripted, NoOwners())  # the controller restarts: it goes on from the store
    scripted.log(300.0, "after the controller's restart")
    collected(restarted)
    assert texts(restarted)[-2:] == ["after the agent's restart", "after the controller's restart"]
    assert len(texts(restarted)) == 7
    assert scripted.asked[-1] == (4, "run2")
    assert restarted.machines()["ag1"].reading.ipu(0).temperature == 60.0


def test_a_following_read_waits_for_a_line_and_goes_on_from_the_newest(store):
    scripted = ScriptedAgent()
    service = TelemetryService(store, scripted, NoOwners())
    scripted.log(100.0, "old")
    collected(service)
    lines, last = service.log("ag1", since=time.time())  # nothing since now: the next read goes on from the newest line
    assert lines == [] and last == 1
    found: list = []
    follower = threading.Thread(target=lambda: found.append(service.log("ag1", after=last, wait=10)))
    follower.start()
    scripted.log(101.0, "new")
    collected(service)
    follower.join(timeout=10)
    assert [line.text for line in found[0][0]] == ["new"]
    with pytest.raises(InvalidArgument, match="is no regular expression"):
        service.log("ag1", grep="(")
    with pytest.raises(NotFound, match="agent ag9 does not exist"):
        service.log("ag9")


def test_a_partitions_owner_and_workload_are_not_what_the_machine_is_configured_with():
    settings = AgentSettings("p1", (IpuSetting(0, 0, 0, 0, ()),), (), (), (), "DNC", "DEFAULT", "POD_NATIVE_DEFAULT", False, "k")
    labelled = dataclasses.replace(settings, owner="alice", labels=(("slurm_job", "42"),))
    assert labelled == settings  # an agent from before them, or settings applied before them, are not lost settings


def test_an_agent_whose_call_is_late_for_its_round_is_not_asked_again_until_its_lines_are_stored(store, monkeypatch):
    from vipu.controller.usecases import telemetry

    monkeypatch.setattr(telemetry, "WATCH_CALL_SECONDS", 0.05)
    scripted = ScriptedAgent()
    release = threading.Event()
    answer = scripted.watch

    def slow_watch(*args, **kwargs):
        release.wait(10)
        return answer(*args, **kwargs)

    scripted.watch = slow_watch  # type: ignore[method-assign]
    service = TelemetryService(store, scripted, NoOwners())
    scripted.log(100.0, "line 0")
    service.collect_all()  # the round ends without the late call's lines
    assert texts(service) == [] and service._calling == {"ag1"}
    release.set()
    deadline = time.monotonic() + 10
    while service._calling and time.monotonic() < deadline:
        time.sleep(0.01)
    scripted.watch = answer  # type: ignore[method-assign]
    service.collect_all()  # stores what the late call brought, and does not ask for it again meanwhile
    service.collect_all()
    assert texts(service) == ["line 0"] and scripted.asked == [(0, ""), (1, "run1")]
