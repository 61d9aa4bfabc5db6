"""Writes a PNG of each page of the dashboard, as Debian's Chromium draws it, for the README.

A pod of 16 simulated machines in two IPU-Link domains (a looped torus) is set up as an operator
would meet it: two allocations, a cluster test that found an unplugged IPU-Link cable and a broken
Sync-Link, partitions of several sizes, one in ERROR, and a machine whose agent is down. Then a
secure controller of 4 machines, for the login page and a user's view. Run by `scripts/screenshots`.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.browser import chromium, trusting  # noqa: E402 - after the path that finds them
from tests.functional.harness import Pod, wait_until  # noqa: E402
from vipu.api.protos import admin_pb2  # noqa: E402
from vipu.backends.sim import faults  # noqa: E402
from vipu.model.entities import IldTopology  # noqa: E402
from vipu.model.topology import LinkKind  # noqa: E402

VIEWPORT = {"width": 1440, "height": 900}


def shoot(page, path: str, out: Path, name: str) -> None:
    page.goto(path)
    page.wait_for_selector("#live[data-state=live], .login")
    page.screenshot(path=str(out / f"{name}.png"), full_page=True)
    print(f"wrote {out / name}.png")


def open_pod(directory: Path) -> Pod:
    pod = Pod(directory, machines=16, topology=IldTopology.TORUS, ilds=2, agent_processes=2).start()
    api = pod.admin_api
    pod.register(allocation="", topology=admin_pb2.ILD_TOPOLOGY_TORUS, ilds=2)
    for allocation, first in (("research", 1), ("production", 9)):
        api.CreateAllocation(admin_pb2.CreateAllocationRequest(id=allocation, cluster_id="cl0",
                                                               agent_ids=[f"ag{n}" for n in range(first, first + 8)]))
    pod.edit_rack(lambda rack: (faults.unplug(rack, "m03", LinkKind.IPULINK, 5), faults.break_link(rack, "m10", "6", LinkKind.SYNC)))
    pod.admin("test", "cluster", "cl0")  # fails, as the faults make it
    for partition, size, allocation in (("bert-large", 16, "research"), ("resnet50", 8, "research"), ("gpt-small", 4, "research"),
                                        ("notebook-1", 1, "research"), ("notebook-2", 2, "research"), ("serving", 8, "production"),
                                        ("batch", 4, "production")):
        done = pod.user("create", "partition", partition, "--size", str(size), "--allocation", allocation)
        assert done.code == 0, done.err
    pod.fault("m12", "IPU 2 failed to configure its IPU-Links")
    assert pod.user("create", "partition", "nightly", "--size", "4", "--allocation", "production", "--keep-on-error").code == 1
    pod.edit_rack(lambda rack: faults.silence(rack, "m16"))
    pod.wait_for_status("ag16", "Down")
    return pod


def open_secure_pod(directory: Path) -> tuple[Pod, str]:
    pod = Pod(directory, machines=4, secure=True).start()
    pod.register(allocation="")
    for allocation, agents in (("a1", ["ag1", "ag2"]), ("a2", ["ag3", "ag4"])):
        pod.admin_api.CreateAllocation(admin_pb2.CreateAllocationRequest(id=allocation, cluster_id="cl0", agent_ids=agents))
    key = pod.admin_api.CreateUser(admin_pb2.CreateUserRequest(id="alice", allocation_ids=["a1"])).access_key
    for partition, allocation in (("alice-train", "a1"), ("someone-else", "a2")):
        assert pod.user("create", "partition", partition, "--size", "4", "--allocation", allocation).code == 0
    return pod, key


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vipu-screenshots-") as scratch:
        pod = open_pod(Path(scratch) / "open")
        try:
            url = pod.start_web()
            with chromium() as browser:
                page = browser.new_page(base_url=url, viewport=VIEWPORT)
                for path, name in (("/", "racks"), ("/cabling", "cabling"), ("/partitions", "partitions"),
                                   ("/partitions/bert-large", "partition"), ("/tests", "cluster-tests")):
                    shoot(page, path, out, name)
        finally:
            pod.stop()
        pod, key = open_secure_pod(Path(scratch) / "secure")
        try:
            url = pod.start_web()
            with chromium(*trusting(pod.tls.server_cert)) as browser:
                page = browser.new_page(base_url=url, viewport={"width": 1100, "height": 640})
                page.goto("/")
                page.fill("input[name=user]", "alice")
                page.fill("input[name=key]", "a-wrong-key-for-alice")
                page.click("form button")
                wait_until(lambda: page.locator("#refused").count(), what="the refusal")
                page.screenshot(path=str(out / "login-refused.png"), full_page=True)
                print(f"wrote {out / 'login-refused'}.png")
                page.fill("input[name=user]", "alice")
                page.fill("input[name=key]", key)
                page.click("form button")
                shoot(page, "/", out, "user-view")
        finally:
            pod.stop()


if __name__ == "__main__":
    main()
