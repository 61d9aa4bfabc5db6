"""The CLIs' tables match the layout of the seeds' examples."""

from __future__ import annotations

import pytest

from vipu.cli.common import render_pairs, render_table
from vipu.cli.config import parse_hcl
from vipu.model.errors import InvalidArgument


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
    table = render_table(["Agent", "IPU", "Attribute", "Value"], [["ag0", "0", ["board type", "clock"], ["M2000", "1330MHz"]]], top_rule=False)
    assert table.splitlines()[2:4] == [" ag0   | 0   | board type | M2000", "       |     | clock      | 1330MHz"]


def test_a_key_value_table_has_no_header():
    assert render_pairs([("Agent ID", "ag1"), ("Status", "Up")]).splitlines() == [
        "----------------",
        " Agent ID | ag1",
        " Status   | Up",
        "----------------",
    ]


def test_client_configuration_files_are_read_strictly():
    assert parse_hcl('api-host = "h" # a comment\n\n// another\napi-port = 8090\n', "f") == {"api-host": "h", "api-port": 8090}
    with pytest.raises(InvalidArgument, match="f, line 2: expected"):
        parse_hcl('api-host = "h"\napi-port 8090\n', "f")


def test_client_settings_come_from_flags_then_environment_then_file_then_defaults(tmp_path, monkeypatch):
    from vipu.cli import config

    system = tmp_path / "vipu-cli.hcl"
    system.write_text('api-host = "ctrl"\napi-port = 9000\napi-user-id = "alice"\napi-access-key = "k"\n'
                      'tls-server-cert = "certs/ca.pem"\ntls-client-cert = "certs/c.pem"\ntls-client-key = "certs/k.pem"\n')
    monkeypatch.setattr(config, "SYSTEM_CONFIG", system)
    for name in ("VIPU_CLI_API_HOST", "VIPU_CLI_API_PORT", "VIPU_CLI_API_USER_ID", "VIPU_CLI_API_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    from_file = config.client_settings(config.Given())
    assert (from_file.host, from_file.port, from_file.user_id, from_file.server_cert) == ("ctrl", 9000, "alice", tmp_path / "certs/ca.pem")
    monkeypatch.setenv("VIPU_CLI_API_HOST", "envhost")
    assert config.client_settings(config.Given()).host == "envhost"
    assert config.client_settings(config.Given(host="flaghost", user_id="bob")).user_id == "bob"
    partial = tmp_path / "partial.hcl"
    partial.write_text('tls-client-cert = "c.pem"\n')
    with pytest.raises(InvalidArgument, match="give all three"):
        config.client_settings(config.Given(config=partial))
