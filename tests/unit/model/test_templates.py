"""Partition templates' names: what they make, and the refusals of names that make nothing sensible."""

from __future__ import annotations

import re

import pytest

from vipu.model.errors import InvalidArgument
from vipu.model.templates import MOST_PARTITIONS, Template


def test_a_template_names_its_partitions_in_order():
    template = Template.parse("2x16+\t3x4")
    assert template.sizes == (16, 16, 4, 4, 4)
    assert template.partition_ids() == ["2x16-3x4-1", "2x16-3x4-2", "2x16-3x4-3", "2x16-3x4-4", "2x16-3x4-5"]
    assert template.partition_ids("train") == ["train1", "train2", "train3", "train4", "train5"]


@pytest.mark.parametrize(("name", "why"), [
    ("4*16", "write its partitions as COUNTxSIZE"),
    ("4x16+", "not ''"),
    ("0x16", "'0x16' makes no partition"),
    ("2x12", "a partition's size must be a power of two, not 12"),
    ("2x0", "a partition's size must be a power of two, not 0"),
    (f"{MOST_PARTITIONS}x1+1x1", f"makes more than {MOST_PARTITIONS} partitions, the most one may"),
    ("1000000000x4", "write its partitions as COUNTxSIZE"),  # refused before a list of a billion is made
    ("1x" + "9" * 5000, "write its partitions as COUNTxSIZE"),
])
def test_a_name_that_makes_nothing_sensible_is_refused_saying_why(name, why):
    with pytest.raises(InvalidArgument, match=f"template {re.escape(repr(name[:40]))}.*{re.escape(why)}"):
        Template.parse(name)


def test_a_prefix_that_makes_no_partition_id_is_refused():
    with pytest.raises(InvalidArgument, match="invalid partition id"):
        Template.parse("2x4").partition_ids("bad name")
