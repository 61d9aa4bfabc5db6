"""Wrong administrator keys at vipu-vpod's REST API: each costs one scrypt whether a key was given or
not, is counted by reason in /metrics and logged at a bounded rate, and enough of them from one
address lock that address out (costing no scrypt) while other addresses go on. Served by uvicorn
on a real port, called over HTTP as clients do."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request

import pytest

from tests.unit.vpod.serving import serving
from vipu.backends.sim.rack import generate_rack
from vipu.model.entities import IldTopology
from vipu.model.throttle import LoginThrottle
from vipu.vpod import api
from vipu.vpod.api import ADMIN_KEY_SETTING, hash_key, make_app
from vipu.vpod.orchestrator import Orchestrator
from vipu.vpod.site import site_machines
from vipu.vpod.store import VpodStore

KEY = "the-site-administrators-key"
LIMIT = 3


@pytest.fixture
def served(tmp_path, monkeypatch):
    """The API over a real store; how many key checks (scrypts) it made, in `checks`."""
    store = VpodStore(f"sqlite:///{tmp_path / 'vpod.db'}")
    rack = generate_rack(2, topology=IldTopology.MESH)
    store.add_machines(site_machines(rack))
    store.set_setting(ADMIN_KEY_SETTING, hash_key(KEY))
    checks = []
    checking = api.key_matches
    monkeypatch.setattr(api, "key_matches", lambda key, stored: checks.append(key) or checking(key, stored))
    app = make_app(Orchestrator(store, rack, tenants=None, agents=None), throttle=LoginThrottle(limit=LIMIT, lockout=60))  # type: ignore[arg-type]
    with serving(app) as port:
        yield port, checks
    store.close()


def call(port: int, key: str | None, source: str = "127.0.0.1") -> tuple[int, str]:
    """GET /v1/machines from `source` (any 127.x.y.z reaches the loopback); status and error line."""
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    try:
        connection.request("GET", "/v1/machines", headers={"Authorization": f"Bearer {key}"} if key is not None else {})
        answer = connection.getresponse()
        body = json.loads(answer.read() or b"{}")
        return answer.status, body.get("error", "")
    finally:
        connection.close()


def refusals(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("vipu_vpod_failed_logins_total{")}


def test_wrong_and_missing_keys_cost_a_check_each_are_counted_logged_and_locked_out_but_never_the_right_key(served, caplog):
    port, checks = served
    with caplog.at_level(logging.WARNING, logger="vipu.vpod.api"):
        for _ in range(LIMIT):
            assert call(port, None)[0] == 401
            assert call(port, "a-guess")[0] == 401
        assert len(checks) == 2 * LIMIT  # a missing key is checked too, against a decoy: as costly as a wrong one
        status, error = call(port, "a-guess")  # locked out from this address: refused unchecked
        assert (status, len(checks)) == (401, 2 * LIMIT)
        assert error.startswith("too many failed logins for user 'administrator (key ")
        assert error.endswith(" from this address; try again in 60 s")
        assert call(port, None)[0] == 401 and len(checks) == 2 * LIMIT
        assert call(port, KEY)[0] == 200  # the right key from the same address, which nobody guessing sends, gets in
        assert call(port, "another-guess")[0] == 401 and len(checks) == 2 * LIMIT + 2  # a new guess is checked, and counted
    assert refusals(port) == {"no key": LIMIT, "wrong key": LIMIT + 1, "locked out": 2}
    lines = [record.getMessage() for record in caplog.records]
    assert "a call from 127.0.0.1 refused: no key" in lines  # the first; the rest within 10 s are counted, not logged
    assert f"logins of user 'administrator (no key)' from 127.0.0.1 refused for 60 s after {LIMIT} failures" in lines


def test_a_forwarded_address_is_believed_only_from_a_named_proxy(tmp_path):
    store = VpodStore(f"sqlite:///{tmp_path / 'vpod.db'}")
    store.set_setting(ADMIN_KEY_SETTING, hash_key(KEY))
    app = make_app(Orchestrator(store, generate_rack(2), tenants=None, agents=None),  # type: ignore[arg-type]
                   throttle=LoginThrottle(limit=1, lockout=60))
    with serving(app, trusted_proxies=("127.0.0.3",)) as port:
        # Through the proxy, each caller is counted as itself: one caller's guess locks out no other.
        assert forwarded(port, "a-guess", "127.0.0.3", "192.0.2.7")[0] == 401
        assert forwarded(port, "a-guess", "127.0.0.3", "192.0.2.7")[1].startswith("too many failed logins")
        assert forwarded(port, "a-guess", "127.0.0.3", "192.0.2.8")[1] == "give the orchestrator's administrator key " \
                                                                        "(Authorization: Bearer KEY)"
        # From anywhere else the header is the caller's own words: counted by the peer's address.
        assert forwarded(port, "a-guess", "127.0.0.1", "192.0.2.9")[0] == 401
        assert forwarded(port, "a-guess", "127.0.0.1", "192.0.2.10")[1].startswith("too many failed logins")
    store.close()


def forwarded(port: int, key: str, source: str, client: str) -> tuple[int, str]:
    """GET /v1/machines from `source`, saying it forwards for `client`; status and error line."""
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    try:
        connection.request("GET", "/v1/machines", headers={"Authorization": f"Bearer {key}", "X-Forwarded-For": client})
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read() or b"{}").get("error", "")
    finally:
        connection.close()
