"""Partition templates through the owner: a template's partitions are placed together and made
all, or none is left; a dry run makes nothing. On the in-memory pod of test_services (8 real
simulated machines, a real store), a failpoint standing in for a machine that refuses one."""

from __future__ import annotations

import pytest

from tests.unit.controller.test_services import MACHINES
from vipu import failpoints
from vipu.controller.core import decisions
from vipu.model.accounts import Account, Quota
from vipu.model.entities import Access, PartitionRequest, ReadyState
from vipu.model.errors import AlreadyExists, HardwareFailure, InvalidArgument, NoRoom, Unavailable
from vipu.model.templates import Template

ADMIN = Access("admin")  # an administrator: every allocation


@pytest.fixture(autouse=True)
def _disarmed():
    yield
    failpoints.disarm()


def held_by_agents(pod) -> set[str]:
    return set().union(*(pod.held(f"ag{n}") for n in range(1, MACHINES + 1)))


def test_a_template_makes_its_partitions_side_by_side_each_on_the_machines_it_says(pod):
    made = pod.allocations.apply_template("a1", Template.parse("2x8+4x4"))
    assert [(p.id, p.size) for p in made] == [("2x8-4x4-1", 8), ("2x8-4x4-2", 8), ("2x8-4x4-3", 4), ("2x8-4x4-4", 4),
                                             ("2x8-4x4-5", 4), ("2x8-4x4-6", 4)]
    ipus = [(ipu.agent_id, ipu.index) for p in made for ipu in p.ipus]
    assert len(ipus) == len(set(ipus)) == 32
    for partition in made:
        assert partition.ready_state is ReadyState.ACTIVE
        assert pod.held_anywhere(partition.id) == partition.agent_ids


def test_a_dry_run_says_where_they_would_go_and_makes_nothing(pod):
    planned = pod.allocations.apply_template("a1", Template.parse("4x8"), prefix="t", dry_run=True)
    assert [p.id for p in planned] == ["t1", "t2", "t3", "t4"]
    assert pod.partitions.list() == [] and held_by_agents(pod) == set()
    made = pod.allocations.apply_template("a1", Template.parse("4x8"), prefix="t")
    assert {p.id: p.agent_ids for p in made} == {p.id: p.agent_ids for p in planned}


def test_a_template_one_partition_of_which_does_not_fit_is_refused_whole(pod):
    pod.partitions.create(PartitionRequest("p0", 4))
    with pytest.raises(NoRoom, match=r"template 2x16: partition 2x16-2 \(16 IPUs\) does not fit beside the template's 1 before "
                                     r"it: .*; nothing was made"):
        pod.allocations.apply_template("a1", Template.parse("2x16"))
    assert [p.id for p in pod.partitions.list()] == ["p0"]
    assert held_by_agents(pod) == {"p0"}


def test_a_template_one_partition_of_which_a_machine_refuses_leaves_none_of_them(pod):
    failpoints.arm("agent.apply", "1*fail(the machine refused it)")
    with pytest.raises((Unavailable, HardwareFailure), match=r"template 4x8: partition 4x8-\d could not be made: .*the machine "
                                                             r"refused it.*; the 3 made with it were removed; nothing was made"):
        pod.allocations.apply_template("a1", Template.parse("4x8"))
    assert pod.partitions.list() == [] and held_by_agents(pod) == set()
    assert len(pod.allocations.apply_template("a1", Template.parse("4x8"))) == 4  # and its ids are free again


def test_a_template_whose_partition_id_is_taken_is_refused_whole(pod):
    pod.partitions.create(PartitionRequest("4x8-3", 4))
    with pytest.raises(AlreadyExists, match="template 4x8: partition 4x8-3 already exists; nothing was made"):
        pod.allocations.apply_template("a1", Template.parse("4x8"))
    assert [p.id for p in pod.partitions.list()] == ["4x8-3"]


def test_a_template_is_made_on_an_account_and_held_to_its_quota_as_a_whole(pod):
    pod.services.accounts.create(Account("ml-a", ("alice",), "", {"": Quota(16)}))
    with pytest.raises(InvalidArgument, match="allocation a1 is shared by quotas and user admin is in no account: name one"):
        pod.allocations.apply_template("a1", Template.parse("2x4"), access=ADMIN)
    with pytest.raises(NoRoom, match=r"template 2x8\+1x4: .*16.*; nothing was made"):  # each alone would fit its 16 IPUs
        pod.allocations.apply_template("a1", Template.parse("2x8+1x4"), account="ml-a", access=ADMIN)
    assert pod.partitions.list() == [] and held_by_agents(pod) == set()
    made = pod.allocations.apply_template("a1", Template.parse("2x8"), account="ml-a", access=ADMIN)
    assert [p.account for p in made] == ["ml-a", "ml-a"]


def test_a_template_that_would_pass_the_allocations_limit_of_operations_is_refused_whole(pod, monkeypatch):
    monkeypatch.setattr(decisions, "OPERATIONS_LIMIT", 4)  # the template's 4 creates and itself are 5
    with pytest.raises(Unavailable, match="template 4x4: allocation a1 has 0 operations under way, and its 4 creates would pass "
                                          "the limit of 4; try again shortly"):
        pod.allocations.apply_template("a1", Template.parse("4x4"))
    assert pod.partitions.list() == [] and held_by_agents(pod) == set()
