"""IPUoF configuration files: one JSON file per GCD, where the IPUoF client looks for them.

`vipu create partition` writes them, `vipu remove partition` deletes them, and the Slurm and
Kubernetes integrations write the same files for their jobs. A single-GCD partition p1 gets
`p1_ipuof.conf`; GCD n of a multi-GCD partition gets `p1_gcd<n>_ipuof.conf`. No two partitions'
files can share a name, because a partition id may not end in `_gcd` and a number
(`vipu.model.entities.check_partition_id`): `q_gcd0_ipuof.conf` can only be GCD 0 of `q`.

Each file holds the GCD's `attributes` (partition id, GCD id, routing and sync types, fabric
reconfigurable, ...) and its `devices` in routing order, each with the IPUoF end-point (ip,
server and RDMA ports) and the IPU's identity (device id, IPU-Link segment, routing id, IPU id,
chip id, software versions).
"""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

from vipu.api.atomic import write_file
from vipu.api.protos import vipuuser_pb2 as pb
from vipu.model.ipuof_attributes import ATTACH_KEY_ATTRIBUTE

USER_DIR = Path("~/.ipuof.conf.d")
SYSTEM_DIR = Path("/etc/ipuof.conf.d")


def default_dir() -> Path:
    """`~/.ipuof.conf.d`, or `/etc/ipuof.conf.d` for root, as the IPUoF client expects."""
    return SYSTEM_DIR if os.geteuid() == 0 else USER_DIR.expanduser()


def file_name(partition_id: str, gcd: int, num_gcds: int) -> str:
    return f"{partition_id}_ipuof.conf" if num_gcds == 1 else f"{partition_id}_gcd{gcd}_ipuof.conf"


def document(gcd: pb.PartitionConfig.Gcd) -> dict:
    fields = pb.IpuofDevice.DESCRIPTOR.fields  # in field-number order
    devices = [{field.name: getattr(device, field.name) for field in fields} for device in gcd.devices]
    return {"attributes": dict(sorted(gcd.attributes.items())), "devices": devices}


def write_gcd(path: Path, gcd: pb.PartitionConfig.Gcd, owner: int | None = None) -> None:
    """One GCD's file, written atomically and readable by its owner only (it holds the attach key)."""
    write_file(path, (json.dumps(document(gcd), indent=2) + "\n").encode(), 0o600, owner)


def shared(directory: Path) -> bool:
    """Whether the directory is the system's (root's default), where every controller of the host
    writes its partitions' files, so that a partition id of one may be taken by another's."""
    return directory.expanduser().resolve() == SYSTEM_DIR.resolve()


def attach_key_of(path: Path) -> str | None:
    """The attach key a file holds; None if it cannot be read as an IPUoF file."""
    try:
        return str(json.loads(path.read_text())["attributes"][ATTACH_KEY_ATTRIBUTE])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write(directory: Path, partition_id: str, config: pb.PartitionConfig, owner: int | None = None) -> list[Path]:
    """Write every GCD's file, each atomically and readable by its owner only (it holds the
    partition's attach key); `owner` (a uid) gets them, when the caller is root writing for a job's
    user. The paths written. In the shared system directory, a file of the same name holding
    another partition's key (another controller's partition of that id, or one removed without
    its files) is not replaced: an OSError says so and nothing is written."""
    directory.mkdir(parents=True, exist_ok=True)
    targets = [(directory / file_name(partition_id, index, len(config.gcd_configs)), gcd) for index, gcd in enumerate(config.gcd_configs)]
    if shared(directory):
        for path, gcd in targets:
            held = attach_key_of(path) if path.exists() else None
            if held is not None and held != gcd.attributes.get(ATTACH_KEY_ATTRIBUTE):
                raise FileExistsError(errno.EEXIST, f"{path.name} there holds another partition {partition_id}, another controller's "
                                                    "or one removed without its files; remove that file, or give --ipuof-dir")
    for path, gcd in targets:
        write_gcd(path, gcd, owner)
    return [path for path, _ in targets]


def gcd_files(directory: Path, partition_id: str) -> list[Path]:
    """The multi-GCD files of a partition in a directory (none if it is no directory), in GCD
    order: exactly the names `file_name` gives, so no file of another partition (such as
    `q_gcd0x`'s of `q`) is taken."""
    if not directory.is_dir():
        return []
    pattern = re.compile(rf"{re.escape(partition_id)}_gcd([0-9]+)_ipuof\.conf")
    numbered = [(int(match.group(1)), path) for path in directory.iterdir() if (match := pattern.fullmatch(path.name))]
    return [path for _, path in sorted(numbered)]


def present(directory: Path, partition_id: str) -> list[Path]:
    """A partition's files in a directory."""
    single = directory / file_name(partition_id, 0, 1)
    return sorted(([single] if single.exists() else []) + gcd_files(directory, partition_id))


def remove(directory: Path, partition_id: str, attach_key: str | None = None) -> list[Path]:
    """Delete a partition's files; with `attach_key`, only those holding that key (the shared
    system directory may hold another controller's partition of the same id). The paths deleted."""
    removed = [path for path in present(directory, partition_id) if attach_key is None or attach_key_of(path) == attach_key]
    for path in removed:
        path.unlink()
    return removed
