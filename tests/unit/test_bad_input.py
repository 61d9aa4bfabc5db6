"""Bad input at every door that reads text: property tests (hypothesis).

Whatever a file or a list holds, each parser returns its result or raises InvalidArgument with
a one-line message; nothing else escapes (no traceback reaches a user).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vipu.backends.sim.rack import generate_rack, parse_rack, rack_to_data
from vipu.client.settings import ClientSettings, parse_hcl
from vipu.controller.main import link_trend_policy
from vipu.k8s import controllers, jobs, webhooks
from vipu.model.errors import InvalidArgument
from vipu.model.linkhealth import DAY, LinkName
from vipu.slurm import config as slurm_config

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
                       lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
                       max_leaves=12)


def refused_in_one_line(parse, *args):
    try:
        return parse(*args)
    except InvalidArgument as error:
        assert error.message and "\n" not in error.message.strip(), error.message
        return None


@SETTINGS
@given(st.text())
def test_client_configuration_files(text):
    refused_in_one_line(parse_hcl, text, "vipu-cli.hcl")


@SETTINGS
@given(st.text(alphabet=st.sampled_from("h1:[]f0,9 \n\u00b2x"), max_size=24) | st.text(max_size=24))
def test_lists_of_controller_hosts(hosts):
    addresses = refused_in_one_line(lambda: ClientSettings(hosts, 8090).addresses)
    for address in addresses or ():
        host, _, port = address.rpartition(":")
        assert host and 1 <= int(port) <= 65535, address


LINE = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)


@SETTINGS
@given(st.lists(st.one_of(LINE, st.sampled_from(["ApiHost=h", "ApiPort=x", "ApiPort=99999", "IsSecure=maybe",
                                                 "MaxIpusPerJob=-1", "ApiTimeout=0", "= 3", "IpuofDir="])), max_size=8))
def test_slurm_vipu_conf(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("conf") / "vipu.conf"
    path.write_text("\n".join(lines))
    refused_in_one_line(slurm_config.load, path)


@SETTINGS
@given(st.text())
def test_rack_descriptions_as_any_text(text):
    refused_in_one_line(parse_rack, text, "rack.yaml")


VALID_RACK = rack_to_data(generate_rack(2))


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, (*prefix, index))


RACK_PATHS = [p for p in _paths(VALID_RACK) if p]


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(RACK_PATHS), JSONISH, st.booleans()), min_size=1, max_size=3))
def test_rack_descriptions_with_a_value_changed_or_dropped(edits):
    document = yaml.safe_load(yaml.safe_dump(VALID_RACK))
    for path, value, drop in edits:
        node = document
        try:
            for part in path[:-1]:
                node = node[part]
            if drop and isinstance(node, dict):
                node.pop(path[-1], None)
            else:
                node[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue
    refused_in_one_line(parse_rack, yaml.safe_dump(document), "rack.yaml")


@SETTINGS
@given(st.text())
def test_controller_lists(text):
    refused_in_one_line(controllers.parse, text)


SEED_JOB = {"metadata": {"name": "job", "namespace": "default", "uid": "u"},
            "spec": {"modelReplicas": "4", "ipusPerModelReplica": "1", "launcher": {"command": ["mpirun"]},
                     "workers": {"replicas": 1, "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}}}
JOB_FIELDS = ["modelReplicas", "ipusPerModelReplica", "launcher", "workers", "interactive", "restartPolicy", "cleanPodPolicy"]


@SETTINGS
@given(st.dictionaries(st.sampled_from(JOB_FIELDS), JSONISH, max_size=4))
def test_ipujob_specifications_and_the_validating_webhook(changes):
    job = {**SEED_JOB, "spec": {**SEED_JOB["spec"], **changes}}
    refused_in_one_line(jobs.parse, job)
    answer = webhooks.validate({"request": {"uid": "r", "operation": "CREATE", "object": job}})["response"]
    assert answer["allowed"] is True or answer["status"]["message"].startswith("IPUJob job: ")
    assert isinstance(webhooks.mutate({"request": {"uid": "r", "object": job}})["response"]["allowed"], bool)


def test_the_property_tests_see_valid_input_too(tmp_path):
    """The generators above are not all refusals: the unchanged documents parse."""
    assert parse_rack(yaml.safe_dump(VALID_RACK), "rack.yaml").machines
    assert jobs.parse(SEED_JOB).ipus == 4
    path = Path(tmp_path) / "vipu.conf"
    path.write_text("ApiHost=h\nIpuofDir=/tmp\n")
    assert slurm_config.load(path).api_host == "h"


@SETTINGS
@given(st.text(alphabet=st.sampled_from("0123456789,.-e +naif_"), max_size=16) | st.text(max_size=16))
def test_link_trend_settings(text):
    policy = refused_in_one_line(link_trend_policy, text)
    assert policy is None or (1 <= policy.growing <= policy.windows and 0 < policy.span_seconds <= 7 * DAY), policy


@SETTINGS
@given(st.text(alphabet=st.sampled_from("ag3:510sycnwipu4ABCDE"), max_size=14) | st.text(max_size=14))
def test_link_names(text):
    name = refused_in_one_line(LinkName.parse, text)
    assert name is None or LinkName.parse(str(name)) == name
