"""Resuming after each recorded step, on a real store: the steps left are done, each once, and
a creation that fails, for whatever reason, gives its machines back.

What each step does to controllers and agents is left out here (each step records its name
instead); tests/functional/test_vpod.py kills a real orchestrator after every step, with real
controllers and agents, and checks what they hold."""

from __future__ import annotations

import pytest

from vipu.backends.sim.rack import generate_rack
from vipu.model.entities import IldTopology
from vipu.model.errors import Unavailable, VipuError
from vipu.vpod.orchestrator import CREATE_STEPS, RELEASE_STEPS, Orchestrator
from vipu.vpod.site import site_machines
from vipu.vpod.store import Vpod, VpodStore

ACTIONS = {"_prepare": "prepared", "_start": "started", "_hand_machines": "handed", "_configure": "configured",
           "_empty": "emptied", "_test": "tested", "_take_back": "taken-back", "_stop": "stopped", "_archive": "archived"}


class StepsRecorded(Orchestrator):
    """An orchestrator whose steps record that they ran; `failing` maps a step to what it raises (once)."""

    def __init__(self, store: VpodStore, failing: dict[str, Exception] | None = None):
        super().__init__(store, generate_rack(4, topology=IldTopology.MESH), tenants=None, agents=None)  # type: ignore[arg-type]
        self.done: list[str] = []
        self.failing = dict(failing or {})
        for method, step in ACTIONS.items():
            setattr(self, method, self._recorder(step))

    def _recorder(self, step: str):
        def action(vpod: Vpod) -> None:
            if step in self.failing:
                raise self.failing.pop(step)
            self.done.append(step)
        return action


@pytest.fixture
def store(tmp_path):
    store = VpodStore(f"sqlite:///{tmp_path / 'vpod.db'}")
    store.add_machines(site_machines(generate_rack(4, topology=IldTopology.MESH)))
    return store


def vpod_at(store: VpodStore, state: str, step: str) -> str:
    store.add_vpod(Vpod("acme-1", "acme", "Creating", "reserved", ["m01", "m02"], "mesh", 1, "acme", [9100, 9101, 9102]))
    if step in CREATE_STEPS:
        store.advance("acme-1", "reserved", step, expected_state="Creating", state=state if state != "Creating" else None)
    else:
        store.advance("acme-1", "reserved", "active", expected_state="Creating", state="Active")
        store.start_release("acme-1")
        store.advance("acme-1", "active", step, expected_state="Releasing")
    return "acme-1"


def holders(store: VpodStore) -> dict[str, str]:
    return {m.name: m.vpod_id for m in store.machines()}


@pytest.mark.parametrize("step", CREATE_STEPS[:-1])
def test_a_creation_resumed_after_each_step_does_each_later_step_once_and_ends_active(store, step):
    vpod_id = vpod_at(store, "Creating", step)
    orchestrator = StepsRecorded(store)
    orchestrator.resume()
    assert orchestrator.done == list(CREATE_STEPS[CREATE_STEPS.index(step) + 1:-1])
    assert (store.get(vpod_id).state, store.get(vpod_id).step) == ("Active", "active")
    assert holders(store) == {"m01": vpod_id, "m02": vpod_id, "m03": "", "m04": ""}


@pytest.mark.parametrize("step", ("active", *RELEASE_STEPS))
def test_a_release_resumed_after_each_step_does_each_later_step_once_and_frees_the_machines(store, step):
    vpod_id = vpod_at(store, "Releasing", step)
    orchestrator = StepsRecorded(store)
    orchestrator.resume()
    later = RELEASE_STEPS[RELEASE_STEPS.index(step) + 1:] if step in RELEASE_STEPS else RELEASE_STEPS
    assert orchestrator.done == list(later)
    assert (store.get(vpod_id).state, store.get(vpod_id).step) == ("Released", "released")
    assert set(holders(store).values()) == {""}


@pytest.mark.parametrize("failure, told", [
    (Unavailable("machine m02: connection refused"), "machine m02: connection refused"),
    (RuntimeError("boom, at a path of the host"), "internal error of vipu-vpod (RuntimeError); its log says more"),
])
def test_a_creation_that_fails_gives_its_machines_back_and_says_why_in_one_line(store, failure, told):
    orchestrator = StepsRecorded(store, failing={"handed": failure})
    with pytest.raises(VipuError) as refused:
        orchestrator.create("acme", 2)
    assert refused.value.message == told
    vpod = store.get("acme-1")
    assert (vpod.state, vpod.error) == ("Released", told)  # the reason kept on the record
    assert orchestrator.done == ["prepared", "started", "taken-back", "stopped", "archived"]  # nothing to empty or test
    assert set(holders(store).values()) == {""}


def test_a_failed_creation_not_yet_given_back_keeps_its_machines_until_a_restart_finishes_it(store):
    orchestrator = StepsRecorded(store, failing={"configured": Unavailable("controller gone"), "taken-back": Unavailable("m01 down")})
    with pytest.raises(Unavailable):
        orchestrator.create("acme", 2)
    vpod = store.get("acme-1")
    assert (vpod.state, vpod.step, vpod.error) == ("Failed", "tested", "controller gone")
    assert holders(store)["m01"] == "acme-1"  # still the failed vPOD's, no other's

    restarted = StepsRecorded(store)
    restarted.resume()
    assert restarted.done == ["taken-back", "stopped", "archived"]
    assert (store.get("acme-1").state, store.get("acme-1").error) == ("Released", "controller gone")
    assert set(holders(store).values()) == {""}
