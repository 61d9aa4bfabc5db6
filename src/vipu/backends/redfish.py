"""An IPU-Machine's BMC over Redfish: its power, inventory (with the cluster ports' OSFP cables) and health.

The IPU-M2000's BMC runs OpenBMC, whose bmcweb speaks DMTF Redfish. This driver talks to it with
OpenStack's `sushy` rather than DMTF's `redfish` library: sushy gives typed resources (a system's
PowerState as an enum, a chassis' Thermal fans with their Status) where `redfish` hands back raw
JSON to pick apart; its reset action checks the ResetType against the values the BMC allows,
which is how this driver chooses ForceRestart, GracefulRestart or PowerCycle; it falls back from
Redfish sessions to HTTP Basic as OpenBMC and emulators need; and Ironic drives fleets of BMCs
with it, so its quirks are known and fixed upstream. What sushy has no class for (the Cables
collection) is read raw through the same connector, so one session and one TLS setting serve all.

Configuration (`bmc_config`), one mapping per machine, e.g. from the agent's YAML:

    url: https://10.1.2.3            # the BMC; http:// only with verify: false (see below)
    credentials: /etc/vipu/bmc-m1    # its first line is username:password; mode 0600 (or 0400)
    ca: /etc/vipu/bmc-ca.pem         # the authority the BMC's certificate is checked against
    verify: true                     # false: connect without checking it (logged loudly)
    system: <Id or @odata.id>        # optional: the only system when absent
    chassis: <Id or @odata.id>       # optional: the system's chassis when absent
    poll_seconds: 5                  # how often the health poller reads the BMC
    timeout_seconds: 5               # how long one request may wait for an answer (connect: at most 3)

The credentials file must be readable by its owner only: one that group or others may read is
refused, as ssh refuses such a key. Plain http is refused unless `verify: false` says, in the
configuration, that its author accepts a BMC whose identity nobody checks; the driver then logs,
once, that it is neither encrypted nor verified. Without `ca`, the system's authorities are used.

Every failure of the BMC reaches the caller as one `Unavailable` line that says which it was:
credentials refused, connection refused, no answer within the timeout, certificate not verified
against the CA, or the HTTP status of a request the BMC refused; never a traceback. sushy's
connector retries a request that fails to connect (its `server_side_retries`, 3 times when 0 is
given, 2 s apart) and a GET answered with a 5xx: it is built here to try a connection once and
such a GET once more at once, so a dead BMC costs one timeout. Refused credentials are read again
from the file on the next call, so that fixing the file needs no restart.

Events come from polling (`start()`, every `poll_seconds`, until `close()`): a component's health
changing, the system's power state changing, the BMC ceasing to answer and answering again.
Redfish's EventService would push them, but only to an HTTP listener the agent does not have
(nor does sushy-emulator deliver any); polling needs nothing but the BMC.
"""

from __future__ import annotations

import logging
import math
import re
import socket
import ssl
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import requests  # type: ignore[import-untyped]
import sushy  # type: ignore[import-untyped]
import urllib3.exceptions
from sushy import auth as sushy_auth
from sushy import connector as sushy_connector
from sushy import exceptions as sushy_errors
from sushy.resources import constants as sushy_constants  # type: ignore[import-untyped]

from vipu.backends.capabilities import (
    Cable,
    Component,
    ComponentHealth,
    HardwareInventory,
    Health,
    HealthEvent,
    HealthLevel,
    Inventory,
    MachineHealth,
    MachineLog,
    Power,
    PowerAction,
    PowerState,
    Telemetry,
    checked_power_request,
)
from vipu.model.errors import InvalidArgument, Unavailable, VipuError, one_line
from vipu.model.telemetry import IpuReading, SensorReading, TelemetryReading
from vipu.model.times import stamp_seconds

log = logging.getLogger("vipu.backends.redfish")
# sushy logs each failed request itself, every time, with its traceback's words: the driver says
# why in one line (`Unavailable`), which the agent logs once per reason; sushy's own is kept for
# the worst only.
logging.getLogger("sushy").setLevel(logging.CRITICAL)

CONNECT_SECONDS = 3.0       # the most a connection may take, however long `timeout_seconds` lets an answer take
RESTART_SEEN_SECONDS = 10.0  # how long a restart or cycle is watched for the machine to leave On before it is taken as done
POWER_POLL_SECONDS = 0.2    # how often power() reads the state it waits for
EVENTS_KEPT = 256
# A temperature or power sensor named for one IPU ("IPU2 Temp", "IPU 2 Power"): its reading is that IPU's.
_IPU_SENSOR = re.compile(r"\bIPU\s*([0-3])\b", re.IGNORECASE)
KEYS = ("url", "credentials", "ca", "verify", "system", "chassis", "poll_seconds", "timeout_seconds")
_SEVERITY = {HealthLevel.OK: 0, HealthLevel.UNKNOWN: 1, HealthLevel.WARNING: 2, HealthLevel.CRITICAL: 3}
# Parts a BMC may lack: skipped, never an error. Not finding the system itself is one (`_discover`).
_ABSENT_STATUSES = (404, 405, 501)
# What reading an answer that is no JSON, or lacks what Redfish says it holds, raises.
_MALFORMED = (ValueError, KeyError, TypeError, AttributeError)

T = TypeVar("T")


@dataclass(frozen=True)
class BmcConfig:
    url: str                       # scheme and authority only, e.g. https://10.1.2.3:443
    credentials: Path
    ca: Path | None = None
    verify: bool = True
    system: str | None = None
    chassis: str | None = None
    poll_seconds: float = 5.0
    timeout_seconds: float = 5.0


def bmc_config(mapping: object, where: str) -> BmcConfig:
    """The BMC configuration in `mapping`; InvalidArgument, one line starting with `where`, for a bad value."""
    if not isinstance(mapping, dict):
        raise InvalidArgument(f"{where}: expected a mapping with url and credentials, not {type(mapping).__name__}")
    unknown = sorted(str(key) for key in mapping if key not in KEYS)
    if unknown:
        raise InvalidArgument(f"{where}: unknown key {one_line(unknown[0])!r}; known: {', '.join(KEYS)}")

    url = mapping.get("url")
    if not isinstance(url, str) or not url:
        raise InvalidArgument(f"{where}: url is required, e.g. https://10.1.2.3")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError for a port that is no number)
    except ValueError as error:
        raise InvalidArgument(f"{where}: url {one_line(url)!r} is no URL: {error}") from None
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise InvalidArgument(f"{where}: url {one_line(url)!r} must be https://HOST[:PORT]")
    if parts.username is not None or parts.password is not None:
        raise InvalidArgument(f"{where}: url {one_line(url)!r} holds credentials: put them in the credentials file")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise InvalidArgument(f"{where}: url {one_line(url)!r} must name the BMC only (https://HOST[:PORT]), not a path")

    verify = mapping.get("verify", True)
    if not isinstance(verify, bool):
        raise InvalidArgument(f"{where}: verify must be true or false, not {one_line(repr(verify))}")
    if parts.scheme == "http" and verify:
        raise InvalidArgument(f"{where}: url {url} is plain http, neither encrypted nor verified: use https, "
                              "or say verify: false to accept that")

    ca = mapping.get("ca")
    ca_path = None
    if ca is not None:
        if not isinstance(ca, str) or not ca:
            raise InvalidArgument(f"{where}: ca must be the path of a PEM file, not {one_line(repr(ca))}")
        if not verify:
            raise InvalidArgument(f"{where}: ca is given but verify is false: drop one of them")
        ca_path = Path(ca).expanduser()
        try:
            ssl.create_default_context(cafile=str(ca_path))
        except FileNotFoundError:
            raise InvalidArgument(f"{where}: ca file {ca_path} does not exist") from None
        except (OSError, ssl.SSLError, ValueError) as error:
            raise InvalidArgument(f"{where}: ca file {ca_path} holds no usable certificate: {one_line(str(error))}") from None

    credentials = mapping.get("credentials")
    if not isinstance(credentials, str) or not credentials:
        raise InvalidArgument(f"{where}: credentials is required: the path of a file whose first line is username:password")
    credentials_path = Path(credentials).expanduser()
    read_credentials(credentials_path, where)

    names: dict[str, str | None] = {}
    for key in ("system", "chassis"):
        value = mapping.get(key)
        if value is not None and (not isinstance(value, str) or not value or not value.isprintable() or value != value.strip()):
            raise InvalidArgument(f"{where}: {key} must be an Id or an @odata.id, not {one_line(repr(value))}")
        names[key] = value

    numbers: dict[str, float] = {}
    for key, default, most in (("poll_seconds", 5.0, 3600.0), ("timeout_seconds", 5.0, 300.0)):
        value = mapping.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or not 0 < value <= most:
            raise InvalidArgument(f"{where}: {key} must be a number of seconds above 0 and at most {most:g}, not {one_line(repr(value))}")
        numbers[key] = float(value)

    return BmcConfig(url=f"{parts.scheme}://{parts.netloc}", credentials=credentials_path, ca=ca_path, verify=verify,
                     system=names["system"], chassis=names["chassis"], **numbers)


def read_credentials(path: Path, where: str = "BMC") -> tuple[str, str]:
    """(username, password) from the file's first line, `username:password`; refused when group or others have access."""
    try:
        status = path.stat()
    except FileNotFoundError:
        raise InvalidArgument(f"{where}: credentials file {path} does not exist") from None
    except OSError as error:
        raise InvalidArgument(f"{where}: credentials file {path} cannot be read: {error.strerror}") from None
    mode = stat.S_IMODE(status.st_mode)
    if not stat.S_ISREG(status.st_mode):
        raise InvalidArgument(f"{where}: credentials file {path} is not a regular file")
    if mode & 0o077:
        raise InvalidArgument(f"{where}: credentials file {path} has mode {mode:04o}: group or others may read it; "
                              f"make it readable by its owner only (chmod 600)")
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise InvalidArgument(f"{where}: credentials file {path} cannot be read: {one_line(str(error))}") from None
    username, colon, password = (lines[0] if lines else "").partition(":")
    if not colon or not username or not password:
        raise InvalidArgument(f"{where}: credentials file {path}: its first line must be username:password")
    return username, password


@dataclass
class _Paths:
    """Where the machine's resources are, found once per driver."""

    system: str
    chassis: str | None
    managers: list[str] = field(default_factory=list)


def _odata_id(link: object) -> str | None:
    value = link.get("@odata.id") if isinstance(link, dict) else None
    return value if isinstance(value, str) and value else None


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _created(value: object) -> float:
    """A log entry's Created time, in seconds since the epoch; now if it has none that reads."""
    at = stamp_seconds(str(value))
    return at if at is not None else time.time()


def _links(document: dict, name: str) -> list[str]:
    links = (document.get("Links") or {}).get(name) or []
    return [path for path in map(_odata_id, links if isinstance(links, list) else [links]) if path]


def _level(value: object) -> HealthLevel:
    """A Redfish Health (a sushy enum or a string) as a HealthLevel; Unknown when missing or unheard of."""
    try:
        return HealthLevel(getattr(value, "value", value))
    except ValueError:
        return HealthLevel.UNKNOWN


def _state(value: object) -> str:
    value = getattr(value, "value", value)
    return value if isinstance(value, str) and value else "Enabled"


def worst(levels: list[HealthLevel]) -> HealthLevel:
    """The worst level: Critical over Warning over Unknown (a part not read) over OK; OK for none."""
    return max(levels, key=_SEVERITY.__getitem__, default=HealthLevel.OK)


def _optional(read: Callable[[], T]) -> T | None:
    """What `read` returns, or None for a part this BMC does not have."""
    try:
        return read()
    except (sushy_errors.MissingAttributeError, sushy_errors.MissingActionError, sushy_errors.MalformedAttributeError):
        return None
    except sushy_errors.HTTPError as error:
        if error.status_code in _ABSENT_STATUSES:
            return None
        raise


def _member(root: Any, collection: str, name: str) -> str:
    """The @odata.id of a member named by the configuration: as given when it is a path, else under the collection."""
    return name if name.startswith("/") else f"{_odata_id(root.json.get(collection)) or '/redfish/v1/' + collection}/{name}"


def _causes(error: BaseException) -> Iterator[BaseException]:
    """The error and everything it wraps: causes, contexts, urllib3's reasons and exceptions passed as arguments."""
    seen: set[int] = set()
    pending = [error]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for inner in (current.__cause__, current.__context__, getattr(current, "reason", None), *current.args):
            if isinstance(inner, BaseException):
                pending.append(inner)


class RedfishMachine(Power, Inventory, Health, Telemetry, MachineLog):
    """One machine's BMC. Calls may come from any thread; one request at a time reaches the BMC."""

    def __init__(self, config: BmcConfig):
        self.config = config
        self.url = config.url
        self._read_seconds = config.timeout_seconds
        self._connect_seconds = min(CONNECT_SECONDS, config.timeout_seconds)
        self._lock = threading.RLock()
        self._root: Any = None
        self._auth: Any = None
        self._connector: Any = None
        self._paths: _Paths | None = None
        self._events: deque[HealthEvent] = deque(maxlen=EVENTS_KEPT)
        self._sequence = 0
        self._stopping = threading.Event()
        self._poller: threading.Thread | None = None
        self._log_seen: dict[str, None] = {}  # the log entries listed at the last read (@odata.id or service/Id), all given
        self._logs_read = -math.inf  # monotonic, when the log services were last read
        self._telemetry: tuple[TelemetryReading, float] | None = None  # the last reading, and when (monotonic)
        if self.url.startswith("http://"):
            log.warning("BMC %s is plain http: NOT encrypted and its identity NOT verified (verify: false); "
                        "its credentials cross the network in the clear", self.url)
        elif not config.verify:
            log.warning("TLS certificate of BMC %s NOT verified (verify: false): whoever answers at that address "
                        "gets its credentials and is believed", self.url)

    # -- connection and errors

    def _connect(self) -> Any:
        """The service root, authenticated; made on first use and kept (sushy re-opens connections and sessions)."""
        if self._root is not None:
            return self._root
        try:
            username, password = read_credentials(self.config.credentials)
        except InvalidArgument as error:  # it was fine when the configuration was read: now the BMC cannot be reached
            raise Unavailable(error.message) from None
        verify: bool | str = str(self.config.ca) if self.config.ca is not None else self.config.verify
        if self._connector is None:
            # One attempt per request: with server_side_retries=0 sushy would try a connection 3 times, 2 s apart.
            self._connector = sushy_connector.Connector(self.url, verify=verify, server_side_retries=1, server_side_retries_delay=0,
                                                        default_request_timeout=self._read_seconds,
                                                        connect_timeout=self._connect_seconds)
        self._auth = sushy_auth.SessionOrBasicAuth(username=username, password=password)
        self._root = sushy.Sushy(self.url, auth=self._auth, connector=self._connector)
        return self._root

    def _failure(self, error: BaseException, what: str) -> Unavailable:
        """The one line that says why the BMC did not do `what`."""
        if isinstance(error, sushy_errors.AccessError):
            return Unavailable(f"BMC {self.url}: credentials refused (HTTP {error.status_code})")
        if isinstance(error, sushy_errors.HTTPError):
            detail = one_line(error.detail or "")[:200]
            return Unavailable(f"BMC {self.url}: {what} refused (HTTP {error.status_code}){': ' + detail if detail else ''}")
        causes = list(_causes(error))
        for cause in causes:
            if isinstance(cause, ssl.SSLCertVerificationError):
                against = f"CA file {self.config.ca}" if self.config.ca is not None else "the system's authorities"
                reason = one_line(cause.verify_message or cause.reason or str(cause))
                return Unavailable(f"BMC {self.url}: certificate not verified against {against}: {reason}")
        # In this order: urllib3's NewConnectionError (a refused connection) is a ConnectTimeoutError too.
        kinds: tuple[tuple[Any, str], ...] = (
            (ConnectionRefusedError, "connection refused"),
            ((urllib3.exceptions.NameResolutionError, socket.gaierror), "unknown host"),
            (requests.exceptions.ConnectTimeout, f"no connection within {self._connect_seconds:g} s"),
            ((requests.exceptions.ReadTimeout, urllib3.exceptions.ReadTimeoutError, TimeoutError),
             f"no answer within {self._read_seconds:g} s"),
        )
        for kind, reason in kinds:
            if any(isinstance(cause, kind) for cause in causes):
                return Unavailable(f"BMC {self.url}: {reason}")
        for cause in causes:
            if isinstance(cause, ssl.SSLError):
                return Unavailable(f"BMC {self.url}: TLS failed: {one_line(cause.reason or str(cause))}")
        for cause in causes:
            if isinstance(cause, OSError) and cause.strerror:
                return Unavailable(f"BMC {self.url}: unreachable: {one_line(cause.strerror)}")
        if isinstance(error, sushy_errors.ConnectionError | requests.exceptions.RequestException):
            return Unavailable(f"BMC {self.url}: unreachable ({type(causes[-1]).__name__})")
        text = one_line(str(error))[:200]
        return Unavailable(f"BMC {self.url}: {what} failed: {text or type(error).__name__}")

    @contextmanager
    def _bmc(self, what: str) -> Iterator[Any]:
        """The service root, with the lock held; any failure of the BMC becomes one Unavailable line."""
        with self._lock:
            try:
                yield self._connect()
            except VipuError:
                raise
            except (sushy_errors.SushyError, requests.exceptions.RequestException, *_MALFORMED) as error:
                if isinstance(error, sushy_errors.AccessError):
                    self._root = None  # connect again, with the credentials the file holds then
                raise self._failure(error, what) from None

    def _get(self, path: str) -> dict:
        """A resource sushy has no class for, read raw through the same connector (and session)."""
        document = self._connector.get(path).json()
        if not isinstance(document, dict):
            raise ValueError(f"{path} is no JSON object")
        return document

    def _discover(self, root: Any) -> _Paths:
        """The system, its chassis and its managers, found once: from the configuration, the system's links or
        the only one listed."""
        if self._paths is not None:
            return self._paths
        system = self.config.system
        if system is None:
            members = root.get_system_collection().members_identities
            if len(members) != 1:
                raise Unavailable(f"BMC {self.url}: it has {len(members)} systems ({', '.join(members) or 'none'}): "
                                  "name one with system:")
            system_path = members[0]
        else:
            system_path = _member(root, "Systems", system)
        try:
            system_document = root.get_system(system_path).json or {}
        except sushy_errors.ResourceNotFoundError:
            raise Unavailable(f"BMC {self.url}: it has no system {system_path} (HTTP 404)") from None
        chassis = self.config.chassis
        if chassis is not None:
            chassis_path: str | None = _member(root, "Chassis", chassis)
        else:
            chassis_path = next(iter(_links(system_document, "Chassis")), None)
            if chassis_path is None:
                listed = list(_optional(lambda: root.get_chassis_collection().members_identities) or ())
                chassis_path = listed[0] if len(listed) == 1 else None
        managers = _links(system_document, "ManagedBy")
        if not managers:
            managers = list(_optional(lambda: root.get_manager_collection().members_identities) or ())
        self._paths = _Paths(system_path, chassis_path, managers)
        return self._paths

    # -- Power

    def power_state(self) -> PowerState:
        with self._bmc("reading the power state") as root:
            return self._power_state(root)

    def _power_state(self, root: Any) -> PowerState:
        value = root.get_system(self._discover(root).system).power_state
        try:
            return PowerState(getattr(value, "value", value))
        except ValueError:
            return PowerState.UNKNOWN

    def power(self, action: PowerAction, timeout: float) -> PowerState:
        action = checked_power_request(action, timeout)
        deadline = time.monotonic() + timeout
        with self._bmc(f"power {action.value}") as root:
            state = self._power_state(root)
            allowed = {value.value for value in root.get_system(self._discover(root).system).get_allowed_reset_system_values()}
        if action is PowerAction.OFF:
            if state is not PowerState.OFF:
                self._reset(action, allowed, "ForceOff", "GracefulShutdown")
            return self._wait(PowerState.OFF, action, deadline, timeout)
        if action is PowerAction.ON or state is PowerState.OFF:  # a reset or cycle of a machine that is off turns it on
            if state is not PowerState.ON:
                self._reset(action, allowed, "On", "ForceOn")
            return self._wait(PowerState.ON, action, deadline, timeout)
        restarts = ("ForceRestart", "GracefulRestart", "PowerCycle") if action is PowerAction.RESET else ("PowerCycle",)
        if any(restart in allowed for restart in restarts):
            self._reset(action, allowed, *restarts)
            self._leaving_on(action, min(deadline, time.monotonic() + RESTART_SEEN_SECONDS))
            return self._wait(PowerState.ON, action, deadline, timeout)
        self._reset(action, allowed, "ForceOff", "GracefulShutdown")  # no cycle of its own: off, then on
        self._wait(PowerState.OFF, action, deadline, timeout)
        self._reset(action, allowed, "On", "ForceOn")
        return self._wait(PowerState.ON, action, deadline, timeout)

    def _reset(self, action: PowerAction, allowed: set[str], *choices: str) -> None:
        """ComputerSystem.Reset with the first of `choices` the system allows."""
        reset = next((choice for choice in choices if choice in allowed), None)
        if reset is None:
            raise Unavailable(f"BMC {self.url}: power {action.value} needs ResetType {' or '.join(choices)}, and the system "
                              f"allows only {', '.join(sorted(allowed)) or 'none'}")
        with self._bmc(f"power {action.value} ({reset})") as root:
            root.get_system(self._discover(root).system).reset_system(sushy_constants.ResetType(reset))
        log.info("BMC %s: power %s: asked for %s", self.url, action.value, reset)

    def _leaving_on(self, action: PowerAction, until: float) -> None:
        """After a restart or cycle is asked for, the BMC may go on answering On for a moment: wait
        until it says otherwise, so that On afterwards means the machine came back, not that it has
        not gone yet; a restart too quick to be seen is let be at `until`."""
        while self.power_state() is PowerState.ON:
            if time.monotonic() + POWER_POLL_SECONDS > until:
                log.info("BMC %s: power %s: it was not seen to leave On (a restart quicker than %g s)", self.url, action.value,
                         POWER_POLL_SECONDS)
                return
            time.sleep(POWER_POLL_SECONDS)

    def _wait(self, target: PowerState, action: PowerAction, deadline: float, timeout: float) -> PowerState:
        while True:
            state = self.power_state()
            if state is target:
                return state
            if time.monotonic() + POWER_POLL_SECONDS > deadline:
                raise Unavailable(f"BMC {self.url}: power {action.value} did not reach {target.value} within {timeout:g} s: "
                                  f"the machine is {state.value}")
            time.sleep(POWER_POLL_SECONDS)

    # -- Inventory

    def hardware(self) -> HardwareInventory:
        with self._bmc("reading the inventory") as root:
            paths = self._discover(root)
            system = root.get_system(paths.system)
            components = [Component("system", "system", name=system.name or "", serial=system.serial_number or "",
                                    model=system.model or "", manufacturer=system.manufacturer or "", firmware=system.bios_version or "")]
            firmware: dict[str, str] = {"bios": system.bios_version} if system.bios_version else {}
            chassis = _optional(lambda: root.get_chassis(paths.chassis)) if paths.chassis else None
            if chassis is not None:
                components.append(Component("chassis", "chassis", name=chassis.name or "", serial=chassis.serial_number or "",
                                            model=chassis.model or "", manufacturer=chassis.manufacturer or ""))
            for index, path in enumerate(paths.managers):
                manager = _optional(partial(root.get_manager, path))
                if manager is None:
                    continue
                identity = "bmc" if index == 0 else f"bmc:{manager.identity}"
                components.append(Component(identity, "manager", name=manager.name or "", model=manager.model or "",
                                            firmware=manager.firmware_version or ""))
                if manager.firmware_version:
                    firmware[identity] = manager.firmware_version
            for item in _optional(lambda: root.get_update_service().firmware_inventory.get_members()) or ():
                identity = f"firmware:{item.identity}"
                components.append(Component(identity, "firmware", name=item.name or "", manufacturer=item.manufacturer or "",
                                            firmware=item.version or ""))
                if item.version:
                    firmware[identity] = item.version
            source = chassis if chassis is not None and chassis.serial_number else system
            return HardwareInventory(
                serial=source.serial_number or "", manufacturer=source.manufacturer or "", model=source.model or "",
                part_number=source.part_number or "", firmware=firmware, components=tuple(components),
                cables=self._cables(root, paths, chassis))

    def _cables(self, root: Any, paths: _Paths, chassis: Any) -> tuple[Cable, ...]:
        """The service's Cables collection (Redfish 2021.1; sushy has no class for it), where it has one. The root is
        read again for it: sushy's copy is the one read on connecting."""
        collection = _odata_id(self._get(root.path).get("Cables"))
        if collection is None:
            return ()
        listing = _optional(lambda: self._get(collection))
        cables = []
        for path in map(_odata_id, (listing or {}).get("Members") or []):
            document = _optional(partial(self._get, path)) if path else None
            if document is None or ((document.get("Status") or {}).get("State") == "Absent"):
                continue
            cables.append(Cable(port=self._cable_port(document, paths, chassis), serial=str(document.get("SerialNumber") or ""),
                                vendor=str(document.get("Vendor") or document.get("Manufacturer") or ""),
                                model=str(document.get("Model") or document.get("PartNumber") or "")))
        return tuple(sorted(cables, key=lambda cable: cable.port))

    @staticmethod
    def _cable_port(document: dict, paths: _Paths, chassis: Any) -> str:
        """The machine's port the cable is plugged in: the last segment of its port link (one under this machine's
        system or chassis first), else its UserLabel, Name or Id."""
        ports = _links(document, "UpstreamPorts") + _links(document, "DownstreamPorts")
        ours = tuple(f"{path.rstrip('/')}/" for path in (paths.system, chassis.path if chassis is not None else None) if path)
        port = next((path for path in ports if path.startswith(ours)), ports[0] if ports else None)
        if port is not None:
            return unquote(port.rstrip("/").rsplit("/", 1)[-1])
        return str(document.get("UserLabel") or document.get("Name") or document.get("Id") or "")

    # -- Health

    def health(self) -> MachineHealth:
        with self._bmc("reading the health") as root:
            return self._health(root)[0]

    def _health(self, root: Any) -> tuple[MachineHealth, PowerState]:
        """The components' health and, from the same reading of the system, the power state."""
        paths = self._discover(root)
        system = root.get_system(paths.system)
        parts = [self._component("system", system.json or {})]
        chassis = _optional(lambda: root.get_chassis(paths.chassis)) if paths.chassis else None
        if chassis is not None:
            parts.append(self._component("chassis", chassis.json or {}))
            thermal = _optional(lambda: chassis.thermal)
            for kind, members in (("fan", thermal.fans if thermal else []), ("temperature", thermal.temperatures if thermal else [])):
                parts += [ComponentHealth(f"{kind}:{member.identity}", _level(member.status.health if member.status else None),
                                          _state(member.status.state if member.status else None), member.name or "") for member in members]
            power = _optional(lambda: chassis.power)
            for supply in power.power_supplies if power else []:
                parts.append(ComponentHealth(f"psu:{supply.identity}", _level(supply.status.health if supply.status else None),
                                             _state(supply.status.state if supply.status else None), supply.name or ""))
        for index, path in enumerate(paths.managers):
            document = _optional(partial(self._get, path))  # sushy's Manager has no Status
            if document is not None:
                parts.append(self._component("bmc" if index == 0 else f"bmc:{document.get('Id', index)}", document))
        parts = [part for part in parts if part.state != "Absent"]
        state = getattr(system.power_state, "value", system.power_state)
        power_state = PowerState(state) if state in {s.value for s in PowerState} else PowerState.UNKNOWN
        return MachineHealth(worst([part.health for part in parts]), tuple(parts)), power_state

    @staticmethod
    def _component(identity: str, document: dict) -> ComponentHealth:
        status = document.get("Status") or {}
        return ComponentHealth(identity, _level(status.get("Health")), _state(status.get("State")), str(document.get("Name") or ""))

    def events(self, after: int) -> list[HealthEvent]:
        with self._lock:
            return [event for event in self._events if event.sequence > after]

    def _event(self, severity: HealthLevel, component: str, message: str) -> None:
        with self._lock:
            self._sequence += 1
            self._events.append(HealthEvent(self._sequence, time.time(), severity, component, message))
        log.debug("BMC %s: %s: %s", self.url, component, message)  # the agent reports it; the controller logs it

    # -- Telemetry

    def telemetry(self) -> TelemetryReading:
        """The chassis' temperatures and power draw: from its Sensors collection where the BMC has
        one, else from Thermal and Power's PowerControl (a BMC with both lists each sensor in both).
        A sensor named for an IPU ("IPU2 Temp") is that IPU's (its first, where it has several), the
        others are the machine's; one the BMC lacks, or without a reading, is left out. Read at most
        every `poll_seconds`: the agent asks more often, and gets the last reading meanwhile."""
        with self._lock:
            if self._telemetry is not None and time.monotonic() - self._telemetry[1] < self.config.poll_seconds:
                return self._telemetry[0]
        with self._bmc("reading the sensors") as root:
            readings = self._sensors(root)
        ipus: dict[int, dict[str, float]] = {}
        machine: dict[str, SensorReading] = {}
        for reading in readings:
            named = _IPU_SENSOR.search(reading.name)
            if named:
                ipus.setdefault(int(named.group(1)), {}).setdefault(reading.kind, reading.value)
            else:
                machine.setdefault(reading.name, reading)
        read = TelemetryReading(time.time(), tuple(IpuReading(index, temperature=values.get("temperature"), power=values.get("power"))
                                                   for index, values in sorted(ipus.items())), tuple(machine.values()))
        with self._lock:
            self._telemetry = (read, time.monotonic())
        return read

    def _sensors(self, root: Any) -> list[SensorReading]:
        paths = self._discover(root)
        chassis = _optional(lambda: root.get_chassis(paths.chassis)) if paths.chassis else None
        if chassis is None:
            return []
        document = chassis.json or {}
        sensors = _optional(partial(self._get, _odata_id(document.get("Sensors")) or "")) if document.get("Sensors") else None
        if sensors and sensors.get("Members"):
            found = []
            for link in sensors.get("Members") or []:
                sensor = _optional(partial(self._get, _odata_id(link) or ""))
                kind = {"Temperature": "temperature", "Power": "power"}.get(str((sensor or {}).get("ReadingType")))
                if sensor and kind and _number(sensor.get("Reading")):
                    found.append(SensorReading(str(sensor.get("Name") or sensor.get("Id")), kind, float(sensor["Reading"])))
            return found
        thermal = _optional(lambda: chassis.thermal)
        found = [SensorReading(t.name or f"temperature {t.identity}", "temperature", float(t.reading_celsius))
                 for t in (thermal.temperatures if thermal else []) if _number(t.reading_celsius)]
        power = _optional(partial(self._get, _odata_id(document.get("Power")) or "")) if document.get("Power") else None
        for control in (power or {}).get("PowerControl") or []:
            if isinstance(control, dict) and _number(control.get("PowerConsumedWatts")):
                found.append(SensorReading(str(control.get("Name") or "chassis power"), "power", float(control["PowerConsumedWatts"])))
        return found

    # -- MachineLog

    def log_lines(self) -> list[tuple[float, str, str]]:
        """The entries of the system's and the managers' log services (the SEL among them) not given
        before, oldest first; an entry is given once, however long the BMC keeps it. Read at most
        every `poll_seconds`."""
        with self._lock:
            if time.monotonic() - self._logs_read < self.config.poll_seconds:
                return []
            self._logs_read = time.monotonic()
        with self._bmc("reading the logs") as root:
            paths = self._discover(root)
            entries: list[tuple[str, str, dict | None]] = []
            for owner in (paths.system, *paths.managers):
                owner_document = _optional(partial(self._get, owner)) or {}
                services = _optional(partial(self._get, _odata_id(owner_document.get("LogServices")) or "")) \
                    if owner_document.get("LogServices") else None
                for link in (services or {}).get("Members") or []:
                    service = _optional(partial(self._get, _odata_id(link) or "")) or {}
                    listed = _optional(partial(self._get, _odata_id(service.get("Entries")) or "")) if service.get("Entries") else None
                    for member in (listed or {}).get("Members") or []:
                        listed_id = _odata_id(member)
                        if listed_id is not None and listed_id in self._log_seen:  # given before: not fetched again
                            entries.append((listed_id, "", None))
                            continue
                        entry = member if isinstance(member, dict) and "Message" in member else _optional(
                            partial(self._get, listed_id or ""))
                        if isinstance(entry, dict):
                            key = str(entry.get("@odata.id") or f"{_odata_id(link)}/{entry.get('Id')}")
                            entries.append((key, str(service.get("Id") or "log"), entry))
        lines = []
        for key, service_id, document in entries:
            if key in self._log_seen or document is None:
                continue
            severity = document.get("Severity") or "OK"
            lines.append((_created(document.get("Created")), "bmc",
                          f"{service_id}: {severity}: {one_line(str(document.get('Message') or ''))}"))
        # The entries the BMC lists now, and no others: its log's own bound is this memory's.
        self._log_seen = {key: None for key, _, _ in entries}
        return sorted(lines, key=lambda line: line[0])

    # -- the poller

    def start(self) -> RedfishMachine:
        """Start polling the BMC for events, every `poll_seconds`."""
        if self._poller is None:
            self._poller = threading.Thread(target=self._poll, name=f"redfish-poll {self.url}", daemon=True)
            self._poller.start()
        return self

    def close(self) -> None:
        """Stop polling and end the Redfish session, if one was opened."""
        self._stopping.set()
        if self._poller is not None:
            self._poller.join(timeout=self._connect_seconds + self._read_seconds + 1)
        with self._lock:
            if self._auth is not None:
                with suppress(sushy_errors.SushyError, requests.exceptions.RequestException):
                    self._auth.close()
            if self._connector is not None:
                self._connector.close()
            self._root = self._auth = None

    def _poll(self) -> None:
        answering: bool | None = None
        before: dict[str, ComponentHealth] | None = None
        power_before: PowerState | None = None
        while not self._stopping.is_set():
            try:
                with self._bmc("reading the health") as root:
                    now, power = self._health(root)
            except Unavailable as error:
                if answering is not False:
                    self._event(HealthLevel.WARNING, "bmc", error.message.removeprefix(f"BMC {self.url}: "))
                answering = False
            except Exception as error:  # noqa: BLE001  (the poller outlives a bug in one reading; the next may succeed)
                log.error("BMC %s: reading the health failed: %s", self.url, one_line(f"{type(error).__name__}: {error}"))
            else:
                if answering is False:
                    self._event(HealthLevel.OK, "bmc", "answers again")
                answering = True
                self._changes(before, {part.component: part for part in now.components})
                if power_before is not None and power is not power_before:
                    self._event(HealthLevel.OK, "system", f"power {power.value} (was {power_before.value})")
                before, power_before = {part.component: part for part in now.components}, power
            self._stopping.wait(self.config.poll_seconds)

    def _changes(self, before: dict[str, ComponentHealth] | None, now: dict[str, ComponentHealth]) -> None:
        """Events for the components whose health changed (on the first reading: those not OK)."""
        for identity, part in now.items():
            old = before.get(identity) if before is not None else None
            if old is None and (before is not None or part.health is not HealthLevel.OK):
                self._event(part.health, identity, f"health {part.health.value}")
            elif old is not None and old.health is not part.health:
                self._event(part.health, identity, f"health {part.health.value} (was {old.health.value})")
        for identity in (before or {}).keys() - now.keys():
            self._event(HealthLevel.WARNING, identity, "no longer reported")
