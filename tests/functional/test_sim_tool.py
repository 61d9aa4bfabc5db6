"""vipu-sim writes racks and puts faults into them, all or nothing."""

from __future__ import annotations

import subprocess

from tests.functional.harness import BIN, Result, failed_line
from vipu.backends.sim.rack import load_rack
from vipu.model.topology import LinkKind


def sim(*args: str) -> Result:
    done = subprocess.run([str(BIN / "vipu-sim"), *args], capture_output=True, text=True, timeout=60)
    return Result(done.returncode, done.stdout, done.stderr)


def test_a_rack_is_written_and_faults_go_into_it(tmp_path):
    path = tmp_path / "pod.yaml"
    made = sim("rack", str(path), "--machines", "8", "--topology", "mesh", "--ilds", "2", "--time-scale", "0.01")
    assert made.out == f"rack ({path}): success. 8 machines, 44 cables.\n", made.err
    rack = load_rack(path)
    assert (len(rack.machines), rack.time_scale) == (8, 0.01)

    done = sim("fault", str(path), "--unplug", "m01:IPU-Link:5", "--cross", "m02:ipulink:5,m02:6", "--move", "m04:IPU-Link:1=8",
               "--errors", "m03:IPU-Link:5=327", "--errors", "m03:ipu1:4C=521", "--break", "m02:Sync-Link:6",
               "--version", "m04:agent=1.5.1", "--pfc", "m05:eth1=0,2", "--silent", "m06", "--configure-fault", "m07=dead IPU")
    assert done.out == f"fault ({path}): success.\n", done.err
    rack = load_rack(path)
    assert rack.plugged("m01", LinkKind.IPULINK, 5) is None
    assert rack.plugged("m02", LinkKind.IPULINK, 5)[1].port == 2  # crossed with port 6's cable
    assert rack.plugged("m04", LinkKind.IPULINK, 8) is not None and rack.plugged("m04", LinkKind.IPULINK, 1) is None
    assert rack.plugged("m03", LinkKind.IPULINK, 5)[0].errors == 327 and rack.machine("m03").link_errors == {"ipu1:4C": 521}
    assert rack.plugged("m02", LinkKind.SYNC, 6)[0].broken
    assert rack.machine("m04").versions["agent"] == "1.5.1" and rack.machine("m05").rnics[0].pfc_classes == [0, 2]
    assert rack.machine("m06").faults.silent and rack.machine("m07").faults.configure == "dead IPU"


def test_a_bad_fault_changes_nothing(tmp_path):
    path = tmp_path / "pod.yaml"
    assert sim("rack", str(path), "--machines", "2").code == 0
    before = path.read_text()
    failed_line(sim("fault", str(path), "--silent", "m01", "--unplug", "m02:IPU-Link:5"), "fault", str(path),
                "no IPU-Link cable is plugged into m02:5")
    failed_line(sim("fault", str(path), "--pfc", "m01=1"), "fault", str(path), "expected M:RNIC=C,C,...")
    assert path.read_text() == before
