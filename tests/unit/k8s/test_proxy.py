"""The proxy's estimate of how many partitions of a size fit, as `/query` reports it."""

from __future__ import annotations

import pytest

from vipu.k8s.proxy import fitting_partitions

MACHINES = ("ag1", "ag2", "ag3", "ag4")


@pytest.mark.parametrize("used, size, expected", [
    ({}, 1, 16), ({}, 2, 8), ({}, 4, 4), ({}, 8, 2), ({}, 16, 1), ({}, 32, 0),
    ({"ag1": {0}}, 2, 7),            # the pair holding IPU 0 is broken
    ({"ag1": {0}}, 4, 3),
    ({"ag2": {3}}, 8, 1),            # ag3+ag4 only: ag1 alone is no run of two
    ({"ag1": {1}, "ag3": {2}}, 8, 0),
    ({"ag1": {0, 1, 2, 3}}, 1, 12),
])
def test_partitions_fit_in_aligned_groups_and_runs_of_free_machines(used, size, expected):
    assert fitting_partitions(MACHINES, used, size) == expected
