"""The fault campaign of `bench.faults`, 32 faults long (about a minute and a half): every kind of
fault in turn, four times (the leader killed and stopped, a standby killed, an agent killed and
stopped, PostgreSQL locked past the lease, locked and paused within it) under clients making and
removing partitions against three replicas, and not one answer the final store and the agents
contradict. `bench.faults` runs the long campaign."""

from __future__ import annotations

import pytest

from bench.faults import KINDS, campaign

pytestmark = [pytest.mark.functional, pytest.mark.postgres]


def test_four_faults_of_every_kind_leave_no_answer_contradicted():
    result = campaign(faults=4 * len(KINDS), lease=1.0, clients=3, machines=4, seed=20261206, in_turn=True)
    assert result["first_anomalies"] == [] and result["anomalies"] == 0
    assert set(result["injected"]) == set(KINDS)
    assert result["elections_during_short_stalls"] == 0 and result["short_stalls"] == 8  # no change of leader in a short stall
    assert result["answers"]["ok"] > 100 and result["unknown_share"] < 0.05
