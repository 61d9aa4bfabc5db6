"""Health: a failed component shows, rolls up to the machine and is an event; a management controller that stops
answering fails calls quickly, in one line, and its silence and return are events."""

from __future__ import annotations

import time

import pytest

from tests.contract.conftest import EVENT_WITHIN, UNAVAILABLE_WITHIN, wait_for
from vipu.backends.capabilities import HealthLevel
from vipu.model.errors import Unavailable


def last_sequence(driver) -> int:
    return max((event.sequence for event in driver.events(0)), default=0)


def event(driver, after: int, component: str, severity: HealthLevel):
    """The first event after `after` of that component with that severity; None while there is none."""
    return next((e for e in driver.events(after) if e.component == component and e.severity is severity), None)


def component(health, identity):
    return next(part for part in health.components if part.component == identity)


def test_a_healthy_machine(harness):
    health = harness.driver.health()
    assert health.health is HealthLevel.OK
    assert component(health, harness.known_component).health is HealthLevel.OK


def test_a_failed_component_rolls_up_and_is_an_event(harness):
    driver, known = harness.driver, harness.known_component
    mark = last_sequence(driver)
    harness.fail_component(known)
    try:
        health = driver.health()
        assert component(health, known).health is HealthLevel.CRITICAL
        assert health.health is HealthLevel.CRITICAL
        failed = wait_for(lambda: event(driver, mark, known, HealthLevel.CRITICAL), EVENT_WITHIN, f"an event saying {known} failed")
        assert failed.sequence > mark and failed.message
    finally:
        harness.heal_component(known)
    assert driver.health().health is HealthLevel.OK
    healed = wait_for(lambda: event(driver, failed.sequence, known, HealthLevel.OK), EVENT_WITHIN, f"an event saying {known} is OK again")
    sequences = [event.sequence for event in driver.events(0)]
    assert sequences == sorted(set(sequences)) and healed.sequence in sequences
    assert all(event.sequence > failed.sequence for event in driver.events(failed.sequence))


def test_a_controller_that_stops_answering(harness):
    driver = harness.driver
    mark = last_sequence(driver)
    harness.stop_answering()
    try:
        for call in (driver.health, driver.power_state, driver.hardware):
            started = time.monotonic()
            with pytest.raises(Unavailable) as refused:
                call()
            assert time.monotonic() - started < UNAVAILABLE_WITHIN
            assert refused.value.message and "\n" not in refused.value.message
        silent = wait_for(lambda: next((e for e in driver.events(mark) if e.severity is not HealthLevel.OK), None),
                          EVENT_WITHIN, "an event saying the machine does not answer")
    finally:
        harness.answer_again()
    wait_for(lambda: event(driver, silent.sequence, silent.component, HealthLevel.OK), EVENT_WITHIN, "an event saying it answers again")
    assert driver.health().health is HealthLevel.OK
