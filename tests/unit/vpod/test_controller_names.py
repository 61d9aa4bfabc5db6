"""What the site's agents know a vPOD's controller by: a valid id for every tenant id, one per vPOD."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from vipu.model.entities import ID_MAX_LENGTH, check_id
from vipu.vpod.tenants import controller_name

TENANTS = st.from_regex(rf"[A-Za-z0-9][A-Za-z0-9._:-]{{0,{ID_MAX_LENGTH - 1}}}", fullmatch=True)


@given(TENANTS, st.integers(1, 99_999))
def test_every_tenant_id_gives_its_vpods_controllers_a_valid_name(tenant, number):
    check_id("controller", controller_name(f"{tenant}-{number}"))


def test_a_long_tenant_id_is_taken_and_its_vpods_keep_names_of_their_own():
    tenant = "t" * 60  # a valid tenant id: its vPOD ids, tenant-1 and so on, are longer than an id may be
    names = {controller_name(f"{tenant}-{number}") for number in range(1, 1000)}
    assert len(names) == 999
    assert all(len(name) <= ID_MAX_LENGTH for name in names)
    assert controller_name("acme-1") == "vpod-acme-1"  # a short one is named as before
