"""Slurm's topology from vipu's IPU-Link domains and allocations: the node map, the three forms
as Slurm's manuals (topology.conf(5), topology.yaml(5)) give their syntax, and the service's
refresh, which writes only a changed file and then reconfigures slurmctld.

The controller and scontrol are doubles here; test_slurm_topology.py loads the tree form into the
real slurmctld and places a job by it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from vipu.api.protos import vipuuser_pb2 as pb
from vipu.client.settings import ClientSettings
from vipu.client.user import UserClient
from vipu.model.errors import InvalidArgument, Unavailable
from vipu.model.slurm_topology import expand_hostlist, parse_node_machines, slurm_topology
from vipu.slurm import topology
from vipu.slurm.config import load

# Two allocations: alloc-1 on both IPU-Link domains of a looped cluster, alloc-2 on one of another.
ALLOCATIONS = [("alloc-1", {"ag1": 0, "ag2": 0, "ag3": 1, "ag4": 1}), ("alloc-2", {"ag9": 0, "ag10": 0})]
NODES = "n[01-04]:ag[1-2] n[05-08]:ag3,ag4 n[09-10]:ag[9-10] login1: far1:ag77"


def test_hostlists_expand_as_slurm_reads_them():
    assert expand_hostlist("n[01-03,7],login1,rack[8-10]a") == ["n01", "n02", "n03", "n7", "login1", "rack8a", "rack9a", "rack10a"]
    assert expand_hostlist("ag[9-11]") == ["ag9", "ag10", "ag11"]


@pytest.mark.parametrize("text,message", [
    ("n[3-1]", "'3-1' is not a number or a range"),
    ("n[a]", "'a' is not a number or a range"),
    ("a,,b", "is not a hostlist"),
    ("n[1", "is not a hostlist"),
    ("[1-2]", "is not a host name"),
    ("n=1", "is not a host name"),
])
def test_a_malformed_hostlist_is_one_line(text, message):
    with pytest.raises(InvalidArgument, match=message):
        expand_hostlist(text)


def test_each_node_is_beside_its_machines_and_a_node_may_be_beside_none():
    mapping = parse_node_machines(NODES)
    assert mapping["n02"] == ("ag1", "ag2") and mapping["n06"] == ("ag3", "ag4") and mapping["login1"] == ()
    assert len(mapping) == 12


@pytest.mark.parametrize("text,message", [
    ("n1", "'n1' is not NODES:MACHINES"),
    (":ag1", "':ag1' is not NODES:MACHINES"),
    ("n[1-2]:ag1 n2:ag2", "node n2 is named more than once"),
    ("   ", "no nodes are named"),
    ("n1:ag[", "is not a hostlist"),
])
def test_a_bad_node_map_is_one_line(text, message):
    with pytest.raises(InvalidArgument, match=message):
        parse_node_machines(text)


def test_the_tree_has_a_leaf_per_domain_of_an_allocation_a_switch_per_allocation_of_several_and_one_top():
    tree = slurm_topology(parse_node_machines(NODES), ALLOCATIONS).tree_conf().splitlines()
    assert tree[0].startswith("# ")
    assert tree[1:] == [
        "SwitchName=vipu-alloc-1-ild0 Nodes=n01,n02,n03,n04",
        "SwitchName=vipu-alloc-1-ild1 Nodes=n05,n06,n07,n08",
        "SwitchName=vipu-alloc-2-ild0 Nodes=n09,n10",
        "SwitchName=vipu-alloc-1 Switches=vipu-alloc-1-ild0,vipu-alloc-1-ild1",
        "SwitchName=vipu-no-ipus Nodes=far1,login1",  # beside no machine of the allocations: under a switch all the same
        "SwitchName=vipu Switches=vipu-alloc-1,vipu-alloc-2-ild0,vipu-no-ipus",
    ]


def test_the_block_forms_list_the_blocks_in_order_with_the_smallest_as_the_base_size():
    drawn = slurm_topology(parse_node_machines(NODES), ALLOCATIONS)
    conf = drawn.block_conf().splitlines()
    assert conf[1] == "# in no block, beside no IPUs of vipu's allocations: far1,login1"
    assert conf[2:] == ["BlockName=vipu-alloc-1-ild0 Nodes=n01,n02,n03,n04", "BlockName=vipu-alloc-1-ild1 Nodes=n05,n06,n07,n08",
                        "BlockName=vipu-alloc-2-ild0 Nodes=n09,n10", "BlockSizes=2"]
    assert yaml.safe_load(drawn.yaml()) == [{
        "topology": "vipu", "cluster_default": True,
        "block": {"block_sizes": [2], "blocks": [
            {"block": "vipu-alloc-1-ild0", "nodes": "n01,n02,n03,n04"}, {"block": "vipu-alloc-1-ild1", "nodes": "n05,n06,n07,n08"},
            {"block": "vipu-alloc-2-ild0", "nodes": "n09,n10"}]}}]


def test_a_node_beside_machines_of_two_blocks_or_no_block_at_all_is_refused():
    with pytest.raises(InvalidArgument, match=r"node n1 is beside machines of several blocks, vipu-alloc-1-ild0 \(ag2\), "
                                              r"vipu-alloc-1-ild1 \(ag3\): name machines of one"):
        slurm_topology(parse_node_machines("n1:ag[2-3]"), ALLOCATIONS)
    with pytest.raises(InvalidArgument, match="no node is beside a machine of vipu's allocations"):
        slurm_topology(parse_node_machines("n1:ag77"), ALLOCATIONS).render("block")
    with pytest.raises(InvalidArgument, match="unknown Slurm topology form 'torus'"):
        slurm_topology(parse_node_machines(NODES), ALLOCATIONS).render("torus")


def test_allocation_ids_that_would_give_two_switches_one_name_are_refused():
    # allocation x's domains make switch vipu-x over blocks vipu-x-ild0 and vipu-x-ild1; allocation x-ild0 one block, its own switch
    allocations = [("x", {"ag1": 0, "ag2": 1}), ("x-ild0", {"ag3": 0, "ag4": 1})]
    with pytest.raises(InvalidArgument, match="allocation ids give two of Slurm's switches the name vipu-x-ild0: rename one"):
        slurm_topology(parse_node_machines("n1:ag1 n2:ag2 n3:ag3 n4:ag4"), allocations).tree_conf()


def conf(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "vipu.conf"
    path.write_text(f"ApiHost=ctl\nIpuofDir=/x\n{extra}")
    return path


class Controller:
    """ListAllocations of the user end-point, as the service reads it."""

    def __init__(self, allocations):
        self.allocations = allocations

    def call(self, _stub, method, request):
        assert method == "ListAllocations"
        return pb.ListAllocationsReply(allocations=[
            pb.Allocation(id=name, spec=pb.AllocationSpec(agent_ids=list(ilds), agent_ilds=list(ilds.values())))
            for name, ilds in self.allocations])


@pytest.fixture
def slurm_dir(tmp_path, monkeypatch):
    """slurm.conf's directory, and an scontrol that records each call in it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'scontrol.calls'}\n")
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    return tmp_path


def test_the_service_writes_the_file_only_when_vipus_allocations_change_it_and_then_reconfigures(slurm_dir):
    config = load(conf(slurm_dir, f"Topology=tree\nNodeMachines={NODES}\n"))
    user = UserClient(ClientSettings("localhost", 8090), 1.0)
    controller = Controller(ALLOCATIONS)
    user.connection = controller  # type: ignore[assignment]
    keeper = topology.TopologyKeeper(user, config)
    written = slurm_dir / "topology.conf"
    assert keeper.path == written and keeper.refresh()
    assert "SwitchName=vipu-alloc-2-ild0 Nodes=n09,n10" in written.read_text()
    assert oct(written.stat().st_mode & 0o777) == "0o644"
    assert not keeper.refresh()  # unchanged: neither written nor reconfigured
    assert (slurm_dir / "scontrol.calls").read_text() == "reconfigure\n"

    controller.allocations = ALLOCATIONS[:1]  # alloc-2 removed: its nodes are beside no IPUs of Slurm's now
    assert keeper.refresh()
    assert "SwitchName=vipu-no-ipus Nodes=far1,login1,n09,n10" in written.read_text()
    assert (slurm_dir / "scontrol.calls").read_text() == "reconfigure\nreconfigure\n"
    assert [p.name for p in slurm_dir.iterdir() if p.name.startswith(".topology")] == []  # no temporary file left


def test_a_controller_that_does_not_say_its_domains_is_refused_and_a_failed_reconfigure_is_asked_again(slurm_dir):
    config = load(conf(slurm_dir, f"Topology=block\nNodeMachines={NODES}\n"))
    user = UserClient(ClientSettings("localhost", 8090), 1.0)
    user.connection = Controller([])  # type: ignore[assignment]
    user.connection.call = lambda *_: pb.ListAllocationsReply(allocations=[  # type: ignore[method-assign]
        pb.Allocation(id="alloc-1", spec=pb.AllocationSpec(agent_ids=["ag1"]))])
    keeper = topology.TopologyKeeper(user, config)
    with pytest.raises(InvalidArgument, match="vipu-server does not say its allocations' IPU-Link domains"):
        keeper.refresh()
    assert not (slurm_dir / "topology.conf").exists()
    user.connection = Controller(ALLOCATIONS)  # type: ignore[assignment]
    scontrol = slurm_dir / "bin" / "scontrol"
    working = scontrol.read_text()
    scontrol.write_text("#!/bin/sh\necho 'slurm_reconfigure error: Unable to contact slurm controller' >&2\nexit 1\n")
    with pytest.raises(Unavailable, match="scontrol reconfigure failed: slurm_reconfigure error: Unable to contact"):
        keeper.refresh()
    assert (slurm_dir / "topology.conf").read_text().splitlines()[-1] == "BlockSizes=2"
    scontrol.write_text(working)
    assert keeper.refresh()  # the file is as it should be, but slurmctld has not read it yet
    assert (slurm_dir / "scontrol.calls").read_text() == "reconfigure\n"
    assert not keeper.refresh()
