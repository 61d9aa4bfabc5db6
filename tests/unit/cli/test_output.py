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


def test_a_table_fits_a_terminal_by_wrapping_its_last_column():
    reason = ("number 2 in the queue, behind first (4 IPUs); no free 8-IPU run in allocation alloc-1: all 8 of its IPUs are in "
              "use; the IPUs it could take are held for first, first in the queue")
    headers = ["Position", "Partition", "Allocation", "Size", "User", "Waiting Since", "Why"]
    rows = [["2", "second", "alloc-1", "8", "-", "2026-11-27 10:00:00 UTC", reason]]
    wide = render_table(headers, rows)
    assert len(wide.splitlines()) == 5 and max(len(line) for line in wide.splitlines()) > 200
    fitted = render_table(headers, rows, fit=120).splitlines()
    assert max(len(line) for line in fitted) == 120
    assert " ".join(line.split("|")[-1].strip() for line in fitted[3:-1]) == reason  # every word kept, in order
    narrow = render_table(headers, rows, fit=40).splitlines()  # the other columns are not cut: the last keeps a minimum
    assert all(len(line.split("|")[-1].strip()) <= 24 for line in narrow[3:-1])
