"""An agent obeys no leader older than the newest it has obeyed, in open mode too, and remembers it
across a restart (`vipu.agent.holds`)."""

from __future__ import annotations

import logging

import pytest

from vipu.agent.holds import MachineHold
from vipu.model.errors import PermissionDenied


def obeyed(hold: MachineHold, epoch: int) -> bool:
    try:
        with hold.obeying("", epoch=epoch):
            return True
    except PermissionDenied:
        return False


def test_a_call_of_an_older_leader_is_refused_in_one_logged_line_and_the_newest_is_remembered(tmp_path, caplog):
    path = tmp_path / "m01.holder"
    hold = MachineHold("m01", path, authority=None)  # open mode: nobody is known by a certificate
    assert obeyed(hold, 0) and obeyed(hold, 1) and obeyed(hold, 3)
    with caplog.at_level(logging.WARNING, logger="vipu.agent.holds"):
        with pytest.raises(PermissionDenied, match=r"^machine m01 obeys the leader of epoch 3 now, not one of epoch 2 \(this "
                                                   r"controller was deposed\)$"):
            with hold.obeying("", epoch=2):
                raise AssertionError("a deposed leader's call was carried out")
    assert [r.getMessage() for r in caplog.records] == [
        "machine m01: refused a call of controller (plaintext) from leader epoch 2: epoch 3 leads now (a deposed leader's late call)"]
    assert obeyed(hold, 0)  # a controller without replicas sends no epoch, and is not fenced
    restarted = MachineHold("m01", path, authority=None)
    assert not obeyed(restarted, 2) and obeyed(restarted, 3) and obeyed(restarted, 4)
