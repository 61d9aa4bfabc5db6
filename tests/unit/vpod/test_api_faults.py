"""A fault inside vipu-vpod's REST API: the caller hears one line naming its kind, never its text,
and the log keeps it whole. Served by uvicorn on a real port, called over HTTP as clients do."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request

import pytest

from tests.functional.harness import wait_until
from tests.unit.vpod.serving import serving
from vipu.backends.sim.rack import generate_rack
from vipu.model.entities import IldTopology
from vipu.vpod.api import ADMIN_KEY_SETTING, hash_key, make_app
from vipu.vpod.orchestrator import Orchestrator
from vipu.vpod.site import site_machines
from vipu.vpod.store import VpodStore

KEY = "the-site-administrators-key"
SECRET = "password=hunter2 at /etc/vipu/site.key"


@pytest.fixture
def served(tmp_path):
    """The API over a real store, its store's reads failing with SECRET in their text."""
    store = VpodStore(f"sqlite:///{tmp_path / 'vpod.db'}")
    rack = generate_rack(2, topology=IldTopology.MESH)
    store.add_machines(site_machines(rack))
    store.set_setting(ADMIN_KEY_SETTING, hash_key(KEY))
    orchestrator = Orchestrator(store, rack, tenants=None, agents=None)  # type: ignore[arg-type]
    app = make_app(orchestrator)

    def failing_get(vpod_id: str):
        raise RuntimeError(SECRET)

    store.get = failing_get  # type: ignore[method-assign]
    with serving(app) as port:
        yield port
    store.close()


def test_an_unexpected_fault_answers_one_line_naming_its_kind_and_the_log_keeps_the_rest(served, caplog):
    request = urllib.request.Request(f"http://127.0.0.1:{served}/v1/vpods/acme-1", headers={"Authorization": f"Bearer {KEY}"})
    with caplog.at_level(logging.ERROR), pytest.raises(urllib.error.HTTPError) as refusal:
        urllib.request.urlopen(request, timeout=30)
    assert refusal.value.code == 500
    assert json.loads(refusal.value.read()) == {"error": "internal error of vipu-vpod (RuntimeError); its log says more"}
    wait_until(lambda: any(record.exc_info and SECRET in str(record.exc_info[1]) for record in caplog.records),
               timeout=10, what="the fault in the log")  # the server logs it once the answer has gone
