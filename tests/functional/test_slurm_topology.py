"""Slurm places jobs by the topology vipu draws from its IPU-Link domains, on the real Slurm.

A pod of 4 machines in 2 IPU-Link domains (ag1-ag2, ag3-ag4), one allocation of them all, and
four Slurm nodes n1..n4 on this machine, each a slurmd of its own: n1 and n2 beside the first
domain's machines, n3 and n4 beside the second's. The operator's first topology.conf comes from
`vipu-admin export slurm-topology`, and Debian's slurmctld 22.05 loads it with topology/tree;
vipu-slurm-service then keeps it current.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.functional.harness import BIN, Pod, wait_until
from tests.slurm import SlurmCluster
from vipu.api.protos import admin_pb2

pytestmark = pytest.mark.functional

NODES = "n[1-2]:ag[1-2] n[3-4]:ag[3-4]"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    directory = tmp_path_factory.mktemp("slurm-topology")
    pod = Pod(directory, machines=4, ilds=2).start().register(ilds=2)
    exported = pod.admin("export", "slurm-topology", "--nodes", NODES)
    assert exported.code == 0, exported.err
    conf = (f"ApiHost=127.0.0.1\nApiPort={pod.user_port}\nIpuofDir={directory / 'ipuof'}\nApiTimeout=10\n"
            f"Topology=tree\nNodeMachines={NODES}\n")
    slurm = SlurmCluster(nodes=("n1", "n2", "n3", "n4"), oversubscribe="NO",
                         files={"vipu.conf": conf, "topology.conf": exported.out}, extra_config="TopologyPlugin=topology/tree\n")
    yield pod, slurm, exported.out
    slurm.stop()
    pod.stop()


def topology(slurm: SlurmCluster) -> dict[str, str]:
    """Each switch slurmctld knows, with what is under it."""
    shown = slurm.run("scontrol", "show", "topology").stdout
    return {found[1]: found[2] for found in re.finditer(r"SwitchName=(\S+) Level=\d+ LinkSpeed=\d+ (\S+)", shown)}


def submit(slurm: SlurmCluster, *args: str) -> str:
    done = slurm.run("sbatch", "--parsable", "--exclusive", "-o", "/dev/null", *args, "--wrap", "sleep 300")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def placed(slurm: SlurmCluster, job: str) -> str:
    """The job's nodes once it runs."""
    def running():
        fields = slurm.run("squeue", "-h", "-j", job, "-o", "%T %N").stdout.split()
        return fields[1] if fields and fields[0] == "RUNNING" else None
    return wait_until(running, timeout=60, what=f"job {job} to run")


def test_slurmctld_loads_the_exported_topology_and_places_a_job_on_the_nodes_of_one_domain(world):
    _, slurm, exported = world
    assert exported.splitlines()[1:] == ["SwitchName=vipu-alloc-1-ild0 Nodes=n1,n2", "SwitchName=vipu-alloc-1-ild1 Nodes=n3,n4",
                                         "SwitchName=vipu-alloc-1 Switches=vipu-alloc-1-ild0,vipu-alloc-1-ild1",
                                         "SwitchName=vipu Switches=vipu-alloc-1"]
    assert topology(slurm) == {"vipu-alloc-1-ild0": "Nodes=n1,n2", "vipu-alloc-1-ild1": "Nodes=n3,n4",
                               "vipu-alloc-1": "Nodes=n[1-4]", "vipu": "Nodes=n[1-4]"}
    # With n1 taken, the first two free nodes are n2 and n3, one beside each domain. Within one
    # switch (--switches=1), Slurm gives the job n3 and n4: beside the machines of one domain.
    first = submit(slurm, "-w", "n1")
    job = submit(slurm, "-N2", "--switches=1")
    try:
        assert placed(slurm, first) == "n1"
        assert placed(slurm, job) == "n[3-4]"
    finally:
        slurm.run("scancel", first, job)


def test_vipu_slurm_service_rewrites_the_topology_when_an_allocation_changes_and_slurmctld_takes_it(world, tmp_path):
    pod, slurm, exported = world
    log_path = tmp_path / "service.log"
    with open(log_path, "ab") as log:
        service = subprocess.Popen([str(BIN / "vipu-slurm-service"), "--socket", str(tmp_path / "vipu-slurm.sock"),
                                    "--conf", str(slurm.directory / "vipu.conf"), "--licences-interval", "0",
                                    "--topology-interval", "0.3"],
                                   stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "SLURM_CONF": str(slurm.conf)})
    written = slurm.directory / "topology.conf"
    try:
        wait_until(lambda: "serving" in log_path.read_text(), what="vipu-slurm-service to start")
        assert written.read_text() == exported  # already right: left alone
        # The allocation shrinks to the first domain: n3 and n4 are beside no IPUs of Slurm's now.
        pod.admin_api.RemoveAllocation(admin_pb2.RemoveRequest(id="alloc-1"))
        pod.admin_api.CreateAllocation(admin_pb2.CreateAllocationRequest(id="alloc-1", cluster_id="cl0", agent_ids=["ag1", "ag2"]))
        wait_until(lambda: topology(slurm) == {"vipu-alloc-1-ild0": "Nodes=n1,n2", "vipu-no-ipus": "Nodes=n3,n4",
                                               "vipu": "Nodes=n[1-4]"}, timeout=30, what="slurmctld to take the new topology")
        assert "SwitchName=vipu-no-ipus Nodes=n3,n4" in written.read_text()
        # Said once slurmctld's reconfigure returned, which may be after slurmctld shows the change.
        # Once; or twice, when a pass fell between the removal and the new allocation (no allocation
        # at all: every node beside no IPUs) and then saw the new one: the change is two calls.
        updates = wait_until(lambda: log_path.read_text().count("Slurm's topology updated from vipu's allocations"),
                             what="the service to say it updated the topology")
        assert updates in (1, 2), log_path.read_text()
    finally:
        service.terminate()
        service.wait(timeout=30)
        pod.admin_api.RemoveAllocation(admin_pb2.RemoveRequest(id="alloc-1"))
        pod.admin_api.CreateAllocation(admin_pb2.CreateAllocationRequest(id="alloc-1", cluster_id="cl0",
                                                                         agent_ids=["ag1", "ag2", "ag3", "ag4"]))


@pytest.mark.parametrize("args,message", [
    (["--nodes", "n1"], "export slurm-topology: failed: 'n1' is not NODES:MACHINES"),
    (["--nodes", "n1:ag9"], "export slurm-topology: failed: --nodes names machine ag9, which is no agent of vipu's"),
    (["--nodes", "n1:ag[1-3]"], "export slurm-topology: failed: node n1 is beside machines of several blocks"),
    (["--nodes", "n1:ag1", "--user", "nobody"], "export slurm-topology: failed:"),
    (["--nodes", "n1:ag1", "--form", "torus"], "Invalid value for '--form'"),
])
def test_every_bad_export_is_one_line_and_a_non_zero_exit(world, args, message):
    pod, _, _ = world
    done = pod.admin("export", "slurm-topology", *args)
    assert done.code != 0 and done.out == ""
    assert len(done.err.strip().splitlines()) == 1 and message in done.err, done.err
