"""The CLIs' tables match the layout of the seeds' examples."""

from __future__ import annotations

from vipu.cli.common import render_pairs, render_table


def test_a_list_table_has_the_layout_of_the_user_guide():
    table = render_table(["Allocation ID", "Agents"], [["alloc-1", "ag0 ag1 ag2 ag3"], ["alloc-2", "ag4 ag5"]])
    assert table.splitlines() == [
        "---------------------------------",
        " Allocation ID | Agents",
        "---------------------------------",
        " alloc-1       | ag0 ag1 ag2 ag3",
        " alloc-2       | ag4 ag5",
        "---------------------------------",
    ]


def test_a_cell_of_several_lines_spreads_over_rows_as_in_ipu_attrs():
    table = render_table(["Agent", "IPU", "Attribute", "Value"], [["ag0", "0", ["board type", "clock"], ["M2000", "1330MHz"]]],
                         top_rule=False)
    assert table.splitlines()[2:4] == [" ag0   | 0   | board type | M2000", "       |     | clock      | 1330MHz"]


def test_a_key_value_table_has_no_header():
    assert render_pairs([("Agent ID", "ag1"), ("Status", "Up")]).splitlines() == [
        "----------------",
        " Agent ID | ag1",
        " Status   | Up",
        "----------------",
    ]
