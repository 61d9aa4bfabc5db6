"""vipu.conf: how the Slurm integration reaches the vipu controller (seed 004, section 5.2).

The file sits beside slurm.conf and holds `Key=Value` lines, keys in any case, `#` comments:

    ApiHost=vipu.example.com      # required
    ApiPort=8090
    IpuofDir=/shared/ipuof        # required: where jobs' IPUoF files go; every node must see it
    MaxIpusPerJob=256
    ApiTimeout=50                 # seconds
    QueueTimeout=300              # seconds a job's prolog waits in vipu's queue for its IPUs to form one
                                  # partition (free but scattered); 0: requeue the job at once
    IsSecure=yes                  # then ApiUser, ApiAccessKey, ClientCertFile, ClientKeyFile
    ApiUser=slurm                 # and ServerCertFile are required
    Accounts=same                 # a job's partition is made on the vipu account of its Slurm account:
                                  # same (the name as it is), or slurm-a=ml-a,... (and *=same); unset: none
    Topology=tree                 # vipu-slurm-service keeps Slurm's topology file beside slurm.conf in this
                                  # form (tree, block or yaml: vipu.model.slurm_topology); unset: none
    NodeMachines=n[1-4]:ag[1-4] n[5-8]:ag[5-8]   # the machines beside each Slurm node, as hostlists
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from vipu.client.settings import ClientSettings
from vipu.model.accounts import NO_ACCOUNTS, AccountMap
from vipu.model.errors import InvalidArgument
from vipu.model.slurm_topology import FORMATS, parse_node_machines

DEFAULT_SLURM_CONF = Path("/etc/slurm/slurm.conf")
SECURE_KEYS = ("ApiUser", "ApiAccessKey", "ClientCertFile", "ClientKeyFile", "ServerCertFile")
KNOWN_KEYS = ("ApiHost", "ApiPort", "IpuofDir", "MaxIpusPerJob", "ApiTimeout", "QueueTimeout", "IsSecure", "Accounts",
              "Topology", "NodeMachines", *SECURE_KEYS)
# The shell front doors give up on vipu-slurm-service after 600 s without a word: a prolog waits less.
MAX_QUEUE_TIMEOUT = 540
TRUE, FALSE = ("yes", "true", "1", "on"), ("no", "false", "0", "off")


@dataclass(frozen=True)
class VipuSlurmConfig:
    path: Path
    api_host: str
    ipuof_dir: Path
    api_port: int = 8090
    max_ipus_per_job: int = 256
    api_timeout: float = 50.0
    queue_timeout: int = 300
    is_secure: bool = False
    api_user: str = ""
    api_access_key: str = ""
    client_cert: Path | None = None
    client_key: Path | None = None
    server_cert: Path | None = None
    accounts: AccountMap = NO_ACCOUNTS  # a job's Slurm account -> the vipu account its partition is made on
    topology: str = ""  # the form of Slurm's topology file vipu-slurm-service keeps; "": none
    node_machines: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # Slurm node -> the machines beside it

    def client_settings(self) -> ClientSettings:
        return ClientSettings(self.api_host, self.api_port, self.api_user, self.api_access_key,
                              self.server_cert, self.client_cert, self.client_key)


def default_path() -> Path:
    """vipu.conf in the directory of the slurm.conf in use (Slurm passes SLURM_CONF to its scripts)."""
    return Path(os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF).parent / "vipu.conf"


def load(path: Path | None = None) -> VipuSlurmConfig:
    """Read and check vipu.conf; InvalidArgument names the file, the line and what is wrong."""
    path = path or default_path()
    try:
        text = path.read_text()
    except OSError as error:
        raise InvalidArgument(f"cannot read {path}: {error.strerror}") from None
    canonical = {key.lower(): key for key in KNOWN_KEYS}
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, equals, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not equals or not key:
            raise InvalidArgument(f"{path} line {number}: expected Key=Value, found {raw.strip()!r}")
        if key.lower() not in canonical:
            raise InvalidArgument(f"{path} line {number}: unknown key {key!r} (known: {', '.join(KNOWN_KEYS)})")
        values[canonical[key.lower()]] = value

    def positive(key: str, default: float, kind=int):
        if key not in values:
            return default
        try:
            parsed = kind(values[key])
        except ValueError:
            parsed = 0
        if parsed <= 0:
            raise InvalidArgument(f"{path}: {key} must be a positive number, not {values[key]!r}")
        return parsed

    for required in ("ApiHost", "IpuofDir"):
        if not values.get(required):
            raise InvalidArgument(f"{path}: {required} is required")
    secure_text = values.get("IsSecure", "no").lower()
    if secure_text not in TRUE + FALSE:
        raise InvalidArgument(f"{path}: IsSecure must be yes or no, not {values['IsSecure']!r}")
    secure = secure_text in TRUE
    if secure:
        missing = [key for key in SECURE_KEYS if not values.get(key)]
        if missing:
            raise InvalidArgument(f"{path}: IsSecure needs {', '.join(missing)}")
    queue_timeout = values.get("QueueTimeout", "300")
    if not queue_timeout.isdigit() or int(queue_timeout) > MAX_QUEUE_TIMEOUT:
        raise InvalidArgument(f"{path}: QueueTimeout must be a whole number of seconds from 0 to {MAX_QUEUE_TIMEOUT}, "
                              f"not {queue_timeout!r}")
    port = positive("ApiPort", 8090)
    if port > 65535:
        raise InvalidArgument(f"{path}: ApiPort must be from 1 to 65535, not {port}")

    topology = values.get("Topology", "")
    if topology and topology not in FORMATS:
        raise InvalidArgument(f"{path}: Topology must be one of {', '.join(FORMATS)}, not {topology!r}")
    if topology and not values.get("NodeMachines"):
        raise InvalidArgument(f"{path}: Topology needs NodeMachines, the machines beside each Slurm node")
    try:
        node_machines = parse_node_machines(values["NodeMachines"]) if values.get("NodeMachines") else {}
    except InvalidArgument as error:
        raise InvalidArgument(f"{path}: NodeMachines: {error.message}") from None

    def file(key: str) -> Path | None:
        return Path(values[key]) if secure else None

    return VipuSlurmConfig(
        path=path, api_host=values["ApiHost"], ipuof_dir=Path(values["IpuofDir"]), api_port=port,
        max_ipus_per_job=positive("MaxIpusPerJob", 256), api_timeout=positive("ApiTimeout", 50.0, float),
        queue_timeout=int(queue_timeout),
        is_secure=secure, api_user=values.get("ApiUser", "") if secure else "",
        api_access_key=values.get("ApiAccessKey", "") if secure else "",
        client_cert=file("ClientCertFile"), client_key=file("ClientKeyFile"), server_cert=file("ServerCertFile"),
        accounts=AccountMap.parse(values.get("Accounts", ""), f"{path}: Accounts"),
        topology=topology, node_machines=node_machines,
    )
