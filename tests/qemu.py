"""Disk images booted as a cloud boots them: qemu with UEFI firmware (OVMF), a copy-on-write layer
over the image (which stays as built), and a NoCloud seed with what a Nova server finds in its
metadata: an instance id, a host name, the key pair's public key and the user data.

Networking is qemu's user mode: the guest is .15 of its own network (10.0.2.0/24 unless given
another), reaches this host's loopback at the network's .2, is reached through forwarded loopback
ports, and reaches other addresses it is given (another VM's, say) through this host. qemu
emulates the CPU (TCG): this machine's KVM does not run guests.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from tests.processes import dying_with_parent

FIRMWARE = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
FIRMWARE_VARIABLES = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")


class Vm:
    def __init__(self, directory: Path, image: Path, name: str, user_data: str, public_key: str = "",
                 network: str = "10.0.2.0/24", host_forwards: Sequence[tuple[int, int]] = (),
                 guest_forwards: Sequence[tuple[str, int, int]] = ()):
        """`host_forwards`: (this host's loopback port, the guest's port); `guest_forwards`: (an
        address the guest connects to, its port, this host's loopback port that answers)."""
        self.directory = directory
        self.name = name
        directory.mkdir(parents=True, exist_ok=True)
        self.console = directory / "console.log"
        self._disk = directory / "disk.qcow2"
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(image.resolve()), str(self._disk), "8G"],
                       check=True)
        self._seed = self._nocloud_seed(user_data, public_key)
        self._variables = directory / "efi-variables.fd"
        shutil.copyfile(FIRMWARE_VARIABLES, self._variables)
        forwards = [f"hostfwd=tcp:127.0.0.1:{host}-:{guest}" for host, guest in host_forwards]
        # a command per connection (a chardev would be one connection, made when qemu starts)
        forwards += [f"guestfwd=tcp:{address}:{port}-cmd:nc.openbsd 127.0.0.1 {local}" for address, port, local in guest_forwards]
        self._command = ["qemu-system-x86_64", "-accel", "tcg", "-smp", "2", "-m", "1024", "-nographic", "-no-reboot",
                         "-drive", f"if=pflash,format=raw,readonly=on,file={FIRMWARE}",
                         "-drive", f"if=pflash,format=raw,file={self._variables}",
                         "-drive", f"if=virtio,format=qcow2,file={self._disk}",
                         "-drive", f"if=virtio,format=raw,readonly=on,file={self._seed}",
                         "-nic", ",".join(["user", "model=virtio-net-pci", *_addresses(network), *forwards])]
        self._process: subprocess.Popen | None = None

    def _nocloud_seed(self, user_data: str, public_key: str) -> Path:
        """A FAT file system labelled CIDATA, as cloud-init's NoCloud source reads it."""
        files = self.directory / "seed"
        files.mkdir()
        meta = {"instance-id": f"{self.name}-1", "local-hostname": self.name, **({"public-keys": [public_key]} if public_key else {})}
        (files / "meta-data").write_text(yaml.safe_dump(meta))
        (files / "user-data").write_text(user_data)
        seed = self.directory / "seed.img"
        subprocess.run(["mkfs.vfat", "-C", "-n", "CIDATA", str(seed), "2048"], check=True, capture_output=True)
        subprocess.run(["mcopy", "-i", str(seed), str(files / "meta-data"), str(files / "user-data"), "::/"], check=True)
        return seed

    def start(self) -> Vm:
        with self.console.open("wb") as console:
            self._process = subprocess.Popen(dying_with_parent(self._command, "KILL"), stdin=subprocess.DEVNULL, stdout=console,
                                             stderr=subprocess.STDOUT)
        return self

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def printed(self) -> str:
        """What the VM wrote to its serial console, its terminal's control sequences left in."""
        return self.console.read_text(errors="replace")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=30)


def _addresses(network: str) -> list[str]:
    """qemu's user network on `network`: this host at .2, its DNS at .3, the guest at .15 (qemu
    keeps 10.0.2.x for these unless told, whatever the network)."""
    net = ipaddress.ip_network(network)
    return [f"net={net}", f"host={net[2]}", f"dns={net[3]}", f"dhcpstart={net[15]}"]


def ssh(key: Path, user: str, port: int, command: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """A command run in a VM over SSH, as its user would, through a forwarded port."""
    return subprocess.run(["ssh", "-q", "-i", str(key), "-p", str(port), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                           "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10", f"{user}@127.0.0.1", command],
                          capture_output=True, text=True, timeout=timeout)


def wait_for(vms: Sequence[Vm], condition, timeout: float, what: str):
    """Poll `condition` until it gives something true, while every VM runs, within a deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for vm in vms:
            if not vm.running():
                raise AssertionError(f"VM {vm.name} stopped; its console ended: {vm.printed()[-3000:]}")
        try:
            found = condition()
        except subprocess.TimeoutExpired:  # a call into a VM still booting may hang: not yet
            found = None
        if found:
            return found
        time.sleep(2)
    raise AssertionError(f"{what} within {timeout:.0f} s; consoles ended: "
                         + " | ".join(f"{vm.name}: {vm.printed()[-1500:]}" for vm in vms))
