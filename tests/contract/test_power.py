"""Power: the state is read, and each action ends in the state it leads to; nonsense is refused before anything is done."""

from __future__ import annotations

import math

import pytest

from tests.contract.conftest import POWER_TIMEOUT
from vipu.backends.capabilities import PowerAction, PowerState
from vipu.model.errors import InvalidArgument


def test_the_power_state_is_read(harness):
    assert harness.driver.power_state() is PowerState.ON


def test_off_then_on(harness):
    driver = harness.driver
    assert driver.power(PowerAction.OFF, POWER_TIMEOUT) is PowerState.OFF
    assert driver.power_state() is PowerState.OFF
    assert driver.power(PowerAction.ON, POWER_TIMEOUT) is PowerState.ON
    assert driver.power_state() is PowerState.ON


@pytest.mark.parametrize("action", [PowerAction.CYCLE, PowerAction.RESET])
def test_a_cycle_or_reset_ends_on(harness, action):
    assert harness.driver.power(action, POWER_TIMEOUT) is PowerState.ON
    assert harness.driver.power_state() is PowerState.ON


@pytest.mark.parametrize(("action", "timeout"), [
    ("explode", POWER_TIMEOUT), (None, POWER_TIMEOUT),
    (PowerAction.OFF, 0), (PowerAction.OFF, -1), (PowerAction.OFF, math.nan), (PowerAction.OFF, math.inf), (PowerAction.OFF, "5"),
    (PowerAction.OFF, True),
])
def test_an_invalid_action_or_timeout_is_refused_and_nothing_done(harness, action, timeout):
    with pytest.raises(InvalidArgument) as refused:
        harness.driver.power(action, timeout)
    assert refused.value.message and "\n" not in refused.value.message
    assert harness.driver.power_state() is PowerState.ON
