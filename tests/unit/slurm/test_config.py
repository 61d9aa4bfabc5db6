"""vipu.conf as seed 004 names it: defaults, secure mode, and one clear line for each mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from vipu.model.errors import InvalidArgument
from vipu.slurm.config import default_path, load


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "vipu.conf"
    path.write_text(text)
    return path


def test_defaults_are_the_seeds(tmp_path):
    config = load(write(tmp_path, "ApiHost=ctl\nIpuofDir=/shared/ipuof\n"))
    assert (config.api_host, config.api_port, config.ipuof_dir) == ("ctl", 8090, Path("/shared/ipuof"))
    assert (config.max_ipus_per_job, config.api_timeout, config.is_secure, config.queue_timeout) == (256, 50.0, False, 300)
    assert not config.client_settings().tls
    assert load(write(tmp_path, "ApiHost=ctl\nIpuofDir=/x\nQueueTimeout=0\n")).queue_timeout == 0  # requeue at once


def test_a_jobs_slurm_account_maps_onto_a_vipu_account(tmp_path):
    assert load(write(tmp_path, "ApiHost=ctl\nIpuofDir=/x\n")).accounts.of("physics") == ""  # by default none
    assert load(write(tmp_path, "ApiHost=ctl\nIpuofDir=/x\nAccounts=same\n")).accounts.of("physics") == "physics"
    paired = load(write(tmp_path, "ApiHost=ctl\nIpuofDir=/x\nAccounts=physics=ml-a, chem=ml-b, *=same\n")).accounts
    assert (paired.of("physics"), paired.of("chem"), paired.of("bio"), paired.of("")) == ("ml-a", "ml-b", "bio", "")


def test_keys_in_any_case_with_comments_and_secure_mode(tmp_path):
    config = load(write(tmp_path, """
        # controller
        apihost = ctl   # the V-IPU controller
        APIPORT=9000
        IpuofDir=/ipuof
        MaxIpusPerJob=64
        ApiTimeout=2.5
        IsSecure=yes
        ApiUser=slurm
        ApiAccessKey=k3y
        ClientCertFile=/c/client.pem
        ClientKeyFile=/c/client-key.pem
        ServerCertFile=/c/ca.pem
    """))
    assert (config.api_port, config.max_ipus_per_job, config.api_timeout) == (9000, 64, 2.5)
    settings = config.client_settings()
    assert settings.tls and (settings.user_id, settings.access_key) == ("slurm", "k3y")
    assert (settings.server_cert, settings.client_cert, settings.client_key) == (
        Path("/c/ca.pem"), Path("/c/client.pem"), Path("/c/client-key.pem"))


@pytest.mark.parametrize("text,message", [
    ("ApiHost=ctl\n", "IpuofDir is required"),
    ("IpuofDir=/x\n", "ApiHost is required"),
    ("ApiHost ctl\n", "line 1: expected Key=Value, found 'ApiHost ctl'"),
    ("ApiHost=ctl\nIpuofDir=/x\nApiHots=y\n", "line 3: unknown key 'ApiHots'"),
    ("ApiHost=ctl\nIpuofDir=/x\nApiPort=http\n", "ApiPort must be a positive number, not 'http'"),
    ("ApiHost=ctl\nIpuofDir=/x\nApiPort=70000\n", "ApiPort must be from 1 to 65535, not 70000"),
    ("ApiHost=ctl\nIpuofDir=/x\nMaxIpusPerJob=0\n", "MaxIpusPerJob must be a positive number, not '0'"),
    ("ApiHost=ctl\nIpuofDir=/x\nIsSecure=maybe\n", "IsSecure must be yes or no, not 'maybe'"),
    ("ApiHost=ctl\nIpuofDir=/x\nQueueTimeout=600\n", "QueueTimeout must be a whole number of seconds from 0 to 540, not '600'"),
    ("ApiHost=ctl\nIpuofDir=/x\nQueueTimeout=-1\n", "QueueTimeout must be a whole number of seconds from 0 to 540, not '-1'"),
    ("ApiHost=ctl\nIpuofDir=/x\nIsSecure=yes\nApiUser=u\n", "IsSecure needs ApiAccessKey, ClientCertFile, ClientKeyFile, ServerCertFile"),
    ("ApiHost=ctl\nIpuofDir=/x\nAccounts=physics\n", "Accounts is 'same' or NAME=ACCOUNT pairs"),
    ("ApiHost=ctl\nIpuofDir=/x\nAccounts=a=bad id\n", "invalid account id"),
    ("ApiHost=ctl\nIpuofDir=/x\nTopology=torus\nNodeMachines=n1:ag1\n", "Topology must be one of tree, block, yaml, not 'torus'"),
    ("ApiHost=ctl\nIpuofDir=/x\nTopology=tree\n", "Topology needs NodeMachines"),
    ("ApiHost=ctl\nIpuofDir=/x\nNodeMachines=n1\n", "NodeMachines: 'n1' is not NODES:MACHINES"),
])
def test_each_mistake_is_one_clear_line(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(InvalidArgument) as raised:
        load(path)
    assert raised.value.message.startswith(str(path)) and message in raised.value.message
    assert "\n" not in raised.value.message


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(InvalidArgument, match=f"cannot read {tmp_path / 'vipu.conf'}: No such file or directory"):
        load(tmp_path / "vipu.conf")


def test_the_file_is_looked_for_beside_slurm_conf(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    assert default_path() == tmp_path / "vipu.conf"
    monkeypatch.delenv("SLURM_CONF")
    assert default_path() == Path("/etc/slurm/vipu.conf")
