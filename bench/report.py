"""Write the recorded results into bench/README.md, between its results markers.

    python -m bench.report
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from bench.common import RESULTS

README = Path(__file__).parent / "README.md"
START, END = "<!-- results: written by python -m bench.report -->", "<!-- end of results -->"


def load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def markdown(headings: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(headings) + " |", "|" + "---|" * len(headings), *("| " + " | ".join(map(str, r)) + " |" for r in rows)]


def partitions(data: dict) -> list[str]:
    rows = [[r["store"], r["machines"], r["clients"], r["create"]["p50_ms"], r["create"]["p99_ms"], r["remove"]["p50_ms"],
             r["remove"]["p99_ms"], r["pairs_per_s"], r["server_cpu_percent"]] for r in data["runs"]]
    return [f"**Latency and throughput** (`bench.partitions`, {data['duration_s']:.0f} s per row, 1-IPU partitions):", "",
            *markdown(["store", "machines", "clients", "create p50 ms", "create p99 ms", "remove p50 ms", "remove p99 ms",
                       "pairs/s", "controller CPU %"], rows)]


def cost(data: dict) -> list[str]:
    rows = [[r["machines"], r["idle"]["rss_mb"], r["idle"]["cpu_percent"], r["load"]["cpu_percent"], r["load"]["peak_rss_mb"],
             r["load"]["create"]["p50_ms"], r["load"]["create"]["p99_ms"], r["load"]["pairs_per_s"]] for r in data["runs"]]
    g = data["growth"]
    return [f"**Controller cost** (`bench.controller_cost`, {data['runs'][0]['store']}, "
            f"load of {data['runs'][0]['load']['clients']} clients):", "",
            *markdown(["agents", "idle RSS MB", "idle CPU %", "load CPU %", "load peak RSS MB", "create p50 ms", "create p99 ms",
                       "pairs/s"], rows),
            "", f"Fitted growth per agent: {g['idle_rss_mb_per_agent']} MB resident idle, {g['idle_cpu_percent_per_agent']} % CPU idle "
            f"(the health pass), {g['load_rss_mb_per_agent']} MB under load."]


def allocator(data: dict) -> list[str]:
    rows = [[r["allocator"], r["acceptance_percent"], r["refused"], r["fragmentation_refusals"], r["mean_utilisation_percent"],
             r["decision_p99_ms"]] for r in data["results"]]
    by_size = {r["allocator"]: r["fragmentation_refusals_by_size"] for r in data["results"] if r["fragmentation_refusals"]}
    sizes = ", ".join(f"{name}: " + ", ".join(f"{n} of {size} IPUs" for size, n in counts.items()) for name, counts in by_size.items())
    return [f"**Allocator quality** (`bench.allocator`, {data['requests']} requests, {data['machines']} machines, "
            f"offered load {data['load']}, seed {data['seed']}):", "",
            *markdown(["allocator", "accepted %", "refused", "refused with enough IPUs free", "mean utilisation %",
                       "decision p99 ms"], rows),
            "", f"Refused with enough IPUs free, by size: {sizes}.", *_by_seed(data)]


def _by_seed(data: dict) -> list[str]:
    """The refusals with enough IPUs free on the traces of more seeds (`--seeds`), if recorded."""
    by_seed = data.get("fragmentation_refusals_by_seed")
    if not by_seed:
        return []
    seeds = [seed for seed in next(iter(by_seed.values())) if seed != "mean"]
    rows = [[rule, *(counts[seed] for seed in seeds), counts["mean"]] for rule, counts in by_seed.items()]
    return ["", "Refused with enough IPUs free, on the trace of each seed:", "", *markdown(["allocator", *seeds, "mean"], rows)]


def queueing(data: dict) -> list[str]:
    lines = [f"**Allocator quality with waiting** (`bench.queueing`, the same trace of {data['requests']} requests, "
             f"{data['machines']} machines, seed {data['seed']}, every request waiting until it starts; waits in units of "
             f"{data['wait_unit']}):", ""]
    for run in data["runs"]:
        rows = [[r["policy"], r["mean_wait"], r["median_wait"], r["p99_wait"], r["started_at_once_percent"],
                 r["mean_utilisation_percent"], r["utilisation_below_bound_points"], r["longest_queue"], r["pass_p99_ms"]]
                for r in run["results"]]
        lines += [f"Offered load {run['load']}:", "",
                  *markdown(["policy", "mean wait", "median wait", "p99 wait", "started at once %", "mean utilisation %",
                             "utilisation below the bound (points)", "longest queue", "pass p99 ms"], rows), ""]
    return lines[:-1]


def slurm(data: dict) -> list[str]:
    rows = [[r["ipus"], r["slurm"]["median_ms"], r["slurm"]["p90_ms"], r["vipu"]["median_ms"], r["vipu"]["p90_ms"],
             r["vipu_api"]["median_ms"], r["vipu_api"]["p90_ms"], r["ratio"], r["ratio_api"]] for r in data["runs"]]
    return [f"**Slurm side by side** (`bench.slurm_compare`, {data['slurm_version']}, {data['machines']} machines):", "",
            *markdown(["IPUs", "Slurm salloc median ms", "p90", "vipu CLI median ms", "p90", "vipu API median ms", "p90",
                       "Slurm / vipu CLI", "Slurm / vipu API"], rows)]


def slurm_jobs(data: dict) -> list[str]:
    rows = [[label, rate, data["share_of_plain"][label]] for label, rate in data["jobs_per_s"].items()]
    return [f"**Slurm's job throughput with vipu** (`bench.slurm_jobs`, {data['slurm_version']}, {data['jobs']} jobs each):", "",
            *markdown(["jobs", "jobs/s", "share of plain Slurm"], rows)]


def profile(data: dict) -> list[str]:
    rows = [[layer, share] for layer, share in data["share_percent"].items()]
    load = data["load"]
    return [f"**Profile** (`bench.profile`, {data['machines']} machines, {data['clients']} clients: {load['pairs_per_s']} pairs/s, "
            f"controller CPU {load['server_cpu_percent']} %, interpreter lock held {data.get('lock_held_percent', '(not measured)')} % "
            "of the time; flame graph in `results/profile.svg`):", "",
            *markdown(["where the thread holding the interpreter lock is", "%"], rows)]


def compare(data: dict) -> list[str]:
    rows = [[old["store"], old["machines"], old["clients"], *(f"{old[f]} → {new[f]}" for f in ("create p50 ms", "create p99 ms",
                                                                                                "pairs/s", "server CPU %")),
             round(new["pairs/s"] / old["pairs/s"], 2)]
            for old, new in zip(data["medians"]["before"], data["medians"]["after"], strict=True)]
    m = data["machine"]
    return [f"**Before and after** (`bench.compare`: revision {data['before']} → {data['after']}, on {m['cpus']} CPUs "
            f"({m['cpu_model']}), medians of {data['repeats']} alternated runs of {data['duration_s']:.0f} s each, 1-IPU partitions):", "",
            *markdown(["store", "machines", "clients", "create p50 ms", "create p99 ms", "pairs/s", "controller CPU %",
                       "pairs/s after ÷ before"], rows)]


def roundtrips(data: dict) -> list[str]:
    rows = [[call, ms] for call, ms in data["median_ms"].items()]
    return [f"**Round trips of one create** (`bench.roundtrips`, on {data['machine']['cpus']} CPUs, {data['machines']} machines, "
            f"{data['store']}, one client, medians of {data['samples']} calls each):", "", *markdown(["call", "median ms"], rows)]


def floor(data: dict) -> list[str]:
    rows = [[r["clients"], r["pairs_per_s"], r["cpu_ms_per_pair"]] for r in data["runs"]]
    return [f"**The floor** (`bench.floor`, on {data['machine']['cpus']} CPUs: a do-nothing user end-point whose create and remove "
            "each make one do-nothing agent call, Python's gRPC as in vipu-server):", "",
            *markdown(["clients", "pairs/s", "end-point CPU ms per pair"], rows)]


def enqueue(data: dict) -> list[str]:
    rows = [[f"0 to {data['window']}", data["first_median_ms"]],
            [f"{data['requests'] - data['window']} to {data['requests']}", data["last_median_ms"]]]
    return [f"**Enqueue as the queue grows** (`bench.enqueue`, {data['requests']} requests waiting in a full pod of "
            f"{data['machines']} machines, each answered with its place and reason): the last {data['window']} cost "
            f"{data['last_over_first']} times the first; the controller's memory {data['rss_mb_before']} MB to "
            f"{data['rss_mb_after']} MB.", "", *markdown(["requests already waiting", "enqueue median ms"], rows)]


def cli_speed(data: dict) -> list[str]:
    sides = [side for side in ("before", "after") if side in next(iter(data["commands"].values()))]
    rows = [[command, *(m[side]["median_ms"] for side in sides)] for command, m in data["commands"].items()]
    against = f", against revision {data['before']}" if data.get("before") else ""
    rounds = f" in {data['rounds']} alternated rounds" if data.get("rounds") else ""
    return [f"**The `vipu` command, whole process** (`bench.cli_speed`, hyperfine, {data['runs']} runs each{rounds}{against}):", "",
            *markdown(["command", *(f"{side}: median ms" for side in sides)], rows)]


def login_timing(data: dict) -> list[str]:
    rows = [[kind, f["outcome"], f["median_ms"], f["p10_ms"], f["p90_ms"]] for kind, f in data["figures"].items()]
    return [f"**Login timing** (`bench.login_timing`, secure mode, the user end-point over mutual TLS, {data['samples']} calls of "
            f"each kind interleaved): an unknown user's refusal against a known user's wrong key, medians "
            f"{data['unknown_minus_wrong_key_ms']:+.2f} ms apart.", "",
            *markdown(["credentials", "answer", "median ms", "p10 ms", "p90 ms"], rows)]


def crashes(data: dict) -> list[str]:
    rows = [[r["store"], r["rounds"], r["answered"], r["interrupted_operations_finished"], r["violations"], round(r["seconds"] / 60)]
            for r in data["runs"]]
    return [f"**Crash consistency** (`bench.crashes`, recorded {data['machine']['when']} at revision {data['revision']}: SIGKILL of "
            "the controller at a random point of a storm of creates and removes, every round):", "",
            *markdown(["store", "rounds", "calls answered", "interrupted operations finished", "violations", "minutes"], rows)]


def faults(data: dict) -> list[str]:
    answers = data["answers"]
    rows = [[kind, count] for kind, count in sorted(data["injected"].items())]
    served = "; ".join(f"after {kind}: p50 {t['p50_s']} s, p99 {t['p99_s']} s, max {t['max_s']} s ({t['count']})"
                       for kind, t in sorted(data["takeover_after"].items()))
    timed = ("timed from the fault's start, a stop's own length included" if "lease_claims" not in data else
             "timed from the fault's start; after a stall of the store, from its end")
    long_stalls = ", ".join(f"{elections} election{'s' * (elections != '1')} after {count}"
                            for elections, count in data.get("elections_after_long_stalls", {}).items())
    claims = data.get("lease_claims")
    later = [f"Stalls longer than the lease (up to {data['longest_stall_s']:g} s): {long_stalls}." if long_stalls else "",
             f"Lease claims: {claims['count']}, p50 {_bound(claims['p50_s_at_most'])}, p99 {_bound(claims['p99_s_at_most'])}, "
             f"p99.9 {_bound(claims['p999_s_at_most'])} (the stalls' claims among them)." if claims and claims["count"] else "",
             f"Replica c ran with the failpoints `{data['slow_replica']}`." if data.get("slow_replica") else "",
             "Answers by call: " + ", ".join(f"{k} {v}" for k, v in data["answers_by_operation"].items()) + "."
             if data.get("answers_by_operation") else "",
             *(f"Left out: {kind}: {why}." for kind, why in data.get("left_out", {}).items())]
    return [f"**Fault campaign** (`bench.faults`, recorded {data['machine']['when']} at revision {data['revision']}: "
            f"{data['faults']} faults, three replicas with a {data['lease_seconds']:g} s lease on PostgreSQL, {data['clients']} "
            f"clients, {data['machines']} machines, {data['seconds'] / 60:.0f} minutes): {data['calls']} calls, {answers.get('ok', 0)} "
            f"ok, {answers.get('refused', 0)} refused, {answers.get('unknown', 0)} unknown ({100 * data['unknown_share']:.2f} %); "
            f"**{data['anomalies']} anomalies**; {data['elections_during_short_stalls']} elections in {data['short_stalls']} "
            f"stalls shorter than the lease; served again {served} ({timed}). {' '.join(filter(None, later))}",
            "", *markdown(["fault", "injected"], rows)]


def _bound(seconds: float) -> str:
    """A quantile read from a histogram: at most its bucket's bound, or past the last bucket (10 s)."""
    return "over 10 s" if seconds == float("inf") else f"at most {seconds:g} s"


def soak(data: dict) -> list[str]:
    rows = [[w["end_s"], w["operations"], w["errors_so_far"], w["p50_ms"], w["p99_ms"], w["controller_rss_mb"]] for w in data["windows"]]
    memory = data["memory"]
    return [f"**Soak** (`bench.soak`, recorded {data['machine']['when']} at revision {data['revision']}: {data['duration_s']:.0f} s, "
            f"{data['machines']} machines, {data['clients']} clients, {data['store']}): {data['operations']} operations, "
            f"{sum(data['errors'].values())} errors, {data['refusals_for_room']} creations refused for want of room; memory over the "
            f"second half {memory['first_third_mb']} MB to {memory['last_third_mb']} MB "
            f"({'grows' if memory['grows'] else 'does not grow'}).", "",
            *markdown(["window end s", "operations", "errors so far", "p50 ms", "p99 ms", "controller RSS MB"], rows)]


def web(data: dict) -> list[str]:
    rows = [[r["machines"], r["partitions"], round(r["first_load_warm"]["html_bytes"] / 1024, 1),
             f"{r['first_load_cold']['load']['p50_ms']} / {r['first_load_cold']['load']['max_ms']}",
             f"{r['first_load_warm']['load']['p50_ms']} / {r['first_load_warm']['load']['max_ms']}",
             f"{r['updates']['marker_latency']['p50_ms']} / {r['updates']['marker_latency']['p99_ms']}",
             f"{r['updates']['markers_seen']}/{r['updates']['markers']}", r["updates"]["churn_pairs_per_s"],
             r["updates"]["web_cpu_percent"], r["updates"]["controller_cpu_percent"]] for r in data["runs"]]
    return [f"**The dashboard** (`bench.web`, Debian's Chromium headless, the racks page of a pod a quarter full; first load to the "
            f"load event, target {data['target_first_load_s']:.0f} s; updates: a partition's appearance on the open page after its "
            f"create was answered, with {data['churn_pairs_per_s']:.0f} create+remove pairs/s going on, for {data['seconds']:.0f} s):",
            "", *markdown(["machines", "partitions", "HTML KB (gzip)", "first load, vipu-web cold: p50 / max ms",
                           "first load, warm: p50 / max ms", "update p50 / p99 ms", "updates seen", "pairs/s", "vipu-web CPU %",
                           "controller CPU %"], rows)]



def link_year(data: dict) -> list[str]:
    found, healthy, store, mix, check = data["detection"], data["healthy"], data["store"], data["mix"], data["cross_check"]
    policy, lead = data["policy"], found["lead_hours"]
    rows = [["failing links flagged suspect at least 24 h before they failed (target 80 %)",
             f"{found['flagged_24h_before']} of {found['failing_links']}: {found['percent']} %"],
            ["lead time p10 / median", f"{lead['p10']} / {lead['median']} h"],
            ["links that never degraded ever flagged (target 1 %)", f"{healthy['flagged']} of {healthy['links']}: {healthy['percent']} %"],
            ["the store after VACUUM (as built)", f"{store['mb_vacuumed']} MB, {store['kb_per_link_vacuumed']} KB a link "
                                                  f"({round(store['bytes_as_built'] / 2**20, 1)} MB)"],
            *[[f"`get link --history`, {r['what']} ({r['samples']} samples, {r['summaries']} summaries): API p50 / p99, "
               "whole `vipu-admin` p50", f"{r['api']['p50_ms']} / {r['api']['p99_ms']} ms, {r['cli']['p50_ms']} ms"]
              for r in data["history"]["links"]]]
    sweep = ", ".join(f"{r['background_per_day']}: {r['percent']} %" for r in healthy["sweep"])
    return [f"**The link ledger over a simulated year** (`bench.link_year`: {data['links']['total']} links of {data['machines']} machines "
            f"read every {data['interval_s']:.0f} s for {data['days']} days, suspect at growth in {policy['growing']} of "
            f"{policy['windows']} windows of {policy['window_s']:.0f} s; {round(100 * mix['degrading_share'])} % of the physical links "
            f"degrading, {mix['background_per_day']} isolated corrected errors a link a day on every link; the real ledger on a real "
            f"store gave the replay's events, states and histories for {check['links']} links over {check['hours']} h):", "",
            *markdown(["figure", "result"], rows), "",
            f"Links that never degraded ever flagged, by isolated errors a link a day (on {healthy['sweep'][0]['links']} of them): "
            f"{sweep}." if healthy["sweep"] else ""]

@click.command()
def main():
    """Render bench/results/*.json as the README's last recorded results."""
    parts: list[str] = []
    first = None
    renderers = (("compare", compare), ("compare-issue45", compare), ("compare-owner", compare), ("compare-owner-1024", compare),
                 ("compare-16core-64", compare), ("compare-16core-1024", compare), ("compare-16core-64-earlier", compare),
                 ("compare-16core-1024-earlier", compare), ("roundtrips-16core", roundtrips), ("floor", floor), ("enqueue", enqueue),
                 ("partitions", partitions), ("controller-cost", cost), ("allocator", allocator), ("queueing", queueing),
                 ("slurm-compare", slurm), ("slurm-jobs", slurm_jobs), ("profile", profile), ("roundtrips", roundtrips),
                 ("cli-speed", cli_speed), ("cli-speed-issue45", cli_speed), ("login-timing", login_timing), ("web", web),
                 ("link-year", link_year), ("crashes", crashes), ("faults-1000", faults), ("faults", faults), ("soak", soak))
    for name, render in renderers:
        data = load(name)
        if data is not None:
            first = first or data
            parts += [*render(data), "", f"_Recorded {data['machine']['when']} at revision {data['revision']}._", ""]
    if first is None:
        raise click.ClickException("no results yet; run bench/run")
    m = first["machine"]
    header = [f"On {m['cpus']} CPUs ({m['cpu_model']}), Python {m['python']}; each table says when and at which revision it was "
              "recorded (`bench/run` records them all at once).", ""]
    text = README.read_text()
    before, _, rest = text.partition(START)
    _, _, after = rest.partition(END)
    README.write_text(before + START + "\n" + "\n".join(header + parts) + END + after)
    click.echo(f"written: {README}")


if __name__ == "__main__":
    main()
