"""The failpoints (`vipu.failpoints`): one list of them, each reached in the code and armed by some
test, a misspelt one refused, and an agent call's point acting before the call is sent."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.unit.controller.test_services import Pod
from vipu import failpoints
from vipu.controller.core.agents import AgentCall, AgentCalls
from vipu.model.entities import PartitionRequest
from vipu.model.errors import InvalidArgument, Unavailable
from vipu.model.hardware import PowerAction

ROOT = Path(__file__).resolve().parents[2]


def texts(folder: str) -> str:
    return "\n".join(path.read_text() for path in sorted((ROOT / folder).rglob("*.py")))


def test_every_point_the_code_reaches_is_listed_and_every_listed_point_is_armed_by_a_test():
    source, tests = texts("src/vipu"), texts("tests")
    reached = set(re.findall(r'failpoints\.hit\("([^"{]+)"\)', source))
    assert reached and reached <= failpoints.POINTS, f"reached but not listed: {sorted(reached - failpoints.POINTS)}"
    families = set(re.findall(r'failpoints\.hit\(f"([a-z.]+)\{', source))
    assert families == {"store.partition.", "store.request.", "agent."}  # reached by the names of the tables POINTS lists
    unarmed = sorted(point for point in failpoints.POINTS if f'"{point}"' not in tests and f"{point}=" not in tests)
    assert not unarmed, f"no test arms {unarmed}"


def test_a_point_that_does_not_exist_is_refused_in_one_line_naming_it():
    with pytest.raises(InvalidArgument, match=r"VIPU_FAILPOINTS: there is no failpoint 'store.comit'; the points are agent.apply, "):
        failpoints.parse("store.comit=fail(x)")
    with pytest.raises(InvalidArgument, match=r"cannot read 'owner.turn=fail'"):
        failpoints.parse("owner.turn=fail")


@pytest.mark.parametrize("point", ["agent.apply", "agent.clear", "agent.attachments", "agent.fence", "agent.power"])
def test_an_agent_calls_point_fails_it_before_it_is_sent(tmp_path, point):
    pod = Pod(tmp_path)
    try:
        pod.partitions.create(PartitionRequest("p1", 4))  # on ag1
        host, port = pod.address("ag1")
        machine = pod.gateway.machine(host, port)
        settings = machine.partitions()[0]
        call = {"agent.apply": AgentCall("ag1", host, port, settings=settings),
                "agent.clear": AgentCall("ag1", host, port, partition_id="p1"),
                "agent.attachments": AgentCall("ag1", host, port, partition_id="p1", checking=True),
                "agent.fence": AgentCall("ag1", host, port, partition_id="p1", fence_seconds=60.0),
                "agent.power": AgentCall("ag1", host, port, power=PowerAction.CYCLE)}[point]
        armed = failpoints.arm(point, "fail(agent ag1 did not answer)")
        calls = AgentCalls(pod.gateway, workers=1)
        try:
            outcomes = calls.run([call])
        finally:
            failpoints.disarm()
        assert armed.hits == 1
        assert [type(o) for o in outcomes] == [Unavailable] and outcomes[0].message == "agent ag1 did not answer"
        assert pod.held("ag1") == {"p1"}  # nothing reached the machine: still configured, and not fenced
        assert [a.fenced_until for a in machine.attachments(["p1"])] == [0.0]
    finally:
        pod.close()
