"""The dashboard (vipu-web) in a real headless Chromium, against a real controller and agents."""

from __future__ import annotations

import http.client
import json
import os
import re
import resource
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlencode

import pytest
from playwright.sync_api import sync_playwright

from tests.browser import launch, trusting
from tests.functional.harness import BIN, PROMPTLY, Pod, rows, wait_until, web_answers
from tests.functional.test_ipuof import ipuof
from tests.ports import free_port, free_run
from tests.processes import dying_with_parent
from vipu.api.protos import admin_pb2, vipuuser_pb2, vipuuser_pb2_grpc
from vipu.backends.sim import faults
from vipu.backends.sim.rack import generate_rack
from vipu.client.settings import parse_hcl
from vipu.model.entities import IldTopology
from vipu.model.topology import GW_OUT_PORT, LinkKind
from vipu.web import connections

ROOT = Path(__file__).resolve().parents[2]
FREE = "rgb(226, 230, 236)"  # racks.FREE as the browser computes it
AGENT_DOWN_SECONDS = 15.0  # a machine gone is seen at the controller's next health pass (every 0.3 s here), then shown live
# The link ledger reads every link each second, and calls one suspect when it grew in 2 of the last 3 one-second windows.
LINK_SAMPLING = ("--link-sample-interval", "1", "--link-trend", "2,3,1")
TREND = re.compile(r"its errors or recoveries grew in [23] of its last 3 windows of 1s")


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    """16 machines (64 IPUs) served by two agent processes, a controller and vipu-web."""
    pod = Pod(tmp_path_factory.mktemp("web"), machines=16, agent_processes=2, server_options=LINK_SAMPLING).start()
    try:
        url = pod.start_web()
        yield pod, url
    finally:
        pod.stop()


@pytest.fixture(scope="module")
def playwright():
    with sync_playwright() as running:
        yield running


@pytest.fixture(scope="module")
def browser(playwright):
    launched = launch(playwright)
    yield launched
    launched.close()


@pytest.fixture
def page(dashboard, browser):
    pod, url = dashboard
    pod.wipe()
    pod.register(topology=admin_pb2.ILD_TOPOLOGY_TORUS)
    context = browser.new_context(base_url=url, viewport={"width": 1400, "height": 1000})
    try:
        yield context.new_page()
    finally:
        context.close()


def live(page) -> None:
    """Wait until the page's event stream is in place, and mark the page, so that a reload would show."""
    page.wait_for_selector("#live[data-state=live]")
    page.evaluate("window.notReloaded = true")


def not_reloaded(page) -> bool:
    return page.evaluate("window.notReloaded === true")


def listed_partitions(pod: Pod) -> list[vipuuser_pb2.Partition]:
    """The partitions as the controller lists them to its administrator."""
    return list(vipuuser_pb2_grpc.UserServiceStub(pod._server_channel(pod.user_port)).ListPartitions(
        vipuuser_pb2.ListPartitionsRequest()).partitions)


def test_the_rack_shows_64_ipus_each_in_its_partitions_colour_and_each_agent_up_or_down(dashboard, page):
    pod, _ = dashboard
    for partition, size in (("p16", 16), ("p4", 4), ("p2", 2), ("p1", 1)):
        assert pod.user("create", "partition", partition, "--size", str(size)).code == 0, partition
    pod.fault("m03", "IPU 2 failed")
    assert pod.user("create", "partition", "bad", "--size", "8", "--keep-on-error").code == 1
    page.goto("/")
    ipus = page.eval_on_selector_all(".machine .ipu", """ipus => ipus.map(ipu => ({
        agent: ipu.closest('.machine').dataset.agent, index: Number(ipu.dataset.ipu), partition: ipu.dataset.partition,
        colour: getComputedStyle(ipu).backgroundColor, failed: ipu.classList.contains('failed')}))""")
    assert len(ipus) == 64
    holders = {(i.agent_id, i.agent_ipu_index): p.id for p in listed_partitions(pod) for i in p.spec.ipus}
    assert {(ipu["agent"], ipu["index"]): ipu["partition"] for ipu in ipus if ipu["partition"]} == holders
    legend = dict(page.eval_on_selector_all(".legend li[data-partition]", """items => items.map(
        li => [li.dataset.partition, getComputedStyle(li.querySelector('.swatch')).backgroundColor])"""))
    assert sorted(legend) == ["bad", "p1", "p16", "p2", "p4"]
    for ipu in ipus:
        assert ipu["colour"] == (legend[ipu["partition"]] if ipu["partition"] else FREE), ipu
        assert ipu["failed"] == (ipu["partition"] == "bad")
    assert len(set(legend.values()) | {FREE}) == len(legend) + 1  # every partition a colour of its own, none the free one
    marked = page.eval_on_selector_all(".machine.in-error", "machines => machines.map(m => m.dataset.agent)")
    assert marked == ["ag4", "ag3"]  # the ERROR partition's machines, listed top first
    assert agent_states(page) == {f"ag{n}": "up" for n in range(1, 17)}
    assert "all up" in page.inner_text("#summary")

    assert not any(agent == "ag10" for agent, _ in holders)  # so that no partition goes to ERROR with it
    live(page)
    pod.edit_rack(lambda rack: faults.silence(rack, "m10"))  # its agent closes its ports, as a machine switched off
    page.wait_for_selector(".machine.down[data-agent=ag10]", timeout=AGENT_DOWN_SECONDS * 1000)
    assert not_reloaded(page)
    assert agent_states(page) == {**{f"ag{n}": "up" for n in range(1, 17)}, "ag10": "down"}
    assert page.inner_text(".machine[data-agent=ag10] .badge") == "DOWN"
    assert "1 down" in page.inner_text("#summary")


def test_a_machine_powered_off_or_with_a_failed_part_is_marked_on_its_box(dashboard, page):
    pod, _ = dashboard
    pod.edit_rack(lambda rack: faults.fail_component(rack, "m12", "fan2"))
    assert pod.admin("power", "off", "agent", "ag11").code == 0
    try:
        def marked() -> bool:
            page.goto("/")
            return page.locator(".machine[data-agent=ag11] .badge.power").count() == 1 and page.locator(
                ".machine[data-agent=ag12] .badge.health").count() == 1

        wait_until(marked, timeout=AGENT_DOWN_SECONDS, what="the dashboard to mark ag11 off and ag12 unhealthy")
        assert page.inner_text(".machine[data-agent=ag11] .badge.power") == "OFF"
        assert "power Off" in page.get_attribute(".machine[data-agent=ag11] .head", "title")
        assert page.inner_text(".machine[data-agent=ag12] .badge.health") == "CRITICAL"
        assert page.get_attribute(".machine[data-agent=ag12] .head", "title") == "power On · health Critical"
        assert page.locator(".machine[data-agent=ag13] .badge").count() == 0  # on and healthy: nothing to say
    finally:
        assert pod.admin("power", "on", "agent", "ag11").code == 0  # the simulator keeps its power in the agent process


def agent_states(page) -> dict[str, str]:
    """Each machine's agent as its dot on the racks page says: up or down."""
    return dict(page.eval_on_selector_all(".machine", """machines => machines.map(
        m => [m.dataset.agent, [...m.querySelector('.dot').classList].filter(c => c !== 'dot').join(' ')])"""))


def test_the_partitions_table_says_each_partitions_state_size_gcds_owner_age_and_errors(dashboard, page):
    pod, _ = dashboard
    assert pod.user("create", "partition", "split", "--size", "4", "--num-gcds", "2").code == 0
    assert pod.user("create", "partition", "pair", "--size", "2").code == 0
    pod.edit_rack(lambda rack: [faults.fail_configuration(rack, m.name, "IPU 1 lost its PCIe link") for m in rack.machines])
    assert pod.user("create", "partition", "broken", "--size", "4", "--keep-on-error").code == 1
    listed = {p.id: p for p in listed_partitions(pod)}
    assert list(listed["broken"].status.errors) and all("IPU 1 lost its PCIe link" in e for e in listed["broken"].status.errors)
    page.goto("/partitions")
    shown = page.eval_on_selector_all("#partition-table tr[data-partition]", """rows => rows.map(row => ({
        id: row.dataset.partition, cells: [...row.cells].slice(0, 8).map(cell => cell.innerText.trim()), created: row.cells[7].title,
        errors: [...row.cells[8].querySelectorAll('div')].map(line => line.textContent), errorsText: row.cells[8].innerText.trim()}))""")
    # state (and its last operation, when not IDLE), size, GCDs, owner ("-": none in open mode), allocation, cluster
    expected = {"broken": ["ERROR FAILED", "4", "1", "-", "alloc-1", "cl0"], "pair": ["ACTIVE", "2", "1", "-", "alloc-1", "cl0"],
                "split": ["ACTIVE", "4", "2", "-", "alloc-1", "cl0"]}
    assert [row["id"] for row in shown] == sorted(expected)
    for row in shown:
        partition = listed[row["id"]]
        assert row["cells"][:7] == [row["id"], *expected[row["id"]]]
        created = datetime.fromtimestamp(partition.created.seconds, UTC)
        assert row["created"] == created.strftime("%Y-%m-%d %H:%M:%S UTC")
        age = re.fullmatch(r"(\d+)s", row["cells"][7])
        assert age and 0 <= int(age[1]) <= time.time() - partition.created.seconds + 1, row["cells"][7]
        assert row["errors"] == list(partition.status.errors)
        assert row["errorsText"] == ("-" if not partition.status.errors else "\n".join(partition.status.errors))


def test_a_partitions_page_highlights_its_ipus_in_the_rack_and_shows_its_ipuof_configuration_but_not_its_attach_key(dashboard, page):
    pod, _ = dashboard
    assert pod.user("create", "partition", "split", "--size", "4", "--num-gcds", "2").code == 0
    assert pod.user("create", "partition", "other", "--size", "8").code == 0
    got = pod.user("get", "partition", "split", "--ipu-configs", "--json")
    assert got.code == 0, got.err
    configs = [gcd["ipuof_config"] for gcd in json.loads(got.out)]  # as vipu writes them to ~/.ipuof.conf.d/
    attach_key = configs[0]["attributes"]["Attach Key"]
    split = next(p for p in listed_partitions(pod) if p.id == "split")

    page.goto("/partitions/split")
    ipus = page.eval_on_selector_all("#partition .machine .ipu", """ipus => ipus.map(ipu => ({
        agent: ipu.closest('.machine').dataset.agent, index: Number(ipu.dataset.ipu), partition: ipu.dataset.partition,
        opacity: getComputedStyle(ipu).opacity}))""")
    assert len(ipus) == 64  # the cluster holding it
    highlighted = {(ipu["agent"], ipu["index"]) for ipu in ipus if ipu["opacity"] == "1"}
    assert highlighted == {(i.agent_id, i.agent_ipu_index) for i in split.spec.ipus}
    assert all(ipu["partition"] == "split" for ipu in ipus if (ipu["agent"], ipu["index"]) in highlighted)
    assert {ipu["partition"] for ipu in ipus if (ipu["agent"], ipu["index"]) not in highlighted} == {"", "other"}  # dimmed

    tables = page.eval_on_selector_all("#partition aside table", """tables => tables.map(
        table => [...table.tBodies[0].rows].map(row => [...row.cells].map(cell => cell.innerText)))""")
    attributes = page.eval_on_selector_all("#partition aside dl.attributes", """lists => lists.map(
        list => Object.fromEntries([...list.querySelectorAll('dt')].map(key => [key.textContent, key.nextElementSibling.textContent])))""")
    assert len(configs) == 2
    assert tables == [[[str(d["routing_id"]), f"{d['ip']}:{d['server_port']}", str(d["device_id"]), str(d["ipu_id"]), d["chip_id"]]
                       for d in config["devices"]] for config in configs]
    assert attributes == [{k: v for k, v in config["attributes"].items() if k != "Attach Key"} for config in configs]
    assert attach_key and attach_key not in page.content()


def test_a_partition_created_from_the_cli_appears_without_a_reload(dashboard, page):
    pod, _ = dashboard
    page.goto("/partitions")
    live(page)
    assert page.locator("tr[data-partition]").count() == 0
    assert pod.user("create", "partition", "fresh", "--size", "4").code == 0
    created = time.monotonic()
    # Shown as it is committed: PENDING while it is being configured (a push may carry that), then ACTIVE.
    page.wait_for_selector("tr[data-partition=fresh]:has-text('ACTIVE')", timeout=PROMPTLY * 1000)
    seen = time.monotonic() - created
    assert not_reloaded(page)
    assert "alloc-1" in page.inner_text("tr[data-partition=fresh]")
    # The rack too, and a removal, the same way.
    page.goto("/")
    live(page)
    assert pod.user("remove", "partition", "fresh").code == 0
    page.locator(".ipu[data-partition=fresh]").first.wait_for(state="detached", timeout=PROMPTLY * 1000)
    assert not_reloaded(page)
    print(f"the new partition appeared {seen:.2f} s after the command returned")


def test_a_cable_failed_by_an_injected_fault_shows_as_failed_after_a_cluster_test_started_from_the_page(dashboard, page):
    pod, _ = dashboard
    pod.unplug("m03", 5)  # the cable from ag3's IPU-Link port 5 to ag4's port 1
    pod.edit_rack(lambda rack: setattr(rack, "time_scale", 0.5))  # the Cabling test takes 6 s: time to watch it
    page.goto("/cabling")
    assert {page.get_attribute("g.cable", "data-verdict")} == {"untested"}
    page.goto("/tests")
    assert pod.user("create", "partition", "blocker", "--size", "1").code == 0
    page.click("form.run-test button")
    assert "has partitions (blocker); remove them before running tests that drive its links" in page.inner_text(".notice.bad")
    assert pod.user("remove", "partition", "blocker").code == 0
    page.goto("/tests")
    page.click("form.run-test button")  # the default suite
    page.wait_for_selector(".progress li.running")
    live(page)
    page.wait_for_selector("h2 .state.finished", timeout=30_000)  # followed live, step by step
    assert not_reloaded(page)
    results = dict(page.eval_on_selector_all("#test-results tr[data-test]", "rows => rows.map(r => [r.dataset.test, r.className])"))
    assert results == {"Sync-Link": "passed", "Cabling": "failed", "IPU-Link": "skipped", "Traffic": "skipped",
                       "GW-Link": "skipped", "Version": "passed"}
    page.goto("/cabling")
    cable = page.locator('g.cable[data-cable="IPU-Link ag3:5 <--> ag4:1"]')
    assert cable.get_attribute("data-verdict") == "failed"
    assert "Cabling: ag3:5 [IPU-Link] <--> ag4:1 [IPU-Link] (failed)" in cable.locator("title").text_content()  # its hover text
    verdicts = page.eval_on_selector_all("g.cable", "cables => cables.map(c => c.dataset.verdict)")
    assert verdicts.count("failed") == 1 and len(verdicts) == 16 * 4 + 15 * 2  # a 16-machine torus: the rest passed
    assert set(verdicts) == {"failed", "passed"}
    cable.click(force=True)  # a real click on the line; its box is 0 wide, which Playwright takes for invisible
    assert "Cabling: ag3:5 [IPU-Link]" in page.inner_text(".cable-detail")


def in_two_domains(pod: Pod, allocations: dict[str, list[str]]) -> None:
    """The pod cabled and registered again as a looped torus of two IPU-Link domains, ag1-ag8 and
    ag9-ag16 (GW-Links from each machine to the one at its place in the other), with these allocations."""
    pod.edit_rack(lambda rack: setattr(rack, "cables", generate_rack(16, topology=IldTopology.TORUS, num_ilds=2).cables))
    api = pod.admin_api
    api.RemoveCluster(admin_pb2.RemoveRequest(id="cl0", force=True))
    api.CreateCluster(admin_pb2.CreateClusterRequest(id="cl0", agent_ids=[f"ag{n}" for n in range(1, 17)],
                                                     topology=admin_pb2.ILD_TOPOLOGY_TORUS, num_ipulinkdomains=2))
    for allocation, agents in allocations.items():
        api.CreateAllocation(admin_pb2.CreateAllocationRequest(id=allocation, cluster_id="cl0", agent_ids=agents))


def test_the_racks_outline_each_ipu_link_domain_and_each_allocation_within_it(dashboard, page):
    pod, _ = dashboard
    in_two_domains(pod, {"left": [f"ag{n}" for n in range(1, 9)], "right": [f"ag{n}" for n in range(9, 13)]})
    page.goto("/")
    domains = page.eval_on_selector_all(".domain", """domains => domains.map(domain => ({
        outlined: domain.classList.contains('outlined'), border: getComputedStyle(domain).borderTopStyle,
        label: domain.querySelector('.domain-label')?.textContent,
        runs: [...domain.querySelectorAll('.run')].map(run => ({
            allocation: run.dataset.allocation || '', border: getComputedStyle(run).borderTopStyle,
            label: run.querySelector('.run-label')?.textContent || '',
            machines: [...run.querySelectorAll('.machine')].map(m => m.dataset.agent)}))}))""")
    top_first = lambda first, last: [f"ag{n}" for n in range(last, first - 1, -1)]  # noqa: E731
    assert domains == [
        {"outlined": True, "border": "solid", "label": "IPU-Link domain 0",
         "runs": [{"allocation": "left", "border": "dashed", "label": "left", "machines": top_first(1, 8)}]},
        {"outlined": True, "border": "solid", "label": "IPU-Link domain 1",
         "runs": [{"allocation": "", "border": "none", "label": "", "machines": top_first(13, 16)},
                  {"allocation": "right", "border": "dashed", "label": "right", "machines": top_first(9, 12)}]},
    ]


def test_gw_links_between_domains_are_drawn_with_the_verdict_of_a_cluster_test_whose_results_show_as_the_cli_printed_them(
        dashboard, page):
    pod, _ = dashboard
    in_two_domains(pod, {})
    pod.edit_rack(lambda rack: faults.unplug(rack, "m02", LinkKind.GWLINK, GW_OUT_PORT))  # ag2's GW-Link to ag10
    printed = pod.admin("test", "cluster", "cl0")  # the default six, waited for
    assert printed.code == 1 and "Some tests failed" in printed.err, printed.err
    page.goto("/tests")
    printed_table = printed_results(printed.out)
    assert page.inner_text("#results h2").startswith(printed.out.splitlines()[0])  # "Showing test results for cluster cl0"
    assert shown_results(page) == printed_table

    page.goto("/cabling")
    cables = page.eval_on_selector_all("g.cable.gw-link", """cables => cables.map(cable => ({name: cable.dataset.cable,
        verdict: cable.dataset.verdict, title: cable.querySelector('title').textContent,
        ends: [...cable.querySelectorAll('text.far-end')].map(label => label.textContent)}))""")
    forth = {f"GW-Link ag{n}:1 <--> ag{n + 8}:2": [] for n in range(1, 9)}
    back = {f"GW-Link ag{n + 8}:1 <--> ag{n}:2": [f"to ag{n}", f"from ag{n + 8}"] for n in range(1, 9)}  # drawn as two named stubs
    assert {cable["name"]: cable["ends"] for cable in cables} == forth | back
    failed = [cable for cable in cables if cable["verdict"] == "failed"]
    assert [cable["name"] for cable in failed] == ["GW-Link ag2:1 <--> ag10:2"]
    assert {cable["verdict"] for cable in cables if cable not in failed} == {"passed"}
    verdicts = page.eval_on_selector_all("g.cable", "cables => cables.map(c => c.dataset.verdict)")
    assert len(verdicts) == 2 * (8 * 4 + 7 * 2) + 16 and verdicts.count("failed") == 1  # two 8-machine tori and their GW-Links
    name, *lines = failed[0]["title"].split("\n")  # on hover: the cable, each failing test's line about it, then the link ledger's
    assert name == "GW-Link ag2:1 <--> ag10:2: failed"
    ledger = [line for line in lines if line.startswith("link ledger: ")]
    tested = [line for line in lines if line not in ledger]
    summaries = {test: summary for test, _, _, summary in printed_table}
    assert [test for test, _, _ in (line.partition(": ") for line in tested)] == ["Sync-Link", "Cabling"]
    assert all(text in summaries[test] for test, _, text in (line.partition(": ") for line in tested)), lines
    assert [line.split(" ")[2] for line in ledger] == ["ag2:gw1", "ag10:gw2"], ledger  # the ledger took the test's verdict
    assert all(" failed: failed the cluster test: " in line for line in ledger), ledger


def test_a_degrading_link_is_marked_on_its_cable_with_its_trend_and_its_page_charts_each_reading_and_the_event(dashboard, page):
    pod, _ = dashboard
    api = pod.admin_api
    assert pod.user("create", "partition", "p4", "--size", "4").code == 0  # an event names the partitions on its machine then
    pod.edit_rack(lambda rack: faults.degrade(rack, "m01", "5", "steady", 600, time.time()))  # 10 corrected errors a second
    wait_until(lambda: {"ag1:5", "ag2:1"} <= {link.name for link in api.ListLinks(admin_pb2.ListLinksRequest(unhealthy=True)).links},
               timeout=30, what="ag1:5 and the other end of its cable, ag2:1, to turn suspect")

    page.goto("/cabling")
    cable = page.locator('g.cable[data-cable="IPU-Link ag1:5 <--> ag2:1"]')
    assert cable.get_attribute("data-health") == "suspect"
    unhealthy = sorted(api.ListLinks(admin_pb2.ListLinksRequest(unhealthy=True)).links,
                       key=lambda link: (link.health != "failed", link.name))
    marks = page.eval_on_selector_all("g.cable", """cables => cables.map(cable => [cable.dataset.health,
        [...cable.querySelectorAll('a.cable-end')].map(end => end.dataset.link)])""")
    assert all(bool(health) == any(end in {link.name for link in unhealthy} for end in ends) for health, ends in marks)  # those alone
    lines = [line for line in cable.locator("title").text_content().split("\n") if line.startswith("link ledger: ")]
    assert [line.split(" ")[2] for line in lines] == ["ag1:5", "ag2:1"]  # on hover: both ends, each with its trend and last reading
    for line in lines:
        health, _, rest = line.removeprefix(f"link ledger: {line.split(' ')[2]} ").partition(": ")
        assert health == "suspect" and TREND.match(rest), line
        counted = re.search(r"; last reading (\d+) corrected errors, 0 recoveries, up, at \d{4}-\d\d-\d\d [\d:]{8} UTC$", line)
        assert counted and int(counted[1]) > 0, line
    assert page.eval_on_selector_all("#unhealthy-links tr[data-link]", """rows => rows.map(row => [row.dataset.link,
        row.querySelector('a').getAttribute('href'), row.cells[2].innerText])""") == [
        [link.name, f"/links/{link.name}", link.health] for link in unhealthy]  # the ledger's list, the worst first, each a link
    cable.click(force=True)  # the chosen cable's panel links to both ends' pages
    ends = page.eval_on_selector_all(".cable-detail a", "links => links.map(a => a.getAttribute('href'))")
    assert ends == ["/links/ag1:5", "/links/ag2:1"]

    page.click('g.cable a.cable-end[data-link="ag1:5"]')  # the dot where the cable leaves ag1
    page.wait_for_url("**/links/ag1:5")
    assert page.inner_text("h2 .state") == "suspect"

    def drawn() -> tuple[list[str], admin_pb2.Link] | None:
        """The points of the page's corrected-error line and the history it was drawn from, once no reading was kept meanwhile."""
        before = api.GetLink(admin_pb2.GetLinkRequest(name="ag1:5", history=True))
        page.reload()
        after = api.GetLink(admin_pb2.GetLinkRequest(name="ag1:5", history=True))
        points = page.get_attribute("#link-history figure:first-of-type polyline.series", "points").split()
        return (points, after) if len(before.samples) == len(after.samples) else None

    points, detail = wait_until(drawn, timeout=10, what="a page drawn between two readings")
    assert len(points) == len(detail.summaries) + len(detail.samples) and len(detail.samples) >= 3
    assert float(points[-1].split(",")[1]) < float(points[0].split(",")[1])  # the total grew: the line climbs
    shown_events = page.eval_on_selector_all("#link-events tbody tr", "rows => rows.map(row => [...row.cells].map(c => c.innerText))")
    assert shown_events == [[datetime.fromtimestamp(e.at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC"), e.health, e.reason,
                             ", ".join(e.partitions) or "-"] for e in reversed(detail.events)]  # newest first
    assert shown_events[0][1] == "suspect" and TREND.fullmatch(shown_events[0][2])  # what made it suspect


def test_a_link_page_refuses_a_name_that_is_no_link_an_unknown_link_and_a_bad_since_in_one_line(dashboard, browser):
    _, url = dashboard
    context = browser.new_context(base_url=url)
    try:
        page = context.new_page()
        for path, status, words in (("/links/ag1:port5", 400, "'ag1:port5' names no link: give AGENT:PORT (ag3:5)"),
                                    ("/links/ag99:5", 404, "no link ag99:5 is in the ledger"),
                                    ("/links/ag1:5?since=yesterday-ish", 400, "'yesterday-ish' is neither a time ago (30m, 12h, 7d)")):
            response = page.goto(path)
            assert response is not None and response.status == status, path
            message = page.inner_text(".notice.bad")
            assert message.startswith(words) and "\n" not in message, message
            assert "Traceback" not in page.content()
    finally:
        context.close()


def shown_results(page) -> list[list]:
    """The tests page's results: each test's name, duration, passed count and summary lines."""
    return page.eval_on_selector_all("#test-results tr[data-test]", """rows => rows.map(row => [...[...row.cells].slice(0, 3).map(
        cell => cell.innerText.trim()), [...row.cells[3].children].map(line => line.textContent)])""")


def printed_results(out: str) -> list[list]:
    """`vipu-admin test cluster`'s results table the same way (a summary of several lines spreads over rows)."""
    results: list[list] = []
    for test, duration, passed, summary in rows(out):
        if test:
            results.append([test, duration, passed, [summary]])
        else:
            results[-1][3].append(summary)
    return results


def test_a_form_posted_from_another_site_is_refused(dashboard):
    _, url = dashboard
    forged = urllib.request.Request(f"{url}/tests", data=b"cluster=cl0", method="POST", headers={"Origin": "http://evil.example"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(forged, timeout=10)
    assert refused.value.code == 403


def test_a_form_over_4_kb_is_refused_before_its_body_is_read(dashboard):
    pod, url = dashboard
    with socket.create_connection(("127.0.0.1", pod.web_port), timeout=10) as raw:
        raw.sendall(b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                    b"Content-Length: 1000000000\r\n\r\nuser=")  # a gigabyte said, five bytes sent
        answer = http.client.HTTPResponse(raw)
        answer.begin()  # at once: not after a gigabyte, nor at the deadline
        assert (answer.status, answer.read()) == (413, b"refused: a form larger than 4096 bytes")
    unsaid = urllib.request.Request(f"{url}/login", data=iter([b"user=" + b"u" * 3000, b"&key=" + b"k" * 3000]), method="POST",
                                    headers={"Content-Type": "application/x-www-form-urlencoded"})  # chunked: no length said
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(unsaid, timeout=10)
    assert refused.value.code == 413


@pytest.mark.parametrize("argument", ["--help", "--tls-init"])
def test_scripts_pod_starts_no_dashboard_beside_a_vipu_server_that_only_sets_up_or_explains(argument, tmp_path):
    done = subprocess.run([str(ROOT / "scripts" / "pod"), argument, "--tls-dir", str(tmp_path / "certs")], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env={**os.environ, "VIPU_WEB_PORT": str(free_port())})
    assert done.returncode == 0, done.stderr
    assert "Usage: vipu-server" in done.stdout if argument == "--help" else (tmp_path / "certs" / "ca").is_dir()
    assert "the dashboard" not in done.stderr and "vipu-web" not in done.stderr


def test_scripts_pod_serves_the_dashboard_on_vipu_web_port_over_its_pod_and_ctrl_c_stops_everything(tmp_path):
    user_port, admin_port, web_port = free_port(), free_port(), free_port()
    options = ["--sim", "2", "--sim-base-port", str(free_run(2)), "--data-dir", str(tmp_path), "--listen-address", "127.0.0.1",
               "--port", str(user_port), "--admin-port", str(admin_port), "--metrics-port", "0"]
    environment = {key: value for key, value in os.environ.items() if key != "VIPU_CLI_API_HOST"}
    with open(tmp_path / "pod.log", "wb") as log:
        script = subprocess.Popen([str(ROOT / "scripts" / "pod"), *options], stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
                                  env={**environment, "VIPU_WEB_PORT": str(web_port)},
                                  start_new_session=True)  # a process group of its own, as a terminal gives its command
    group = script.pid
    try:
        def racks() -> str:
            if script.poll() is not None:
                raise AssertionError(f"scripts/pod exited with status {script.returncode}:\n{(tmp_path / 'pod.log').read_text()[-3000:]}")
            try:
                page = urllib.request.urlopen(f"http://127.0.0.1:{web_port}/", timeout=5).read().decode()
            except OSError:  # not listening yet
                return ""
            return page if 'data-agent="ag2"' in page else ""  # once the controller has registered its pod

        page = wait_until(racks, timeout=90, what="the dashboard of scripts/pod")
        assert 'data-agent="ag1"' in page and f"controller localhost:{user_port}" in page  # the controller's --port, followed
        assert f"the dashboard: http://localhost:{web_port}/" in (tmp_path / "pod.log").read_text(), \
            (tmp_path / "pod.log").read_text()[-3000:]

        os.killpg(group, signal.SIGINT)  # Ctrl-C
        script.wait(timeout=60)
        wait_until(lambda: not alive(group), timeout=30, what="the controller, its agents and the dashboard to end")
        said = (tmp_path / "pod.log").read_text()
        assert "vipu.server: stopping" in said and "Traceback" not in said, said[-3000:]  # each stopped by the script, not killed
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", web_port), timeout=5).close()
    finally:
        if alive(group):
            os.killpg(group, signal.SIGKILL)
            script.wait()


def alive(group: int) -> bool:
    """Whether any process of the process group is left."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def secure_dashboard(tmp_path_factory):
    """A secure controller of 4 machines: allocations a1 (ag1, ag2) for alice and a2 (ag3, ag4) for carol."""
    pod = Pod(tmp_path_factory.mktemp("secure-web"), machines=4, secure=True).start()
    try:
        pod.register(allocation="")
        for allocation, agents in (("a1", ["ag1", "ag2"]), ("a2", ["ag3", "ag4"])):
            pod.admin_api.CreateAllocation(admin_pb2.CreateAllocationRequest(id=allocation, cluster_id="cl0", agent_ids=agents))
        keys = {"admin": pod.admin_key}
        for user, allocation in (("alice", "a1"), ("carol", "a2")):
            assert pod.admin("create", "user", user, "--allocations", allocation).code == 0  # writes USER.vipu-cli.hcl
            keys[user] = key_in(pod, user)
        yield pod, pod.start_web(), keys
    finally:
        pod.stop()


def key_in(pod: Pod, user: str) -> str:
    """The key in the user's configuration file, as vipu-admin last wrote it."""
    config = pod.directory / f"{user}.vipu-cli.hcl"
    return str(parse_hcl(config.read_text(), str(config))["api-access-key"])


def log_in(page, user: str, key: str) -> None:
    page.goto("/")
    page.fill("input[name=user]", user)
    page.fill("input[name=key]", key)
    page.click("form button")


def test_in_secure_mode_the_page_is_https_with_the_servers_certificate(secure_dashboard):
    pod, _, _ = secure_dashboard
    authority = ssl.create_default_context(cafile=str(pod.tls.ca_for(pod.tls.client_dir)))
    with socket.create_connection(("127.0.0.1", pod.web_port), timeout=10) as plain:
        with authority.wrap_socket(plain, server_hostname="localhost") as tls:
            served = tls.getpeercert(binary_form=True)
    assert served == ssl.PEM_cert_to_DER_cert(pod.tls.server_cert.read_text())


def test_in_secure_mode_a_wrong_key_is_refused_and_a_user_sees_only_their_allocation(secure_dashboard, playwright):
    pod, url, keys = secure_dashboard
    assert pod.user("create", "partition", "pc", "--size", "4", "--allocation", "a2").code == 0  # the administrator's
    browser = launch(playwright, *trusting(pod.tls.server_cert))  # it trusts this certificate alone
    try:
        context = browser.new_context(base_url=url)
        page = context.new_page()
        log_in(page, "alice", "not-alices-key-at-all1")
        assert page.url.startswith(f"{url}/login")
        assert "invalid user id or access key for user alice" in page.inner_text("#refused")
        assert context.cookies() == []
        page.goto("/partitions")
        assert page.url.startswith(f"{url}/login")  # still no way in

        log_in(page, "alice", keys["alice"])
        page.wait_for_selector(".machine")
        assert page.eval_on_selector_all(".machine", "ms => ms.map(m => m.dataset.agent)") == ["ag2", "ag1"]
        assert page.locator(".ipu").count() == 8
        assert page.locator("[data-partition=pc]").count() == 0
        assert page.locator("nav a").all_inner_texts() == ["Racks", "Partitions"]  # no cabling, no cluster tests
        live(page)
        assert pod.user("create", "partition", "pa", "--size", "4", config=pod.directory / "alice.vipu-cli.hcl").code == 0
        page.wait_for_selector(".ipu[data-partition=pa]", timeout=PROMPTLY * 1000)
        assert not_reloaded(page)
        assert page.locator(".ipu[data-partition=pa]").count() == 4
        page.goto("/partitions/pc")
        assert "does not exist" in page.inner_text("#partition")
        page.goto("/cabling")
        assert "Only administrators" in page.inner_text("main")
        page.goto("/partitions")
        assert owners(page) == {"pa": "alice"}
        status, text = page.evaluate("""async () => {  // the form an administrator's page has, posted from alice's
            const answer = await fetch('/tests', {method: 'POST', body: new URLSearchParams({cluster: 'cl0'})});
            return [answer.status, await answer.text()]; }""")
        assert status == 403 and "Only administrators see and run cluster tests." in text
        assert "No cluster test has run." in pod.admin("test", "cluster", "--status").err  # none started

        administrator = browser.new_context(base_url=url).new_page()
        log_in(administrator, "admin", keys["admin"])
        administrator.wait_for_selector(".machine")
        assert administrator.locator(".machine").count() == 4 and administrator.locator(".ipu[data-partition=pc]").count() == 4
        administrator.goto("/partitions")
        assert owners(administrator) == {"pa": "alice", "pc": "admin"}
    finally:
        browser.close()


def test_in_secure_mode_guessing_at_a_users_key_through_the_dashboard_locks_out_only_the_guessing_browser(secure_dashboard):
    pod, _, _ = secure_dashboard
    assert pod.admin("create", "user", "erin", "--allocations", "a1").code == 0
    key = key_in(pod, "erin")
    authority = ssl.create_default_context(cafile=str(pod.tls.ca_for(pod.tls.client_dir)))

    def log_in_from(address: str, given_key: str, headers: dict[str, str] | None = None, port: int = pod.web_port) -> tuple[int, str]:
        """The login form posted from a browser at `address` (any 127.x.y.z reaches the loopback)."""
        connection = http.client.HTTPSConnection("127.0.0.1", port, context=authority, timeout=30, source_address=(address, 0))
        try:
            connection.request("POST", "/login", urlencode({"user": "erin", "key": given_key, "next": "/"}),
                               {"Content-Type": "application/x-www-form-urlencoded", **(headers or {})})
            answer = connection.getresponse()
            return answer.status, answer.read().decode()
        finally:
            connection.close()

    for attempt in range(10):  # vipu-server's --login-failures, by default; each saying it comes from elsewhere, in vain
        status, page = log_in_from("127.0.0.1", f"a-guess-at-erins-key-{attempt:02d}", {"X-Forwarded-For": f"192.0.2.{attempt}"})
        assert status == 401 and "invalid user id or access key for user erin" in page
    status, page = log_in_from("127.0.0.1", key)  # even the right key, from there, for now
    assert status == 401 and "too many failed logins for user erin from this address" in page
    assert log_in_from("127.0.0.2", key)[0] == 303  # erin, from another browser through the same dashboard
    pod.logged("authentication of user 'erin' from ipv4:127.0.0.1 through ipv4:127.0.0.1:")

    # Behind a proxy the dashboard is told to trust, the browser is the one its X-Forwarded-For names.
    behind_proxy = free_port()
    with open(pod.directory / "web-behind-proxy.log", "ab") as log:
        dashboard = subprocess.Popen(dying_with_parent([
            str(BIN / "vipu-web"), "--listen-address", "127.0.0.1", "--port", str(behind_proxy), "-H", "127.0.0.1",
            "--api-port", str(pod.user_port), "--admin-port", str(pod.admin_port), "--secure", "--tls-dir", str(pod.tls.root),
            "--trusted-proxy", "127.0.0.4"]), stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: web_answers(dashboard, behind_proxy, pod.directory / "web-behind-proxy.log"),
                   what="vipu-web behind its proxy")
        for attempt in range(10):
            status, _ = log_in_from("127.0.0.4", f"another-guess-at-erins-key-{attempt:02d}", {"X-Forwarded-For": "192.0.2.50"},
                                    port=behind_proxy)
            assert status == 401
        status, page = log_in_from("127.0.0.4", key, {"X-Forwarded-For": "192.0.2.50"}, port=behind_proxy)
        assert status == 401 and "too many failed logins for user erin from this address" in page
        assert log_in_from("127.0.0.4", key, {"X-Forwarded-For": "192.0.2.51"}, port=behind_proxy)[0] == 303
    finally:
        dashboard.terminate()
        dashboard.wait(timeout=30)


def resident_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE).group(1)) / 1024


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


IDLE_CONNECTIONS = 2000
MEMORY_BOUND_MB = 100  # what the dashboard may grow by while they are open: MOST connections of about 300 KB each, and some


def test_in_secure_mode_idle_tls_connections_neither_grow_the_dashboard_nor_keep_a_user_out(secure_dashboard):
    """2,000 connections that finish the TLS handshake and send nothing, from 100 addresses: the
    dashboard keeps at most vipu.web.connections.MOST of them, closes them once they have sent no
    request for its HEAD_SECONDS, grows by less than MEMORY_BOUND_MB, and a user logs in meanwhile."""
    pod, _, keys = secure_dashboard
    authority = ssl.create_default_context(cafile=str(pod.tls.ca_for(pod.tls.client_dir)))
    web = pod.web.pid
    files_before, memory_before = open_files(web), resident_mb(web)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, IDLE_CONNECTIONS + 512)), hard))
    idle = []
    try:
        for n in range(IDLE_CONNECTIONS):
            plain = socket.create_connection(("127.0.0.1", pod.web_port), timeout=10, source_address=(f"127.0.1.{1 + n % 100}", 0))
            try:
                idle.append(authority.wrap_socket(plain, server_hostname="localhost"))
            except OSError:  # closed by the dashboard during the handshake: as good
                plain.close()
        assert open_files(web) <= files_before + connections.MOST + 16
        peak = resident_mb(web)
        assert peak - memory_before < MEMORY_BOUND_MB
        connection = http.client.HTTPSConnection("127.0.0.1", pod.web_port, context=authority, timeout=30,
                                                 source_address=("127.0.2.1", 0))
        connection.request("POST", "/login", urlencode({"user": "alice", "key": keys["alice"], "next": "/"}),
                           {"Content-Type": "application/x-www-form-urlencoded"})
        assert connection.getresponse().status == 303  # a user gets in while they are open
        connection.close()
        deadline = time.monotonic() + connections.HEAD_SECONDS + 20
        while open_files(web) > files_before + 16:  # the connections that sent nothing closed (the login's channel to the controller stays)
            assert time.monotonic() < deadline, f"vipu-web has {open_files(web)} files open, {files_before} before"
            time.sleep(0.5)
        after = resident_mb(web)
        assert after - memory_before < MEMORY_BOUND_MB
        print(f"vipu-web resident: {memory_before:.0f} MB before, {peak:.0f} MB with {IDLE_CONNECTIONS} idle connections opened, "
              f"{after:.0f} MB after they were closed")
    finally:
        for sock in idle:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_vipu_web_refuses_a_trusted_proxy_that_is_no_address_in_one_line(tmp_path):
    done = subprocess.run([str(BIN / "vipu-web"), "--trusted-proxy", "proxy.example", "--port", str(free_port())],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "vipu-web: --trusted-proxy 'proxy.example' is not an IP address or network (e.g. 10.0.0.5, 10.0.0.0/24)\n"


def owners(page) -> dict[str, str]:
    """Each partition's owner, as the partitions table says."""
    return dict(page.eval_on_selector_all("#partition-table tr[data-partition]",
                                          "rows => rows.map(row => [row.dataset.partition, row.cells[4].innerText])"))


def test_in_secure_mode_a_replaced_key_ends_the_session_at_once_after_a_single_refusal(secure_dashboard, playwright):
    pod, url, _ = secure_dashboard
    assert pod.admin("create", "user", "dave", "--allocations", "a1").code == 0
    browser = launch(playwright, *trusting(pod.tls.server_cert))
    try:
        page = browser.new_context(base_url=url).new_page()
        log_in(page, "dave", key_in(pod, "dave"))
        page.wait_for_selector(".machine")
        live(page)

        def refusals() -> int:  # the controller's log line for each login of dave's it refused
            return (pod.directory / "server.log").read_text().count("authentication of user 'dave'")

        assert pod.admin("update", "user", "dave", "--rotate-key").code == 0
        page.wait_for_url(f"{url}/login?next=/", timeout=PROMPTLY * 1000)  # the open page, told, asks to log in
        wait_until(lambda: "vipu-server refuses the key of dave" in (pod.directory / "web.log").read_text(), timeout=PROMPTLY,
                   what="vipu-web to stop using the old key")
        assert refusals() == 1  # the watch placed again after the change of users, and nothing after it
        page.goto("/partitions")
        assert page.url.startswith(f"{url}/login")
        log_in(page, "dave", key_in(pod, "dave"))  # the new key: not locked out
        page.wait_for_selector(".machine")
        assert refusals() == 1
    finally:
        browser.close()


def test_the_accounts_page_shows_each_accounts_use_against_its_quota(dashboard, page):
    pod, _ = dashboard
    assert pod.admin("create", "account", "physics", "--quota", "8", "--cohort", "research").code == 0
    assert pod.admin("create", "account", "chemistry", "--quota", "16", "--cohort", "research").code == 0
    assert pod.user("create", "partition", "sim", "--size", "8", "--account", "physics").code == 0
    assert pod.user("create", "partition", "extra", "--size", "4", "--account", "physics").code == 0  # borrowed
    page.goto("/accounts")
    shown = page.eval_on_selector_all("#account-table tr[data-account]", """rows => rows.map(row => ({
        account: row.dataset.account, cells: [...row.cells].map(cell => cell.innerText.trim()),
        bar: row.querySelector('.quota-bar > span') && row.querySelector('.quota-bar > span').style.width,
        over: !!row.querySelector('.quota-bar.over')}))""")
    by_name = {row["account"]: row for row in shown}
    assert by_name["physics"]["cells"][:5] == ["physics", "research", "-", "alloc-1", "8"]
    assert (by_name["physics"]["cells"][5], by_name["physics"]["cells"][6], by_name["physics"]["bar"]) == ("12", "4", "100%")
    assert by_name["physics"]["over"] and not by_name["chemistry"]["over"]
    assert by_name["chemistry"]["cells"][5] == "0" and by_name["chemistry"]["bar"] == "0%"
    page.screenshot(path=str(pod.directory / "accounts.png"))
    assert pod.user("remove", "partition", "sim").code == 0 and pod.user("remove", "partition", "extra").code == 0


def test_heat_colouring_the_machine_page_and_a_partitions_telemetry_show_what_its_ipus_measure(dashboard, page):
    pod, _ = dashboard
    assert pod.user("create", "partition", "busy", "--size", "4").code == 0
    busy = next(p for p in listed_partitions(pod) if p.id == "busy")
    machine = busy.spec.ipus[0].agent_id
    for _ in range(5):
        assert ipuof(pod, "--partition", "busy").code == 0

    def readings(kind: str) -> dict[tuple[str, int], dict]:
        page.goto(f"/?heat={kind}")
        return {(ipu["agent"], ipu["index"]): ipu for ipu in page.eval_on_selector_all(".racks .machine .ipu", """ipus => ipus.map(
            ipu => ({agent: ipu.closest('.machine').dataset.agent, index: Number(ipu.dataset.ipu), heat: ipu.dataset.heat || '',
                     colour: ipu.style.backgroundColor}))""")}

    held = {(i.agent_id, i.agent_ipu_index) for i in busy.spec.ipus}

    def busy_shown() -> dict | None:
        found = readings("utilisation")
        return found if all(found[ipu]["heat"] and int(found[ipu]["heat"].split()[0]) >= 50 for ipu in held) else None

    shown = wait_until(busy_shown, what="the busy partition's IPUs coloured as busy")
    idle = [ipu for key, ipu in shown.items() if key not in held]
    assert len(shown) == 64 and all(ipu["heat"] == "0 % busy" for ipu in idle)
    assert {ipu["colour"] for ipu in idle} == {"rgb(32, 96, 223)"}  # all blue
    assert all(shown[key]["colour"] != "rgb(32, 96, 223)" for key in held)
    assert page.inner_text("#heat").startswith("Colour IPUs by: partition · temperature · utilisation")
    temperatures = readings("temperature")
    assert all(re.fullmatch(r"\d+ °C", ipu["heat"]) for ipu in temperatures.values())
    assert all(ipu["heat"] == "" for ipu in readings("").values())  # off: the partitions' colours

    page.goto(f"/machines/{machine}")
    rows_shown = page.eval_on_selector_all("#telemetry tbody tr", "rows => rows.map(row => [...row.cells].map(c => c.innerText))")
    assert [row[0] for row in rows_shown] == ["0", "1", "2", "3"] and any(row[1] == "busy" for row in rows_shown)
    assert "partition busy configured on IPUs" in page.inner_text("#log")
    page.goto(f"/machines/{machine}?grep=cleared%7Cnothing-else")
    assert "configured" not in page.inner_text("#log")
    page.screenshot(path=str(pod.directory / "machine.png"), full_page=True)

    page.goto("/partitions/busy")
    assert len(page.query_selector_all("#telemetry tbody tr")) == 4
    wait_until(lambda: page.reload() or page.query_selector("#utilisation polyline"), what="the utilisation over its life drawn")
    points = page.get_attribute("#utilisation polyline", "points").split()
    assert len(points) >= 2 and max(float(p.split(",")[1]) for p in points) <= 80
    page.goto("/?heat=utilisation")
    page.screenshot(path=str(pod.directory / "racks-heat.png"), full_page=True)
    assert pod.user("remove", "partition", "busy").code == 0
