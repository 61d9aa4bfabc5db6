"""The benchmark scripts run and write their results (their figures are judged in bench/, not here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def bench(tmp_path: Path, module: str, *args: str) -> dict:
    env = {**os.environ, "VIPU_BENCH_RESULTS": str(tmp_path), "VIPU_BENCH_SETTLE_SECONDS": "1"}  # no minute's wait for quiet
    done = subprocess.run([sys.executable, "-m", f"bench.{module}", "--name", "out", *args],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "written:" in done.stdout
    return json.loads((tmp_path / "out.json").read_text())


def test_the_allocator_benchmark_compares_the_allocators_and_compaction_on_one_trace(tmp_path):
    result = bench(tmp_path, "allocator", "--requests", "400", "--machines", "16", "--seeds", "7")
    rows = {r["allocator"]: r for r in result["results"]}
    by_seed = result["fragmentation_refusals_by_seed"]
    assert list(by_seed) == list(rows) and all(set(counts) == {"2026", "7", "mean"} for counts in by_seed.values())
    assert all(by_seed[name]["2026"] == row["fragmentation_refusals"] for name, row in rows.items())
    assert list(rows) == ["vipu", "vipu + compaction", "best-fit", "first-fit", "capacity bound"]
    assert rows["capacity bound"]["fragmentation_refusals"] == 0
    for row in rows.values():
        assert row["accepted"] + row["refused"] == 400
        assert 0 < row["mean_utilisation_percent"] <= 100
    assert result["relocatable_requests"] == 400  # all of them, by default
    compacted = rows["vipu + compaction"]
    assert 0 < compacted["started_by_compaction"] <= compacted["moves"]  # the seeded trace has refusals compaction lifts
    assert compacted["fragmentation_refusals"] < rows["vipu"]["fragmentation_refusals"]
    assert all(row["moves"] == 0 for name, row in rows.items() if name != "vipu + compaction")


def test_the_queueing_benchmark_replays_the_trace_with_every_request_waiting_until_it_starts(tmp_path):
    result = bench(tmp_path, "queueing", "--requests", "300", "--machines", "16", "--load", "0.9")
    rows = {r["policy"]: r for r in result["runs"][0]["results"]}
    assert list(rows) == ["FIFO + backfill", "FIFO + backfill + compaction", "FIFO + backfill by duration (exact)",
                          "FIFO + backfill by duration (over-estimated)", "plain FIFO", "capacity bound"]
    assert rows["FIFO + backfill"]["expected_durations"] == rows["FIFO + backfill + compaction"]["expected_durations"] == "unknown"
    assert rows["FIFO + backfill + compaction"]["moves"] > 0  # the seeded trace has a first request that compaction starts
    assert all(row["moves"] == 0 for name, row in rows.items() if name != "FIFO + backfill + compaction")
    assert rows["FIFO + backfill by duration (exact)"]["expected_durations"] == "the true duration"
    bound = rows["capacity bound"]["mean_utilisation_percent"]
    for row in rows.values():
        assert 0 <= row["median_wait"] <= row["p99_wait"] and 0 < row["mean_utilisation_percent"] <= 100 and bound <= 100
        assert row["utilisation_below_bound_points"] == pytest.approx(bound - row["mean_utilisation_percent"], abs=0.11)
    for policy in ("FIFO + backfill", "plain FIFO"):  # the others may beat the bound's greed on a trace this short
        assert rows[policy]["mean_utilisation_percent"] <= bound
    assert rows["FIFO + backfill"]["mean_wait"] <= rows["plain FIFO"]["mean_wait"]  # backfill starts the small ones sooner
    assert rows["FIFO + backfill + compaction"]["mean_wait"] <= rows["FIFO + backfill"]["mean_wait"]  # and more, moving partitions
    assert rows["FIFO + backfill by duration (exact)"]["mean_wait"] <= rows["FIFO + backfill"]["mean_wait"]  # and more, told durations


def test_the_queueing_benchmark_with_reservations_says_what_they_cost_beyond_their_own_ipu_hours(tmp_path):
    result = bench(tmp_path, "queueing", "--reservations", "--requests", "300", "--machines", "16", "--load", "0.9")
    assert result["benchmark"] == "queueing-reservations"
    rows = result["runs"][0]["results"]
    assert [r["policy"] for r in rows] == ["FIFO + backfill by duration (exact)", "FIFO + backfill by duration (over-estimated)"]
    for row in rows:
        assert 0 < row["reserved_points"] < 5 and 0 < row["with_reservations_percent"] <= 100
        assert row["lost_beyond_reserved_points"] == pytest.approx(
            row["utilisation_percent"] - row["with_reservations_percent"] - row["reserved_points"], abs=0.02)
        assert row["lost_beyond_reserved_points"] <= 2  # the bound, on this short trace too
    assert any(row["mean_wait_with_reservations"] != row["mean_wait"] for row in rows)  # the reservations changed what ran when


@pytest.mark.functional
def test_the_partition_benchmark_measures_pairs_through_the_user_api(tmp_path):
    result = bench(tmp_path, "partitions", "--machines", "2", "--clients", "1,2", "--stores", "sqlite", "--duration", "1")
    assert [(r["machines"], r["clients"]) for r in result["runs"]] == [(2, 1), (2, 2)]
    for run in result["runs"]:
        assert run["refused"] == 0 and run["create"]["count"] > 0 and run["create"]["count"] == run["remove"]["count"]
        assert run["pairs_per_s"] > 0 and run["server_rss_mb"] > 0
        assert run["server_cpu_ms_per_pair"] > 0 and run["server_switches_per_pair"] > 0  # every pair is two calls on gRPC's threads


@pytest.mark.functional
def test_the_partition_benchmark_offers_an_open_loop_load_at_a_rate(tmp_path):
    result = bench(tmp_path, "partitions", "--machines", "2", "--clients", "2", "--stores", "sqlite", "--duration", "2",
                   "--rate", "20")
    (run,) = result["runs"]
    assert run["offered_pairs_per_s"] == 20 and run["refused"] == 0
    assert 10 <= run["create"]["count"] <= 80  # Poisson arrivals at 20/s for 2 s: about 40
    assert run["create"]["count"] == run["remove"]["count"]


@pytest.mark.functional
def test_the_comparison_runs_an_older_revision_and_this_tree_alternately(tmp_path):
    result = bench(tmp_path, "compare", "--before", "HEAD~1", "--machines", "2", "--clients", "1", "--stores", "sqlite",
                   "--duration", "1", "--repeats", "1")
    assert result["before"] == "HEAD~1" and result["repeats"] == 1
    for side in ("before", "after"):
        (run,) = result["runs"][side][0]
        assert run["machines"] == 2 and run["clients"] == 1 and run["create"]["count"] > 0
        (row,) = result["medians"][side]
        assert row["pairs/s"] == run["pairs_per_s"]
        assert row["CPU ms/pair"] == pytest.approx(run["server_cpu_ms_per_pair"], abs=0.005)  # as recorded, to 2 places
        # and as its CPU share and pairs/s say, to their rounding (0.1 each: 5.81 against 5.82 at 42.6 pairs/s)
        assert row["CPU ms/pair"] == pytest.approx(10 * run["server_cpu_percent"] / run["pairs_per_s"], rel=0.01)
    assert result["medians"]["after"][0]["switches/pair"] == result["runs"]["after"][0][0]["server_switches_per_pair"]


@pytest.mark.functional
def test_the_command_timing_runs_hyperfine_on_both_revisions(tmp_path):
    result = bench(tmp_path, "cli_speed", "--before", "HEAD", "--runs", "5", "--rounds", "2")
    assert (result["runs"], result["rounds"]) == (4, 2)  # two rounds of two runs each: what was timed, not what was asked
    assert list(result["commands"]) == ["vipu create partition P --size 1", "vipu list partitions", "vipu --help",
                                        "python -c 'import grpc'"]
    for timings in result["commands"].values():
        assert set(timings) == {"before", "after"}
        assert all(0 < side["min_ms"] <= side["median_ms"] for side in timings.values())


@pytest.mark.functional
def test_the_slurm_throughput_benchmark_runs_every_configuration(tmp_path):
    result = bench(tmp_path, "slurm_jobs", "--jobs", "2")
    assert list(result["jobs_per_s"]) == ["plain Slurm", "no IPUs, Python prolog and epilog", "no IPUs", "1 IPU each",
                                           "1 IPU each, vipu-slurm-service"]
    assert all(rate > 0 for rate in result["jobs_per_s"].values()) and result["share_of_plain"]["plain Slurm"] == 1


@pytest.mark.functional
def test_the_crash_benchmark_counts_rounds_operations_and_violations(tmp_path):
    result = bench(tmp_path, "crashes", "--rounds", "2", "--stores", "sqlite", "--machines", "2")
    (run,) = result["runs"]
    assert run["rounds"] == 2 and run["violations"] == 0 and run["answered"] > 0


@pytest.mark.functional
def test_the_slurm_comparison_times_both_systems_in_one_run(tmp_path):
    result = bench(tmp_path, "slurm_compare", "--sizes", "4", "--samples", "2", "--machines", "2")
    (run,) = result["runs"]
    assert run["ipus"] == 4 and run["slurm"]["samples"] == run["vipu"]["samples"] == run["vipu_api"]["samples"] == 2
    assert run["ratio"] > 0 and run["ratio_api"] > 0 and "22.05" in result["slurm_version"]


@pytest.mark.functional
def test_the_soak_runs_a_mixed_load_and_judges_errors_and_memory(tmp_path):
    result = bench(tmp_path, "soak", "--seconds", "12", "--window", "3", "--machines", "2", "--clients", "3")
    assert result["errors"] == {} and result["operations"] > 0
    assert len(result["windows"]) == 4 and all(w["controller_rss_mb"] > 0 for w in result["windows"])
    assert result["memory"]["grows"] is False


@pytest.mark.functional
def test_the_login_timing_interleaves_right_keys_wrong_keys_and_unknown_users(tmp_path):
    result = bench(tmp_path, "login_timing", "--samples", "5")
    outcomes = {kind: f["outcome"] for kind, f in result["figures"].items()}
    assert outcomes == {"known user, right key": "OK", "known user, wrong key": "UNAUTHENTICATED",
                        "unknown user": "UNAUTHENTICATED"}


@pytest.mark.functional
def test_the_enqueue_benchmark_times_requests_waiting_at_both_ends_of_a_growing_queue(tmp_path):
    result = bench(tmp_path, "enqueue", "--requests", "30", "--machines", "2", "--window", "5")
    assert result["requests"] == 30 and result["last_position"] == 30  # every one waited, the last behind all the others
    assert result["first_median_ms"] > 0 and result["last_median_ms"] > 0


@pytest.mark.functional
def test_the_floor_benchmark_measures_a_do_nothing_end_point(tmp_path):
    result = bench(tmp_path, "floor", "--clients", "1,2", "--pairs", "20", "--end-point", "threads,aio")
    assert [(r["end_point"], r["clients"], r["pairs"]) for r in result["runs"]] == [
        ("threads", 1, 20), ("threads", 2, 40), ("aio", 1, 20), ("aio", 2, 40)]
    assert all(r["pairs_per_s"] > 0 and r["cpu_ms_per_pair"] > 0 and r["switches_per_pair"] > 0 for r in result["runs"])


@pytest.mark.functional
def test_the_decisions_benchmark_measures_the_owners_work_per_pair_by_pod_size(tmp_path):
    result = bench(tmp_path, "decisions", "--machines", "8,16", "--pairs", "20")
    assert [row["machines"] for row in result["rows"]] == [8, 16]
    assert all(row["after"] > 0 and row["runs"] == {"after": [row["after"]]} for row in result["rows"])


@pytest.mark.functional
def test_the_floor_benchmark_refuses_an_end_point_it_does_not_know(tmp_path):
    refused = subprocess.run([sys.executable, "-m", "bench.floor", "--end-point", "uvloop"], capture_output=True, text=True,
                             cwd=ROOT)
    assert refused.returncode == 2 and "--end-point uvloop is not one of threads, aio" in refused.stderr


@pytest.mark.functional
def test_the_link_year_benchmark_agrees_with_the_real_ledger_and_times_the_history_it_stored(tmp_path):
    result = bench(tmp_path, "link_year", "--quick")
    check = result["cross_check"]
    assert check["identical"] and check["links"] > 0 and check["events"] > 0
    links = result["links"]["total"]
    assert result["store"]["rows"]["links"] == links == result["healthy"]["links"] + result["links"]["degrading_links"]
    assert 0 <= result["detection"]["flagged_24h_before"] <= result["detection"]["failing_links"]
    history = {row["what"]: row for row in result["history"]["links"]}
    flapping = history["flapping through its last 8 days"]
    assert history["quiet"]["events"] == 0 and flapping["samples"] + flapping["samples_left_out"] > 7 * 24 * 60  # every reading kept
    assert all(row["api"]["p50_ms"] > 0 and row["cli"]["count"] == 3 for row in history.values())


def test_the_fairshare_benchmark_replays_accounts_with_and_without_quotas(tmp_path):
    result = bench(tmp_path, "fairshare", "--machines", "8", "--requests", "200", "--entitlements", "0.5,0.3,0.2")
    assert [a["account"] for a in result["accounts"]] == ["team-a", "team-b", "team-c"]
    assert [a["front_end"] for a in result["accounts"]] == ["slurm-like", "kubernetes-like", "vpod-like"]
    assert set(result["summary"]) == {"fair", "plain"} and result["summary"]["fair"]["ipus_evicted_beyond_the_fewest"] == 0
    assert 0 < result["summary"]["fair"]["utilisation_percent"] <= 100


def test_the_scrape_benchmark_times_an_agents_exporter_with_a_quick_and_a_stalled_bmc(tmp_path):
    result = bench(tmp_path, "scrape", "--scrapes", "20", "--bmc-seconds", "1")
    quick, stalled = result["results"]["BMC answers at once"], result["results"]["BMC answers in 1 s"]
    assert quick["scrapes"] == stalled["scrapes"] == 20 and quick["bytes"] > 5000
    assert stalled["max_ms"] < 1000  # the scrape never waited on the stalled read
