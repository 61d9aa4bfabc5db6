"""The agents' announcement datagram: what is sent is what is read, and junk is ignored."""

from __future__ import annotations

import pytest

from vipu.api.announcements import Announcement, decode, encode


def test_an_announcement_round_trips():
    sent = Announcement("10.1.2.1", 8080, "0024.0001.8200000")
    assert decode(encode(sent)) == sent


@pytest.mark.parametrize("data", [b"", b"not json", b"[]", b'{"kind": "other", "port": 1}', b'{"kind": "vipu-agent"}',
                                  b'{"kind": "vipu-agent", "port": 70000}', b'{"kind": "vipu-agent", "port": "80"}'])
def test_anything_else_is_ignored(data):
    assert decode(data) is None
