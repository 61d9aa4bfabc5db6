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


def test_wrong_and_missing_keys_cost_a_check_each_are_counted_logged_and_lock_the_address_out(served, caplog):
    port, checks = served
    with caplog.at_level(logging.WARNING, logger="vipu.vpod.api"):
        assert call(port, None)[0] == 401
        assert call(port, "a-guess")[0] == 401
        assert len(checks) == 2  # the missing key was checked too, against a decoy: as costly as a wrong one
        status, error = call(port, "another-guess")  # the LIMIT-th failure from this address locks it out
        assert status == 401
        status, error = call(port, KEY)  # then even the right key, from there, costs no check
        assert (status, len(checks)) == (401, 3)
        assert error.startswith("too many failed logins for user administrator from this address; try again in ")
        assert call(port, KEY, source="127.0.0.2")[0] == 200  # another address goes on
    assert refusals(port) == {"no key": 1, "wrong key": 2, "locked out": 1}
    lines = [record.getMessage() for record in caplog.records]
    assert "a call from 127.0.0.1 refused: no key" in lines  # the first; the rest within 10 s are counted, not logged
    assert not any("refused: wrong key" in line for line in lines)
    assert f"logins of user 'administrator' from 127.0.0.1 refused for 60 s after {LIMIT} failures" in lines
