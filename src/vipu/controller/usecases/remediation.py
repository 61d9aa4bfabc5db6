"""Automatic remediation of a failed link: reset it, re-test it, and leave it quarantined if that
does not bring it back (`vipu.model.linkhealth.RemediationPolicy`).

Each link that the ledger finds failed is handed here once its failure is committed. An attempt
is refused, and the refusal kept as the link's event, when the link or its machine had as many
attempts as the policy allows within its window: a link that keeps failing is left to a person.
Otherwise the attempt is recorded (what the caps count), the agent retrains the link, and after
the settle time the link is read again through the ledger, which judges it as any reading; a
link that reads up again also has a cluster test's failure set aside (the next test judges it).
What the attempt found is kept as its outcome and as an event. The quarantine itself is the
ledger's: a failed link is one, unless the breaker holds (`LinkLedger._breaker`).

Attempts run on a small pool of their own, one at a time per link, and each waits for nothing but
its agent calls (bounded by the agent timeout) and the settle time; no lock is held across them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from vipu.controller.core.agents import AgentGateway
from vipu.controller.usecases.links import LinkLedger
from vipu.model.errors import VipuError
from vipu.model.linkhealth import (
    DEFAULT_REMEDIATION,
    Attempt,
    LinkEvent,
    LinkHealth,
    LinkName,
    RemediationPolicy,
    attempts_refusal,
)
from vipu.store.store import Store

log = logging.getLogger(__name__)


class LinkRemediation:
    def __init__(self, store: Store, gateway: AgentGateway, ledger: LinkLedger, policy: RemediationPolicy = DEFAULT_REMEDIATION,
                 clock: Callable[[], float] = time.time, workers: int = 4):
        self.store = store
        self.gateway = gateway
        self.ledger = ledger
        self.policy = policy
        self.clock = clock
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="remediation")
        self._lock = threading.Lock()
        self._under_way: set[LinkName] = set()
        self._stop = threading.Event()

    def close(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def start(self, name: LinkName) -> None:
        """Remediate a link that failed, on the pool; nothing if one is under way for it already."""
        with self._lock:
            if name in self._under_way or self._stop.is_set():
                return
            self._under_way.add(name)
        try:
            self._pool.submit(self._attempting, name)
        except RuntimeError:  # closed: the controller stops
            with self._lock:
                self._under_way.discard(name)

    def _attempting(self, name: LinkName) -> None:
        try:
            self.remediate(name)
        except Exception:
            log.exception("automatic remediation of link %s failed", name)
        finally:
            with self._lock:
                self._under_way.discard(name)

    def remediate(self, name: LinkName) -> str:
        """One attempt at bringing a failed link back; what it found, in words (kept as its outcome
        and as the link's event)."""
        now = self.clock()
        with self.store.transaction() as tx:
            refusal = attempts_refusal(name, tx.attempts_on(name.agent_id, now - self.policy.window_seconds), self.policy, now)
            if refusal:
                tx.add_attempt(Attempt(name, now, refusal))
                tx.add_link_event(LinkEvent(name, now, LinkHealth.FAILED, f"{refusal}; it stays failed for a person to see to"))
                attempt_id = 0
            else:
                attempt_id = tx.add_attempt(Attempt(name, now))
        if refusal:
            log.warning("link %s: %s", name, refusal)
            return refusal
        outcome = self._reset_and_retest(name)
        with self.store.transaction() as tx:
            tx.end_attempt(attempt_id, outcome)
            state = tx.link(name)
            health = state.health if state is not None else LinkHealth.FAILED
            tx.add_link_event(LinkEvent(name, self.clock(), health, f"automatic remediation: {outcome}"))
        log.warning("link %s: automatic remediation: %s", name, outcome)
        return outcome

    def _reset_and_retest(self, name: LinkName) -> str:
        agent = self.store.configuration().agents.get(name.agent_id)
        if agent is None:
            return "not reset: its agent was removed"
        try:
            self.gateway.reset_link(agent.host, agent.port, name.place)
        except VipuError as error:
            return f"the reset failed: {error.message}"
        if self._stop.wait(self.policy.settle_seconds):
            return "reset; not re-tested: the controller stops"
        try:
            readings, read_at = self.gateway.link_counters(agent.host, agent.port)
        except VipuError as error:
            return f"reset; the re-test could not read it: {error.message}"
        self.ledger.record(name.agent_id, readings, read_at or self.clock())
        reading = next((r for r in readings if r.place == name.place), None)
        if reading is None or not reading.up:
            with self.store.reading() as tx:
                state = tx.link(name)
            held = state is not None and state.health is LinkHealth.FAILED and not state.quarantined
            return f"reset and re-tested: still down, {'failed but not quarantined (the breaker holds)' if held else 'quarantined'}"
        state = self.ledger.retested(name, "reset by automatic remediation and up again")
        return f"reset and re-tested: up again, {state.health.value}"

