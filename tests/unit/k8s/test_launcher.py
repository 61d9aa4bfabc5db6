"""The launcher's init container asking the proxy for its job's partition: when it asks again."""

from __future__ import annotations

from vipu.k8s import launcher

ENV = {"IPUJOB_PARTITION": "p-default-job", "IPUJOB_NAMESPACE": "default", "IPUJOB_NAME": "job", "IPUJOB_UID": "u-1",
       "IPUJOB_IPUS": "4", "VIPU_PROXY_URL": "http://proxy"}


class Clock:
    """Time as the launcher sees it: each answer of the proxy takes as long as the test says, and a pause is noted, not slept."""

    def __init__(self) -> None:
        self.now = 0.0
        self.paused: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.paused.append(seconds)
        self.now += seconds


def test_a_202_that_came_back_at_once_is_followed_by_a_growing_pause_and_one_that_waited_its_time_by_none(monkeypatch):
    clock = Clock()
    answers = iter([(202, 0.0), (202, 0.0), (202, 0.0), (202, launcher.WAIT_SECONDS), (202, 0.0), (201, 0.0)])
    asked = []

    def call(method, url, body):
        asked.append(dict(body))
        status, took = next(answers)
        clock.now += took
        return status, {"id": body["id"], "detail": "waiting in the queue of V-IPU controller c:8090 (number 2): ..."}

    monkeypatch.setattr(launcher.rest, "call", call)
    monkeypatch.setattr(launcher, "time", clock)
    assert launcher.obtain_partition(ENV)["id"] == "p-default-job"
    # Three answers without waiting: 1, 2, 4 s apart; one that waited: asked again at once, and the pauses start over.
    assert clock.paused == [1.0, 2.0, 4.0, 1.0]
    assert len(asked) == 6 and [b.get("resume", False) for b in asked] == [False, True, True, True, True, True]


def test_the_launcher_tells_the_proxy_how_long_its_job_is_expected_to_run(monkeypatch):
    asked = []

    def call(method, url, body):
        asked.append(dict(body))
        return 201, {"id": body["id"], "created": True}

    monkeypatch.setattr(launcher.rest, "call", call)
    for given, told in (("7200", 7200), ("", 0), ("soon", 0)):  # an operator before it, or a value it cannot read: unknown
        launcher.obtain_partition({**ENV, "IPUJOB_EXPECTED_SECONDS": given})
        assert asked[-1]["expected_seconds"] == told
    launcher.obtain_partition(ENV)
    assert asked[-1]["expected_seconds"] == 0 and asked[-1]["reservation"] == ""
    launcher.obtain_partition({**ENV, "IPUJOB_RESERVATION": "train"})
    assert asked[-1]["reservation"] == "train"
