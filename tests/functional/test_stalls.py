"""Slow, not dead: a real controller whose store commit or agent call stalls tells every client the
truth. A write refused after waiting for a stalled commit is withdrawn, never committed later (it
would hold IPUs no owner knows, and come back ACTIVE after a restart); a call in flight when the
controller is killed is reported as lost with its outcome unknown, not blamed on mutual TLS.

The stalls are failpoints (`VIPU_FAILPOINTS`) in the controller's own process, and the statement
deadline is shortened (`--statement-deadline`) so that a stall outlasts it in seconds.
"""

from __future__ import annotations

import json
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.functional.harness import BIN, Pod, failed_line, wait_until
from vipu.api.protos import admin_pb2

pytestmark = pytest.mark.functional

DEADLINE = 2  # seconds: the controller's statement deadline here, and so how long a write waits for its turn


@pytest.fixture
def pod(tmp_path, monkeypatch):
    monkeypatch.setenv("VIPU_FAILPOINTS", f"store.partition.create=1*delay({2 * DEADLINE})")  # the first insert held in its commit
    pod = Pod(tmp_path, machines=4, server_options=("--statement-deadline", str(DEADLINE))).start()
    pod.register(allocation="")
    api = pod.admin_api
    api.CreateAllocation(admin_pb2.CreateAllocationRequest(id="alloc-1", cluster_id="cl0", agent_ids=["ag1", "ag2"]))
    api.CreateAllocation(admin_pb2.CreateAllocationRequest(id="alloc-2", cluster_id="cl0", agent_ids=["ag3", "ag4"]))
    yield pod
    pod.stop()


def listed(pod: Pod) -> set[str]:
    done = pod.user("list", "partitions", "--json")
    assert done.code == 0, done.err
    return {partition["id"] for partition in json.loads(done.out)["partitions"]}


def test_a_create_refused_after_waiting_for_a_stalled_commit_is_never_committed_later(pod):
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(pod.user, "create", "partition", "pa", "--size", "8", "--allocation", "alloc-1")
        second = pool.submit(pod.user, "create", "partition", "pb", "--size", "8", "--allocation", "alloc-2")
        answers = {"pa": first.result(60), "pb": second.result(60)}
    made = sorted(name for name, done in answers.items() if done.code == 0)
    refused = sorted(name for name, done in answers.items() if done.code != 0)
    assert len(made) == 1 and len(refused) == 1, answers  # one insert was held; the other gave up waiting behind it
    lost, allocation = refused[0], {"pa": "alloc-1", "pb": "alloc-2"}[refused[0]]
    failed_line(answers[lost], "create partition", lost, f"did not come free within {DEADLINE} s (the writes ahead are slow)")
    # The next write in that allocation commits alone: the refused create is not carried into its commit.
    again = pod.user("create", "partition", "pc", "--size", "8", "--allocation", allocation)
    assert again.code == 0, again.err
    assert pod.held_anywhere(lost) == [] and pod.held_anywhere("pc") == (["m01", "m02"] if allocation == "alloc-1" else ["m03", "m04"])
    assert lost not in listed(pod)
    pod.stop_server(signal.SIGKILL)
    pod.start_server()
    assert listed(pod) == {made[0], "pc"}  # nothing comes back after a restart that the client was told was not made


def test_a_call_in_flight_when_the_controller_is_killed_is_reported_lost_not_a_tls_refusal(pod, monkeypatch):
    pod.stop_server()
    monkeypatch.setenv("VIPU_FAILPOINTS", "agent.apply=delay(20)")  # the create's calls are out when the controller dies
    pod.start_server()
    creating = subprocess.Popen([str(BIN / "vipu"), "-H", "127.0.0.1", "--api-port", str(pod.user_port), "create", "partition",
                                 "px", "--size", "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: "px" in listed(pod), what="the create to be committed and its agent calls sent")
    pod.stop_server(signal.SIGKILL)
    out, err = creating.communicate(timeout=60)
    assert (creating.returncode, out) == (1, "")
    assert err == (f"create partition (px): failed: vipu-server at 127.0.0.1:{pod.user_port} closed the connection and no longer "
                   "answers (stopped, or killed): whether the call was carried out is unknown; look (a get or list) before "
                   "asking again.\n")
