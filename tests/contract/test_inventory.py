"""Inventory: the machine's serial and firmware, and the cable in each port, read now (a swapped cable shows at once)."""

from __future__ import annotations

from vipu.backends.capabilities import Cable


def test_the_inventory_names_the_machine(harness):
    hardware = harness.driver.hardware()
    assert hardware.serial == harness.serial
    assert hardware.firmware and all(hardware.firmware.values())
    ids = [component.id for component in hardware.components]
    assert len(ids) == len(set(ids))


def test_the_cables_plugged_are_reported_and_a_swap_is_seen(harness):
    harness.set_cable("1", "OSFP-SN-0001", "Amphenol", "OSFP-400G-AOC")
    harness.set_cable("sync1", "SYNC-SN-0001", "Molex", "SYNC-1M")
    cables = {cable.port: cable for cable in harness.driver.hardware().cables}
    assert cables["1"] == Cable("1", "OSFP-SN-0001", "Amphenol", "OSFP-400G-AOC")
    assert cables["sync1"] == Cable("sync1", "SYNC-SN-0001", "Molex", "SYNC-1M")

    harness.set_cable("1", "OSFP-SN-0002", "Finisar", "OSFP-400G-DAC")
    cables = {cable.port: cable for cable in harness.driver.hardware().cables}
    assert cables["1"] == Cable("1", "OSFP-SN-0002", "Finisar", "OSFP-400G-DAC")
    assert cables["sync1"].serial == "SYNC-SN-0001"
