"""The names of a vPOD's Kubernetes objects: DNS labels, one per id, even for ids a label cannot hold."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from vipu.vpod.kubernetes import object_name, secret_key

DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
VPOD_IDS = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,57}", fullmatch=True)


@given(VPOD_IDS)
def test_every_vpod_id_names_its_objects_with_a_dns_label(vpod_id):
    assert DNS_LABEL.fullmatch(object_name(vpod_id))


def test_ids_a_label_would_confuse_get_names_of_their_own():
    names = {object_name(i) for i in ("Acme-1", "acme-1", "acme.1", "acme:1", "acme_1", "...", "a" * 58)}
    assert len(names) == 7
    assert object_name("acme-1").startswith("vpod-acme-1-")


def test_a_certificate_file_keeps_its_place_under_a_key_without_slashes():
    assert secret_key(Path("server/server-key.pem")) == "server__server-key.pem"
