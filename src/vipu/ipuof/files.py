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

import json
import os
import re
from pathlib import Path

from vipu.api.atomic import write_file
from vipu.api.protos import vipuuser_pb2 as pb

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


def write(directory: Path, partition_id: str, config: pb.PartitionConfig, owner: int | None = None) -> list[Path]:
    """Write every GCD's file, each atomically and readable by its owner only (it holds the
    partition's attach key); `owner` (a uid) gets them, when the caller is root writing for a job's
    user. The paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, gcd in enumerate(config.gcd_configs):
        path = directory / file_name(partition_id, index, len(config.gcd_configs))
        write_gcd(path, gcd, owner)
        paths.append(path)
    return paths


def gcd_files(directory: Path, partition_id: str) -> list[Path]:
    """The multi-GCD files of a partition in a directory (none if it is no directory), in GCD
    order: exactly the names `file_name` gives, so no file of another partition (such as
    `q_gcd0x`'s of `q`) is taken."""
    if not directory.is_dir():
        return []
    pattern = re.compile(rf"{re.escape(partition_id)}_gcd([0-9]+)_ipuof\.conf")
    numbered = [(int(match.group(1)), path) for path in directory.iterdir() if (match := pattern.fullmatch(path.name))]
    return [path for _, path in sorted(numbered)]


def remove(directory: Path, partition_id: str) -> list[Path]:
    """Delete a partition's files; return the paths deleted."""
    single = directory / file_name(partition_id, 0, 1)
    removed = [single] if single.exists() else []
    removed += gcd_files(directory, partition_id)
    for path in removed:
        path.unlink()
    return sorted(removed)
