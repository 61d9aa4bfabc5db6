"""The simulator's telemetry model and machine log, and the bounded keeps they go into."""

from __future__ import annotations

import dataclasses

import pytest

from tests.unit.backends.test_sim_machine import settings
from vipu.backends.sim import faults
from vipu.backends.sim.machine import BUSY_CELSIUS, IDLE_CELSIUS, RUN_WORK_SECONDS, RackFile, SimMachine
from vipu.backends.sim.machinelog import LOST_LINES, ROTATE_BYTES, LogFollower, machine_log_path, write_lines
from vipu.backends.sim.rack import generate_rack, load_rack, save_rack
from vipu.model.errors import InvalidArgument
from vipu.model.telemetry import IpuReading, LogTail, TelemetryReading, UtilisationHistory, with_environment


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def rack_path(tmp_path):
    path = tmp_path / "rack.yaml"
    save_rack(generate_rack(1, time_scale=0.0), path)
    return path


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def machine(rack_path, clock):
    machine = SimMachine(RackFile(rack_path), "m01", clock=clock)
    machine.apply(dataclasses.replace(settings("p1", (0, 1)), attach_key="k"))
    return machine


def run(machine: SimMachine, ipu: int, times: int = 1) -> None:
    for _ in range(times):
        machine.ipuof_run("p1", ipu, "", ipu, 1, "k", session="s")


def test_utilisation_follows_the_programs_run_and_temperature_follows_utilisation(machine, clock):
    run(machine, 0, times=10)  # 30 s of work for IPU 0; IPU 1 of the same partition runs nothing
    clock.now += 10
    busy, idle = machine.telemetry().ipu(0), machine.telemetry().ipu(1)
    assert busy.utilisation > 99 and idle.utilisation == 0
    assert IDLE_CELSIUS + 5 < busy.temperature < BUSY_CELSIUS and idle.temperature == IDLE_CELSIUS
    assert busy.power > idle.power and busy.memory_used > 0 and idle.memory_used == 0
    clock.now += 200  # long after its work ended: cool and idle again
    after = machine.telemetry().ipu(0)
    assert after.utilisation < 1 and after.temperature < IDLE_CELSIUS + 1
    hotter = [machine.telemetry().ipu(0).temperature]
    for _ in range(3):  # a steady load: the temperature climbs towards the busy one, never past it
        run(machine, 0, times=int(20 / RUN_WORK_SECONDS))
        clock.now += 20
        hotter.append(machine.telemetry().ipu(0).temperature)
    assert hotter == sorted(hotter) and hotter[-1] < BUSY_CELSIUS


def test_the_fault_injector_raises_error_counters_and_heat_and_the_machine_logs_the_rise(machine, rack_path, clock):
    rack = load_rack(rack_path)
    faults.count_ipu_errors(rack, "m01", "ipu2", "ecc", 3)
    faults.count_ipu_errors(rack, "m01", "ipu2", "parity", 1)
    faults.heat(rack, "m01", "ipu1", 40)
    save_rack(rack, rack_path)
    clock.now += 500
    reading = machine.telemetry()
    assert (reading.ipu(2).ecc_errors, reading.ipu(2).parity_errors, reading.ipu(0).ecc_errors) == (3, 1, 0)
    assert reading.ipu(1).temperature == pytest.approx(IDLE_CELSIUS + 40, abs=0.5)
    texts = [text for _, _, text in machine.log_lines()]
    assert "IPU 2: 3 corrected ECC errors (3 in all)" in texts and "IPU 2: 1 corrected parity errors (1 in all)" in texts
    machine.telemetry()
    assert machine.log_lines() == []  # a counter that did not rise is not logged again
    with pytest.raises(InvalidArgument, match="'ipu7' is not an IPU of a machine"):
        faults.count_ipu_errors(rack, "m01", "ipu7", "ecc", 1)
    with pytest.raises(InvalidArgument, match="unknown IPU error kind 'dram'"):
        faults.count_ipu_errors(rack, "m01", "ipu0", "dram", 1)


def test_the_machine_log_rotates_so_a_flood_keeps_the_disk_bounded_and_the_follower_loses_no_line_it_could_read(tmp_path):
    path = machine_log_path(tmp_path / "rack.yaml", "m01")
    follower = LogFollower(path)
    assert follower.read() == []
    seen = []
    for batch in range(10):
        write_lines(path, [f"flood {batch}-{n} " + "x" * 60 for n in range(1000)])
        seen += [text for _, text in follower.read()]
    assert path.stat().st_size <= ROTATE_BYTES and path.with_suffix(".log.1").stat().st_size <= ROTATE_BYTES + 200
    assert len(seen) == 10_000 and seen[0].startswith("flood 0-0 ") and seen[-1].startswith("flood 9-999 ")


def test_a_log_tail_keeps_the_latest_and_a_reader_learns_what_it_missed():
    tail = LogTail(keep=3)
    for n in range(5):
        tail.add(float(n), "gateway", f"l{n}")
    lines, missed = tail.after(0)
    assert [line.text for line in lines] == ["l2", "l3", "l4"] and missed == 2
    assert tail.after(4) == ([tail.lines[-1]], 0) and tail.after(5) == ([], 0)
    assert [line.sequence for line in tail.after(99)[0]] == [3, 4, 5]  # the reader's count is from before a restart


def test_a_partitions_history_covers_its_whole_life_in_a_bounded_number_of_samples():
    history = UtilisationHistory(keep=10)
    for second in range(1000):
        history.add(float(second), (float(second % 100),))
    assert len(history.samples) <= 10 and history.samples[0][0] == 0 and history.samples[-1][0] == 999


def test_a_bmc_without_an_ipus_sensor_leaves_its_temperature_absent_not_zero():
    fabric = TelemetryReading(5.0, (IpuReading(0, 50.0, 40.0, 90.0, 1330.0), IpuReading(1, 0.0, 35.0, 40.0, 1330.0)))
    merged = with_environment(fabric, TelemetryReading(4.0, (IpuReading(1, temperature=37.5),)))
    assert (merged.ipu(0).temperature, merged.ipu(0).power, merged.ipu(0).utilisation) == (None, None, 50.0)
    assert merged.ipu(1).temperature == 37.5 and merged.read_at == 4.0


def test_a_flood_that_rotates_the_log_twice_between_reads_says_lines_were_lost(tmp_path):
    path = machine_log_path(tmp_path / "rack.yaml", "m01")
    write_lines(path, ["before"])
    follower = LogFollower(path)
    assert [text for _, text in follower.read()] == ["before"]
    flood = 3 * ROTATE_BYTES // 100
    write_lines(path, [f"flood {n} " + "x" * 100 for n in range(flood)])
    texts = [text for _ in range(3) for _, text in follower.read()]  # each read takes at most READ_BYTES of a file
    lost = texts.index(LOST_LINES)  # after the rest of the file it had open, before the last two
    assert texts[0].startswith("flood 0 ") and texts[lost - 1].startswith("flood ") and texts[-1].startswith(f"flood {flood - 1} ")
    numbers = [int(text.split()[1]) for text in texts if text != LOST_LINES]
    assert numbers == sorted(numbers) and len(numbers) < 3 * ROTATE_BYTES // 100
