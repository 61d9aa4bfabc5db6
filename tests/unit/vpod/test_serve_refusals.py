"""`vipu-vpod serve` refuses, in one line and before serving, options that do not go together and
a place for tenants' controllers other than the one its live vPODs use."""

from __future__ import annotations

import io
import socket
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest

from tests.ports import free_port
from vipu.backends.sim.rack import generate_rack, save_rack
from vipu.cli.common import exit_status
from vipu.model.entities import IldTopology
from vipu.vpod import main
from vipu.vpod.store import SiteMachine, Vpod, VpodStore


def serve(tmp_path, *options: str) -> tuple[int, str]:
    save_rack(generate_rack(2, topology=IldTopology.MESH), tmp_path / "site.yaml")
    out, err, argv = io.StringIO(), io.StringIO(), sys.argv
    sys.argv = ["vipu-vpod", "serve", "--data-dir", str(tmp_path / "data"), "--rack", str(tmp_path / "site.yaml"),
                "--port", str(free_port()), *options]  # not the default port, which the README's walk-through may be serving on
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = exit_status(main.cli, "vipu-vpod")
    finally:
        sys.argv = argv
    return code, err.getvalue()


OPENSTACK = ("--provider", "openstack", "--openstack-cloud", "site", "--openstack-image", "vipu-controller", "--openstack-flavor",
             "vpod-controller", "--openstack-subnet-pool", "vpods", "--openstack-store", "postgresql://u@h/postgres")


@pytest.mark.parametrize("options, reason", [
    (("--kubernetes-image", "vipu:1"), "--kubernetes-image is for controllers on Kubernetes: give --kubernetes-namespace too"),
    (("--kubernetes-controller-host", "h"), "--kubernetes-controller-host is for controllers on Kubernetes"),
    (("--kubernetes-namespace", "vpods"), "--kubernetes-namespace needs --kubernetes-image and --kubernetes-store too"),
    (("--kubernetes-namespace", "vpods", "--kubernetes-image", "vipu:1", "--kubernetes-store", "postgresql://u@h/postgres",
      "--advertise-host", "10.0.0.1"), "--advertise-host is for controllers on this host"),
    (("--kubernetes-namespace", "vpods", "--kubernetes-image", "vipu:1", "--kubernetes-store", "sqlite:///x.db"),
     "tenants' controllers on Kubernetes keep their stores on PostgreSQL"),
    (("--provider", "openstack", "--openstack-cloud", "site"),
     "--provider openstack needs --openstack-image, --openstack-flavor, --openstack-subnet-pool, --openstack-store too"),
    ((*OPENSTACK, "--advertise-host", "10.0.0.1"), "--kubernetes-namespace and --advertise-host are for other providers"),
    ((*OPENSTACK, "--kubernetes-namespace", "vpods"), "--kubernetes-namespace and --advertise-host are for other providers"),
    (("--openstack-router", "site-router"), "--openstack-router is for controllers on OpenStack: give --provider openstack too"),
    (("--openstack-image", "vipu-controller"), "--openstack-image is for controllers on OpenStack: give --provider openstack too"),
    (OPENSTACK, "cannot use OpenStack cloud site: "),  # no such entry in clouds.yaml
    ((*OPENSTACK, "--openstack-ssh-cidr", "192.0.2.0/24", "--openstack-ssh-cidr", "office"),
     "--openstack-ssh-cidr 'office' is not a network (192.0.2.0/24) or an address"),
    ((*OPENSTACK, "--openstack-ssh-cidr", "198.51.100.7/24"),
     "--openstack-ssh-cidr '198.51.100.7/24' has host bits set: write the network (198.51.100.0/24) or the address alone"),
    ((*OPENSTACK, "--openstack-admit-cidr", "lab"), "--openstack-admit-cidr 'lab' is not a network (192.0.2.0/24) or an address"),
    ((*OPENSTACK, "--listen-address", "0.0.0.0"), "give --openstack-handover-address, the address they reach this orchestrator at"),
    (("--openstack-handover-address", "192.0.2.1"), "--openstack-handover-address is for controllers on OpenStack"),
])
def test_options_that_do_not_go_together_are_refused_in_one_line(tmp_path, monkeypatch, options, reason):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    monkeypatch.delenv("VIPU_VPOD_KUBERNETES_STORE", raising=False)
    monkeypatch.delenv("VIPU_VPOD_OPENSTACK_STORE", raising=False)
    (tmp_path / "clouds.yaml").write_text("clouds: {}\n")
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(tmp_path / "clouds.yaml"))
    code, err = serve(tmp_path, *options)
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("vipu-vpod serve: ") and reason in err, err


def test_controllers_stay_where_the_live_vpods_have_theirs_until_those_are_released(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    store = VpodStore(f"sqlite:///{tmp_path / 'data' / 'vpod.db'}")
    store.add_machines([SiteMachine("m01", 0, "127.0.0.1", 18101)])
    store.set_setting("runner", "local")
    store.add_vpod(Vpod("acme-1", "acme", "Active", "active", ["m01"], "mesh", 1, "acme", [1, 2, 3]))
    code, err = serve(tmp_path, "--kubernetes-namespace", "vpods", "--kubernetes-image", "vipu:1", "--kubernetes-store",
                      "postgresql://u@h/postgres")
    assert (code, err) == (2, "vipu-vpod serve: the vPODs of this orchestrator have their controllers as processes of this host; "
                              "release them first, or serve as before\n")
    store.start_release("acme-1")
    store.finish_release("acme-1", "active")
    code, err = serve(tmp_path, "--kubernetes-namespace", "vpods", "--kubernetes-image", "vipu:1", "--kubernetes-store",
                      "postgresql://u@h/postgres")
    assert code == 2 and "cannot reach Kubernetes" in err and len(err.splitlines()) == 1  # past the runner: no cluster here
    assert store.setting("runner") == "kubernetes:vpods"


def test_a_crash_point_that_does_not_exist_is_refused_before_anything_is_served(tmp_path, monkeypatch):
    """A misspelt point would let a crash test's orchestrator run on, never killed where asked."""
    monkeypatch.setenv("VIPU_VPOD_CRASH_AT", "create:handled")
    code, err = serve(tmp_path)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("vipu-vpod serve: VIPU_VPOD_CRASH_AT=create:handled names no crash point; the points are: create:reserved, ")
    assert not (tmp_path / "data" / "vpod.db").exists()


def test_a_taken_port_is_refused_in_one_line_before_anything_is_served(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = serve(tmp_path, "--listen-address", "127.0.0.1", "--port", str(port))
    assert (code, err) == (2, f"vipu-vpod serve: cannot listen on 127.0.0.1:{port}: the port is taken\n")
    assert not (tmp_path / "data" / "vpod.db").exists()
