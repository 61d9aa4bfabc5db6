"""The disk images of scripts/vm-images booted as Nova boots them (UEFI firmware, cloud-init, the
user data and key pair in the instance's metadata; tests/qemu.py): the controller image runs the
controller that vipu-vpod's OpenStack provider describes in its user data, its secrets fetched once
from a hand-over end-point on the host with the user data's token, on a tenant's PostgreSQL
database, and lets its user in with the key in its metadata (a Nova key pair's); a Poplar VM given
`vipu-vpod vm create`'s user data lets its user in by SSH with the public key in it, and reaches
that controller by its address, its certificate verified, with vipu.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, cast

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from tests.functional.harness import BIN
from tests.ports import free_port
from tests.qemu import Vm, ssh, wait_for
from vipu.api.listening import listening_socket
from vipu.api.tls import TlsFiles, generate
from vipu.client.settings import ClientSettings, client_config_text, parse_hcl
from vipu.vpod.handover import HandoverServer, server_tls
from vipu.vpod.openstack import ADDRESS_FILE, HANDOVER_FILE, OpenStackControllers, vm_user_data
from vipu.vpod.store import Vpod
from vipu.vpod.tenants import ADMIN_USER, STORE_FILE, TenantControllers, VmConfig

pytestmark = [pytest.mark.functional,
              pytest.mark.skipif(os.geteuid() != 0, reason="scripts/vm-images builds the images' root as root")]
REPO = Path(__file__).resolve().parents[2]
CONTROLLER_ADDRESS = "10.0.2.15"  # qemu's guest address on its default network: the controller VM's, as its Neutron port's would be
HOST_ADDRESS = "10.0.2.2"  # this host's loopback, as the guest reaches it on that network
BOOT_SECONDS = 600.0  # emulated, two VMs at once, beside the other tests


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("vm-images")
    built = subprocess.run([str(REPO / "scripts/vm-images"), "--output", str(output)], capture_output=True, text=True, timeout=1200)
    assert built.returncode == 0, built.stderr[-3000:]
    for name in ("vipu-controller", "vipu-poplar"):
        described = subprocess.run(["qemu-img", "info", str(output / f"{name}.qcow2")], capture_output=True, text=True, check=True)
        assert "file format: qcow2" in described.stdout
    return output


def ssh_key(directory: Path) -> tuple[Path, str]:
    """A key pair as Nova's would be: the private key's file and the public key's line."""
    key = Ed25519PrivateKey.generate()
    path = directory / "id_ed25519"
    path.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption()))
    path.chmod(0o600)
    return path, key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()


@pytest.mark.timeout(BOOT_SECONDS + 300)  # its images built (setup), then two emulated boots of up to BOOT_SECONDS
def test_the_images_boot_a_vpods_controller_and_a_poplar_vm_that_reaches_it(images, postgres_of_its_own, tmp_path):
    # The controller's vPOD prepared as the OpenStack provider prepares it, its port's address
    # qemu's guest address; the VM reaches the tenant's database on this host's PostgreSQL.
    site = TlsFiles(tmp_path / "site-certs")
    generate(site, ["localhost"])
    never_called = cast(Any, object())  # only the preparation and the user data are used: no OpenStack call
    handover_port = free_port()
    controllers = OpenStackControllers(tmp_path / "vpod", site, "vm-images", cloud="", image="", flavor="", subnet_pool="",
                                       store_server=postgres_of_its_own.url("postgres"),
                                       handover_url=f"https://{HOST_ADDRESS}:{handover_port}", connection=never_called)
    handover = HandoverServer(listening_socket("127.0.0.1", handover_port), server_tls(site, HOST_ADDRESS, tmp_path / "handover"),
                              controllers.token_path, controllers.secrets)
    vpod = Vpod(id="imaged", tenant="t1", state="Creating", step="", machines=[], topology="mesh", ilds=1, user_id="alice",
                ports=[free_port(), free_port(), free_port()])
    directory = controllers.directory(vpod.id)
    directory.mkdir(parents=True)
    (directory / ADDRESS_FILE).write_text(CONTROLLER_ADDRESS)
    TenantControllers.prepare(controllers, vpod)
    store = directory / STORE_FILE
    store.write_text(store.read_text().replace("@127.0.0.1:", f"@{HOST_ADDRESS}:"))
    user_port, admin_port, _ = vpod.ports

    # The Poplar VM's configuration as `vipu-vpod vm create` gives it: the controller by its
    # address, the certificates beside the file.
    admin = parse_hcl(controllers.admin_config(vpod.id).read_text(), "admin")
    tls = controllers.tls(vpod.id)
    files = {"certs/ca.pem": tls.ca_for(tls.client_dir).read_bytes(), "certs/client.pem": tls.client_cert.read_bytes(),
             "certs/client-key.pem": tls.client_key.read_bytes()}
    config = client_config_text(ClientSettings(CONTROLLER_ADDRESS, user_port, ADMIN_USER, str(admin["api-access-key"]),
                                               Path("certs/ca.pem"), Path("certs/client.pem"), Path("certs/client-key.pem")),
                                admin_port=admin_port)
    key, public_key = ssh_key(tmp_path)
    ssh_port, controller_ssh_port = free_port(), free_port()

    controller = Vm(tmp_path / "controller-vm", images / "vipu-controller.qcow2", "vpod-imaged", controllers.user_data(vpod),
                    public_key=public_key, host_forwards=[(user_port, user_port), (admin_port, admin_port), (controller_ssh_port, 22)])
    poplar = Vm(tmp_path / "poplar-vm", images / "vipu-poplar.qcow2", "vpod-imaged-vm-p1",
                vm_user_data(vpod.id, "p1", VmConfig(config, files), public_key=public_key), network="10.0.0.0/16",
                host_forwards=[(ssh_port, 22)], guest_forwards=[(CONTROLLER_ADDRESS, user_port, user_port),
                                                                (CONTROLLER_ADDRESS, admin_port, admin_port)])
    handover.start()
    vms = []
    try:
        vms += [controller.start()]
        vms += [poplar.start()]
        def answers() -> subprocess.CompletedProcess | None:
            done = subprocess.run([str(BIN / "vipu-admin"), "-H", "127.0.0.1", "--config", str(controllers.admin_config(vpod.id)),
                                   "list", "agents"], capture_output=True, text=True, timeout=60)
            return done if done.returncode == 0 else None

        wait_for(vms, answers, BOOT_SECONDS, "the controller VM's vipu-server did not answer its administrator")
        assert not (directory / HANDOVER_FILE).exists()  # its token spent by its first boot
        unit = ssh(key, "debian", controller_ssh_port, "systemctl is-enabled vipu-controller && pgrep -u vipu -f vipu-server", timeout=120)
        assert unit.returncode == 0 and unit.stdout.startswith("enabled"), unit.stdout + unit.stderr  # the image's unit runs it, as vipu

        def user_in() -> subprocess.CompletedProcess | None:
            done = ssh(key, "debian", ssh_port, "test -f /etc/vipu/vipu-cli.hcl && vipu --version")
            return done if done.returncode == 0 else None

        assert "vipu, version" in wait_for(vms, user_in, BOOT_SECONDS, "the Poplar VM did not let its user in with the key").stdout
        seen = ssh(key, "debian", ssh_port, "vipu-admin list agents && vipu list partitions")
        assert seen.returncode == 0, seen.stdout + seen.stderr
        refused = ssh(key, "root", controller_ssh_port, "true")
        assert refused.returncode != 0  # the metadata's key opens the image's user only, not root
    finally:
        for vm in vms:
            vm.stop()
        handover.stop()

