"""The V-IPU controller list as an administrator writes it, and following its edits."""

from __future__ import annotations

import pytest

from vipu.k8s.controllers import Controller, ControllerList, parse
from vipu.model.errors import InvalidArgument


def test_the_seeds_example_lists_two_controllers_with_their_node_labels():
    assert parse("pod001:8090:ipunode=node1,pod002:8091:ipunode=node2") == [
        Controller("pod001", 8090, "ipunode", "node1"), Controller("pod002", 8091, "ipunode", "node2")]
    assert parse(" pod001:8090 ")[0].node_selector == {}


@pytest.mark.parametrize("text, message", [
    ("", "no V-IPU controller is listed"),
    ("pod001", "is not host:port:key=value"),
    ("pod001:http:a=b", "is not host:port:key=value"),
    ("pod001:8090:ipunode", "the node label must be key=value"),
    ("pod001:99999:a=b", "is not host:port:key=value"),
])
def test_a_malformed_list_is_refused_with_the_entry(text, message):
    with pytest.raises(InvalidArgument, match=message):
        parse(text)


def test_the_list_follows_edits_and_keeps_the_last_good_one():
    text = {"value": "a:1:k=v"}
    controllers = ControllerList(lambda: text["value"], [Controller("fallback", 8090)], refresh=3600)
    assert [c.host for c in controllers()] == ["a"]
    text["value"] = "a:1:k=v,b:2:k=w"
    controllers.reload()
    assert [c.host for c in controllers()] == ["a", "b"]
    text["value"] = "b:2:k"  # a bad edit is ignored
    controllers.reload()
    assert [c.host for c in controllers()] == ["a", "b"]
    text["value"] = None  # no list any more: back to the command line's controller
    controllers.reload()
    assert [c.host for c in controllers()] == ["fallback"]
    controllers.stop()
