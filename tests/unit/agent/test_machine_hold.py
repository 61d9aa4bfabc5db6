"""A machine obeys the controller holding it: claims, refusals, release, takeover grants, restarts."""

from __future__ import annotations

import threading
from unittest import mock

import pytest

from vipu.agent import holds
from vipu.agent.holds import MachineHold
from vipu.api import grants
from vipu.api.tls import make_authority
from vipu.model.errors import InvalidArgument, PermissionDenied, Unavailable

SITE_KEY, SITE_CERT = make_authority("site link authority")
OTHER_KEY, OTHER_CERT = make_authority("another site")


def hold(tmp_path, authority: bytes | None = SITE_CERT) -> MachineHold:
    return MachineHold("m01", tmp_path / "m01.holder", authority)


def configure(machine: MachineHold, caller: str) -> None:
    with machine.obeying(caller, claim=True):
        pass


def test_the_first_controller_to_configure_holds_the_machine_and_every_other_is_refused_in_one_line(tmp_path):
    machine = hold(tmp_path)
    with machine.obeying("ctl-b"):  # reading a free machine claims nothing
        pass
    assert machine.holder == ""
    configure(machine, "ctl-a")
    configure(machine, "ctl-a")
    for claim in (False, True):
        with pytest.raises(PermissionDenied) as refused, machine.obeying("ctl-b", claim=claim):
            pass
        assert refused.value.message.startswith("machine m01 is held by controller ctl-a, not ctl-b; ")
        assert "\n" not in refused.value.message
    assert hold(tmp_path).holder == "ctl-a"  # a restarted agent still knows


def test_only_the_holder_releases_and_then_another_may_hold(tmp_path):
    machine = hold(tmp_path)
    machine.claim("ctl-a", "", "SN1", mock.Mock())
    with pytest.raises(PermissionDenied):
        machine.release("ctl-b")
    machine.release("ctl-a")
    assert hold(tmp_path).holder == ""
    machine.claim("ctl-b", "", "SN1", mock.Mock())
    assert machine.holder == "ctl-b"


def test_a_certificate_naming_nobody_is_obeyed_by_no_machine(tmp_path):
    with pytest.raises(PermissionDenied, match="names nobody"), hold(tmp_path).obeying("", claim=True):
        pass


def test_of_many_controllers_racing_for_a_free_machine_exactly_one_holds_it(tmp_path):
    machine = hold(tmp_path)
    start, winners, refused = threading.Barrier(8), [], []

    def race(name: str) -> None:
        start.wait()
        try:
            machine.claim(name, "", "SN1", mock.Mock())
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


def test_a_takeover_needs_the_site_authoritys_grant_for_this_machine_and_taker_once(tmp_path):
    machine = hold(tmp_path)
    configure(machine, "ctl-a")
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
    grant = grants.sign(SITE_KEY, SITE_CERT, "SN1", "ctl-b")
    assert machine.claim("ctl-b", grant, "SN1", clear_all) == "ctl-a"
    assert hold(tmp_path).holder == "ctl-b"
    clear_all.assert_called_once()
    machine.release("ctl-b")
    configure(machine, "ctl-a")
    with pytest.raises(PermissionDenied, match="used already"):  # the same grant cannot take it again
        machine.claim("ctl-b", grant, "SN1", clear_all)
    restarted = hold(tmp_path)
    with pytest.raises(PermissionDenied, match="used already"):  # nor after the agent restarts
        restarted.claim("ctl-b", grant, "SN1", clear_all)
    assert machine.holder == restarted.holder == "ctl-a"
    clear_all.assert_called_once()


def test_a_takeover_clears_the_machine_only_after_the_holders_operation_under_way_and_admits_none_meanwhile(tmp_path):
    machine = hold(tmp_path)
    configure(machine, "ctl-a")
    inside, finish, events = threading.Event(), threading.Event(), []

    def slow_apply() -> None:
        with machine.obeying("ctl-a", claim=True):
            inside.set()
            finish.wait(10)
            events.append("applied")

    applying = threading.Thread(target=slow_apply)
    applying.start()
    assert inside.wait(10)
    taking = threading.Thread(target=machine.claim, args=("ctl-b", grants.sign(SITE_KEY, SITE_CERT, "SN1", "ctl-b"), "SN1",
                                                          lambda: events.append("cleared")))
    taking.start()
    for _ in range(1000):  # until the takeover is waiting: then nothing new starts
        try:
            with machine.obeying("ctl-a"):
                pass
        except Unavailable as refused:
            assert "being handed to another controller" in refused.message
            break
        threading.Event().wait(0.01)
    else:
        raise AssertionError("the takeover never started waiting")
    finish.set()
    applying.join(10)
    taking.join(10)
    assert events == ["applied", "cleared"] and machine.holder == "ctl-b"


def test_a_takeover_gives_up_in_one_line_while_the_holders_operation_does_not_end(tmp_path, monkeypatch):
    monkeypatch.setattr(holds, "TAKEOVER_WAIT_SECONDS", 0.2)
    machine = hold(tmp_path)
    clear_all = mock.Mock()
    with machine.obeying("ctl-a", claim=True):
        with pytest.raises(Unavailable, match="busy with 1 operation"):
            machine.claim("ctl-b", grants.sign(SITE_KEY, SITE_CERT, "SN1", "ctl-b"), "SN1", clear_all)
    clear_all.assert_not_called()
    assert machine.holder == "ctl-a"
    configure(machine, "ctl-a")  # nothing stays refused


def test_a_grant_is_signed_only_with_the_key_of_the_authority_agents_trust():
    with pytest.raises(InvalidArgument, match="does not belong to the authority the agents trust"):
        grants.sign(OTHER_KEY, SITE_CERT, "SN1", "ctl-b")
    with pytest.raises(InvalidArgument, match="unreadable"):
        grants.sign(b"not a key", SITE_CERT, "SN1", "ctl-b")


def test_a_plaintext_link_knows_nobody_so_holds_nothing(tmp_path):
    machine = hold(tmp_path, authority=None)
    configure(machine, "")
    configure(machine, "anyone")
    assert machine.holder == "" and not (tmp_path / "m01.holder").exists()


@pytest.mark.parametrize("content", ["{not json", '{"holder": null}', "{}"])
def test_an_unreadable_holder_file_stops_the_agent_with_the_reason(tmp_path, content):
    (tmp_path / "m01.holder").write_text(content)
    with pytest.raises(InvalidArgument, match="cannot read the holder of machine m01"):
        hold(tmp_path)


def test_a_holder_that_cannot_be_recorded_is_refused_in_one_line_and_not_held(tmp_path):
    (tmp_path / "state").write_text("a file where the directory should be")
    machine = MachineHold("m01", tmp_path / "state" / "m01.holder", SITE_CERT)
    with pytest.raises(Unavailable, match="cannot record the holder of machine m01"):
        configure(machine, "ctl-a")
    assert machine.holder == ""


def test_a_takeover_that_cannot_be_recorded_leaves_its_grant_good_for_another_try(tmp_path, monkeypatch):
    machine = hold(tmp_path)
    configure(machine, "ctl-a")
    grant, clear_all = grants.sign(SITE_KEY, SITE_CERT, "SN1", "ctl-b"), mock.Mock()
    real_write = holds.write_file

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(holds, "write_file", full_disk)
    with pytest.raises(Unavailable, match="cannot record the holder of machine m01"):
        machine.claim("ctl-b", grant, "SN1", clear_all)
    assert machine.holder == "ctl-a"
    monkeypatch.setattr(holds, "write_file", real_write)
    assert machine.claim("ctl-b", grant, "SN1", clear_all) == "ctl-a"
    assert hold(tmp_path).holder == "ctl-b"
