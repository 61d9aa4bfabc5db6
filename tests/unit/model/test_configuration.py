"""Which links each agent enables for a partition, and what the IPUoF client is told."""

from __future__ import annotations

from vipu.model.configuration import PortLink, agent_settings, gcd_configs
from vipu.model.entities import (
    GwRouting,
    IldTopology,
    IpuInfo,
    IpuLinkRouting,
    MachineInventory,
    Partition,
    SyncType,
)
from vipu.model.placement import place_partition
from vipu.model.topology import ClusterLayout

SERIALS = {f"ag{i}": f"S{i}" for i in range(1, 9)}


def partition_on(layout, size, used=None, num_gcds=1, pid="p1"):
    placement = place_partition(layout, set(layout.agent_ids), used or {}, size, num_gcds=num_gcds)
    return Partition(
        id=pid, cluster_id="cl0", allocation_id="a1", size=size, num_gcds=num_gcds, num_replicas=num_gcds,
        reconfigurable=False, sync_type=SyncType.POD_NATIVE_DEFAULT, ipulink_routing=placement.ipulink_routing,
        gw_routing=placement.gw_routing, num_segments=placement.num_segments, ipus=list(placement.ipus),
    )


def test_a_two_machine_partition_enables_exactly_the_cables_between_its_machines():
    layout = ClusterLayout([f"ag{i}" for i in range(1, 5)])
    settings = agent_settings(partition_on(layout, 8), layout, SERIALS)
    assert set(settings) == {"ag1", "ag2"}
    assert settings["ag1"].ipulinks == tuple(PortLink(p, "S2", p - 4) for p in (5, 6, 7, 8))
    assert settings["ag2"].ipulinks == tuple(PortLink(p, "S1", p + 4) for p in (1, 2, 3, 4))
    assert settings["ag1"].synclinks == (PortLink(6, "S2", 2), PortLink(7, "S2", 3))
    assert settings["ag1"].gwlinks == ()
    assert [i.internal_peers for i in settings["ag1"].ipus] == [(1, 2), (0, 3), (0, 3), (1, 2)]


def test_a_partition_inside_one_machine_uses_no_cable():
    layout = ClusterLayout(["ag1", "ag2"], IldTopology.TORUS)
    settings = agent_settings(partition_on(layout, 2), layout, SERIALS)
    (only,) = settings.values()
    assert (only.ipulinks, only.synclinks, only.gwlinks) == ((), (), ())
    assert [i.internal_peers for i in only.ipus] == [(1,), (0,)]


def test_a_full_torus_partition_also_enables_the_loop_back_cables():
    layout = ClusterLayout(["ag1", "ag2", "ag3", "ag4"], IldTopology.TORUS)
    partition = partition_on(layout, 16)
    assert partition.ipulink_routing is IpuLinkRouting.RINGSWNC
    settings = agent_settings(partition, layout, SERIALS)
    assert [link.port for link in settings["ag4"].ipulinks] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert settings["ag4"].ipulinks[-1] == PortLink(8, "S1", 4)


def test_segments_in_two_domains_are_joined_by_their_gw_links():
    layout = ClusterLayout([f"ag{i}" for i in range(1, 5)], num_ilds=2)
    partition = partition_on(layout, 16)
    assert partition.gw_routing is GwRouting.RING
    settings = agent_settings(partition, layout, SERIALS)
    assert settings["ag1"].gwlinks == (PortLink(1, "S3", 2), PortLink(2, "S3", 1))
    assert settings["ag4"].gwlinks == (PortLink(1, "S2", 2), PortLink(2, "S2", 1))


def test_each_gcd_lists_its_ipus_with_routing_ids_counted_within_the_gcd():
    layout = ClusterLayout(["ag1", "ag2"])
    partition = partition_on(layout, 8, num_gcds=2)
    inventories = {
        a: MachineInventory(serial=SERIALS[a], ipuof_host=f"10.0.0.{n}", ipuof_port=50000 + n, rdma_port=60000 + n,
                            versions={"gateway-software": "2.5.1", "ipum-software": "2.5.0"}, ipu_arch_id=1,
                            ipus=[IpuInfo(i, f"chip-{a}-{i}") for i in range(4)])
        for n, a in enumerate(("ag1", "ag2"), start=1)
    }
    gcds = gcd_configs(partition, inventories)
    assert [g.gcd_id for g in gcds] == [0, 1]
    second = gcds[1]
    assert [(d.ip, d.device_id, d.routing_id, d.chip_id) for d in second.devices] == [
        ("10.0.0.2", i, i, f"chip-ag2-{i}") for i in range(4)
    ]
    assert second.attributes["GCD Id"] == "1" and second.attributes["Num IPUs"] == "4"
    assert second.devices[0].gwsw_version == "2.5.1" and second.devices[0].ipum_sw_version == "2.5.0"
