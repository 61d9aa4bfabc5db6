"""A machine obeys the controller holding it: claims, refusals, release, takeover grants, restarts."""

from __future__ import annotations

import threading
from unittest import mock

import pytest

from vipu.agent.holds import MachineHold
from vipu.api import grants
from vipu.api.tls import make_authority
from vipu.model.errors import InvalidArgument, PermissionDenied

SITE_KEY, SITE_CERT = make_authority("site link authority")
OTHER_KEY, OTHER_CERT = make_authority("another site")


def hold(tmp_path, authority: bytes | None = SITE_CERT) -> MachineHold:
    return MachineHold("m01", tmp_path / "m01.holder", authority)


def test_the_first_controller_holds_the_machine_and_every_other_is_refused_in_one_line(tmp_path):
    machine = hold(tmp_path)
    machine.require("ctl-a")
    machine.require("ctl-a")
    with pytest.raises(PermissionDenied) as refused:
        machine.require("ctl-b")
    assert refused.value.message.startswith("machine m01 is held by controller ctl-a, not ctl-b; ")
    assert "\n" not in refused.value.message
    assert hold(tmp_path).holder == "ctl-a"  # a restarted agent still knows


def test_only_the_holder_releases_and_then_another_may_hold(tmp_path):
    machine = hold(tmp_path)
    machine.require("ctl-a")
    with pytest.raises(PermissionDenied):
        machine.release("ctl-b")
    machine.release("ctl-a")
    assert hold(tmp_path).holder == ""
    machine.require("ctl-b")
    assert machine.holder == "ctl-b"


def test_of_many_controllers_racing_for_a_free_machine_exactly_one_holds_it(tmp_path):
    machine = hold(tmp_path)
    start, winners, refused = threading.Barrier(8), [], []

    def race(name: str) -> None:
        start.wait()
        try:
            machine.require(name)
            winners.append(name)
        except PermissionDenied:
            refused.append(name)

    threads = [threading.Thread(target=race, args=(f"ctl-{n}",)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(winners) == 1 and len(refused) == 7
    assert hold(tmp_path).holder == winners[0]


def test_a_takeover_needs_the_site_authoritys_grant_for_this_machine_and_taker(tmp_path):
    machine = hold(tmp_path)
    machine.require("ctl-a")
    clear_all = mock.Mock()
    for grant, reason in (
        (grants.sign(OTHER_KEY, OTHER_CERT, "SN1", "ctl-b"), "not signed by this site's agent-link authority"),
        (grants.sign(SITE_KEY, SITE_CERT, "SN2", "ctl-b"), "is for machine SN2, not this one (SN1)"),
        (grants.sign(SITE_KEY, SITE_CERT, "SN1", "ctl-c"), "is for controller ctl-c, not ctl-b"),
        (grants.sign(SITE_KEY, SITE_CERT, "SN1", "ctl-b", seconds=-1), "has expired"),
        ("not.a-grant", "malformed"),
        (grants.sign(SITE_KEY, SITE_CERT, "SN1", "ctl-b")[:-8] + "AAAAAAAA", "not signed"),
    ):
        with pytest.raises(PermissionDenied) as refused:
            machine.claim("ctl-b", grant, "SN1", clear_all)
        assert reason in refused.value.message
    clear_all.assert_not_called()
    assert machine.holder == "ctl-a"
    previous = machine.claim("ctl-b", grants.sign(SITE_KEY, SITE_CERT, "SN1", "ctl-b"), "SN1", clear_all)
    assert (previous, hold(tmp_path).holder) == ("ctl-a", "ctl-b")
    clear_all.assert_called_once()


def test_a_grant_is_signed_only_with_the_key_of_the_authority_agents_trust():
    with pytest.raises(InvalidArgument, match="does not belong to the authority the agents trust"):
        grants.sign(OTHER_KEY, SITE_CERT, "SN1", "ctl-b")


def test_a_plaintext_link_knows_nobody_so_holds_nothing(tmp_path):
    machine = hold(tmp_path, authority=None)
    machine.require("")
    machine.require("anyone")
    assert machine.holder == "" and not (tmp_path / "m01.holder").exists()


def test_an_unreadable_holder_file_stops_the_agent_with_the_reason(tmp_path):
    (tmp_path / "m01.holder").write_text("{not json")
    with pytest.raises(InvalidArgument, match="cannot read the holder of machine m01"):
        hold(tmp_path)
