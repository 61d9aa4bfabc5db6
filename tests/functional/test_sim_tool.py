"""vipu-sim writes racks and puts faults into them, all or nothing."""

from __future__ import annotations

import os
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


def test_links_are_made_to_go_bad_recover_and_have_their_cables_swapped(tmp_path):
    path = tmp_path / "pod.yaml"
    assert sim("rack", str(path), "--machines", "2").code == 0
    done = sim("fault", str(path), "--degrade", "m01:IPU-Link:5=bursts:40:3600", "--degrade", "m02:ipu1:4C=flapping:3",
               "--swap-cable", "m01:Sync-Link:6=SPARE-7")
    assert done.out == f"fault ({path}): success.\n", done.err
    rack = load_rack(path)
    degrading = rack.plugged("m01", LinkKind.IPULINK, 5)[0].degradation
    assert degrading is not None and (degrading.pattern, degrading.per_minute, degrading.fails_after) == ("bursts", 40, 3600.0)
    assert rack.machine("m02").degrading_links["ipu1:4C"].pattern == "flapping"
    assert rack.plugged("m01", LinkKind.SYNC, 6)[0].serial == "SPARE-7"
    assert sim("fault", str(path), "--recover", "m02:ipu1:4C").code == 0
    assert load_rack(path).machine("m02").degrading_links["ipu1:4C"].recovered_at >= degrading.since

    before = path.read_text()
    failed_line(sim("fault", str(path), "--degrade", "m01:IPU-Link:6=steady"), "fault", str(path), "expected LINK=PATTERN:N[:SECONDS]")
    failed_line(sim("fault", str(path), "--degrade", "m01:IPU-Link:6=drifting:5"), "fault", str(path), "not 'drifting'")
    failed_line(sim("fault", str(path), "--recover", "m01:IPU-Link:6"), "fault", str(path), "is not degrading")
    assert path.read_text() == before


def test_files_that_are_not_regular_or_too_long_are_refused_in_one_line_without_reading_them(tmp_path):
    """/dev/zero would be read until memory runs out, and a FIFO waited on for ever (each program
    is given 60 s); a sparse file past its kind's bound is refused unread."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.conf"
    with huge.open("wb") as file:
        file.truncate(300 << 20)  # past both bounds: an IPUoF configuration's and a rack's
    ipuof = str(BIN / "vipu-ipuof")
    for command, env, line in [
        ([str(BIN / "vipu-sim"), "fault", "/dev/zero", "--silent", "m01"], {},
         "fault (/dev/zero): failed: cannot read rack description /dev/zero: not a regular file."),
        ([str(BIN / "vipu-sim"), "fault", str(fifo), "--silent", "m01"], {},
         f"fault ({fifo}): failed: cannot read rack description {fifo}: not a regular file."),
        ([str(BIN / "vipu-sim"), "fault", str(huge), "--silent", "m01"], {},
         f"fault ({huge}): failed: cannot read rack description {huge}: longer than 262144 KiB, not a rack description."),
        ([ipuof, "run", "/dev/zero"], {}, "run (zero): failed: cannot read /dev/zero: not a regular file."),
        ([ipuof, "run"], {"IPUOF_CONFIG_PATH": "/dev/zero"}, "run (/dev/zero): failed: cannot read /dev/zero: not a regular file."),
        ([ipuof, "run"], {"IPUOF_CONFIG_PATH": str(fifo)}, f"run ({fifo}): failed: cannot read {fifo}: not a regular file."),
        ([ipuof, "run", str(huge)], {}, f"run (huge.conf): failed: cannot read {huge}: longer than 1024 KiB, not an IPUoF configuration."),
    ]:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, env={**os.environ, **env})
        assert (done.returncode, done.stdout, done.stderr) == (1, "", line + "\n"), command
