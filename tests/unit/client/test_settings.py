"""Client settings: HCL files read strictly, and the order in which flags, environment and files count."""

from __future__ import annotations

import pytest

from vipu.client import settings
from vipu.client.settings import parse_hcl
from vipu.model.errors import InvalidArgument


def test_client_configuration_files_are_read_strictly():
    assert parse_hcl('api-host = "h" # a comment\n\n// another\napi-port = 8090\n', "f") == {"api-host": "h", "api-port": 8090}
    with pytest.raises(InvalidArgument, match="f, line 2: expected"):
        parse_hcl('api-host = "h"\napi-port 8090\n', "f")


def test_client_settings_come_from_flags_then_environment_then_file_then_defaults(tmp_path, monkeypatch):
    system = tmp_path / "vipu-cli.hcl"
    system.write_text('api-host = "ctrl"\napi-port = 9000\napi-user-id = "alice"\napi-access-key = "k"\n'
                      'tls-server-cert = "certs/ca.pem"\ntls-client-cert = "certs/c.pem"\ntls-client-key = "certs/k.pem"\n')
    monkeypatch.setattr(settings, "SYSTEM_CONFIG", system)
    for name in ("VIPU_CLI_API_HOST", "VIPU_CLI_API_PORT", "VIPU_CLI_API_USER_ID", "VIPU_CLI_API_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    from_file = settings.client_settings(settings.Given())
    assert (from_file.host, from_file.port, from_file.user_id, from_file.server_cert) == ("ctrl", 9000, "alice", tmp_path / "certs/ca.pem")
    monkeypatch.setenv("VIPU_CLI_API_HOST", "envhost")
    assert settings.client_settings(settings.Given()).host == "envhost"
    assert settings.client_settings(settings.Given(host="flaghost", user_id="bob")).user_id == "bob"
    partial = tmp_path / "partial.hcl"
    partial.write_text('tls-client-cert = "c.pem"\n')
    with pytest.raises(InvalidArgument, match="give all three"):
        settings.client_settings(settings.Given(config=partial))


def test_a_client_told_to_ignore_the_environment_reads_its_file_alone(tmp_path, monkeypatch):
    """The vPOD orchestrator reaches each tenant's controller by that tenant's file: a port exported
    in the orchestrator's own environment must not send it elsewhere."""
    tenant = tmp_path / "vpod-admin.vipu-cli.hcl"
    tenant.write_text('api-admin-port = 9101\napi-user-id = "vpod-admin"\napi-access-key = "k"\n')
    monkeypatch.setenv("VIPU_ADMIN_API_PORT", "8091")
    monkeypatch.setenv("VIPU_CLI_API_USER_ID", "someone")
    given = settings.Given(config=tenant, host="127.0.0.1", environment=False)
    chosen = settings.client_settings(given, port_key="api-admin-port", port_env="VIPU_ADMIN_API_PORT", default_port=8091)
    assert (chosen.port, chosen.user_id) == (9101, "vpod-admin")
    assert settings.client_settings(settings.Given(config=tenant, host="127.0.0.1"), port_key="api-admin-port",
                                    port_env="VIPU_ADMIN_API_PORT", default_port=8091).port == 8091
