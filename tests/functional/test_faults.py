"""The fault campaign of `bench.faults`, 33 faults long (about two and a half minutes, with a 3 s lease): every kind of fault in
turn, three times (the leader killed and stopped, a standby killed, an agent killed and stopped,
PostgreSQL locked and paused within the lease and past it, killed, and cut off from the leader by a
network partition) under clients making and removing partitions against three replicas, one of
them slow to commit and to call agents, and not one answer the final store and the agents
contradict. `bench.faults` runs the long campaign."""

from __future__ import annotations

import pytest

from bench.faults import KINDS, LONG_STALLS, campaign

pytestmark = [pytest.mark.functional, pytest.mark.postgres]


def test_three_faults_of_every_kind_leave_no_answer_contradicted():
    # A lease of 3 s and short stalls of at most a fifth of it: the suite runs beside virtual machines booting, crash
    # storms on PostgreSQL and a browser on two cores, where commits wait on a shared disk, and the renewals after a
    # stall of a quarter of a 2 s lease once came too late (bench.faults measures the 1 s lease, stalls up to half of
    # it, on a quiet machine). The depositions during short stalls, with their reasons, show in a failure.
    result = campaign(faults=3 * len(KINDS), lease=3.0, clients=3, machines=4, seed=20261206, in_turn=True, longest_stall=5.0,
                      short_stall_share=0.2)
    summary = {key: result[key] for key in ("injected", "answers", "short_stalls", "elections_during_short_stalls",
                                            "depositions_during_short_stalls", "elections_after_long_stalls", "takeover_after",
                                            "lease_claims", "left_out")}  # what a failure shows
    assert result["first_anomalies"] == [] and result["anomalies"] == 0, summary
    assert set(result["injected"]) == set(KINDS) - set(result["left_out"]), summary
    assert result["elections_during_short_stalls"] == 0 and result["short_stalls"] == 6, summary  # no change of leader in a short stall
    long_stalls = sum(result["injected"].get(kind, 0) for kind in LONG_STALLS)
    assert result["elections_after_long_stalls"] == {"1": long_stalls}, summary  # exactly one after each stall past the lease
    assert result["answers"]["ok"] > 100 and result["unknown_share"] < 0.05, summary
