"""A Redfish BMC for the tests: OpenStack's sushy-emulator (sushy-tools) with its fake systems
driver, on loopback, over TLS with HTTP Basic authentication, plus a small overlay of ours.

sushy-emulator's own, unchanged: its Flask application and everything it serves (the service
root, systems, chassis with their Thermal, managers, the update service), power changes by its
fake driver (applied 1 to 11 s after they are asked for; a restart goes Off at once, On later),
its authentication against an htpasswd file of bcrypt hashes, TLS with the certificate and key its
configuration names, and its state, kept under the test's directory. The configuration file this
module writes sets them: a certificate authority and a server certificate for 127.0.0.1 made here
(`vipu.api.tls`, on the `cryptography` package), a user with a random password.

The overlay's, for what the emulator lacks and the product must be proven on: this module, run
as `python -m tests.bmc CONFIG OVERLAY`, imports `sushy_tools.emulator.main`, configures its `app`
from CONFIG and serves it with the TLS settings sushy-emulator's main() uses, having added:

  - `/redfish/v1/Cables` and `/redfish/v1/Cables/<Id>` (Redfish's Cable schema), from the
    overlay file's "cables", and the collection in the service root while the file has "cables";
  - a different Status.Health for the resources and array members whose @odata.id the file's
    "health" names (the emulator's templates say OK, always): a failed fan, a failed chassis;
  - with "power_delay": [LOW, HIGH], the fake driver's delay drawn from LOW to HIGH seconds
    instead of 1 to 11, so that a suite can afford a few power changes. Its power logic is its own;
  - with "power_watts", a chassis Power resource (PowerControl's PowerConsumedWatts), linked from
    the chassis: the emulator serves Thermal's temperatures itself, but no Power;
  - with "log_entries", a SEL log service of the manager (LogServices/SEL/Entries, Redfish's
    LogEntry members inline), linked from the manager.

The overlay file (JSON) is re-read on every request, so a test changes them while it runs.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import ssl
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.ports import free_port
from tests.processes import dying_with_parent

REPOSITORY = Path(__file__).resolve().parent.parent
USERNAME = "vipu"
CHASSIS_SERIAL = "437XR1138R2"  # what the emulator's chassis template says, whatever the configuration


def cable(port: str, serial: str, vendor: str = "", model: str = "", *, under: str = "") -> dict:
    """A Redfish Cable plugged in `port` of the resource at `under` (a system's or chassis' @odata.id)."""
    return {"Id": f"cable-{port}", "Name": f"Cable at port {port}", "CableType": "OSFP", "SerialNumber": serial, "Vendor": vendor,
            "Model": model, "Status": {"State": "Enabled", "Health": "OK"},
            "Links": {"UpstreamPorts": [{"@odata.id": f"{under}/FabricAdapters/IPU-Link/Ports/{port}"}]}}


class Bmc:
    """sushy-emulator with one fake system (On) and one chassis, and the overlay; `start()` it, `close()` it."""

    def __init__(self, directory: Path, system_name: str = "m2000", power_delay: tuple[int, int] | None = None):
        from vipu.api.tls import issue, make_authority  # here, not in the emulator's process, which needs none of vipu

        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.system_path = f"/redfish/v1/Systems/{uuid.uuid4()}"
        self.chassis_path = f"/redfish/v1/Chassis/{uuid.uuid4()}"
        self.serial = CHASSIS_SERIAL

        authority_key, authority = make_authority("vipu tests' BMC authority")
        key, certificate = issue(authority_key, authority, "127.0.0.1", server_names=["127.0.0.1", "localhost"])
        self.ca = directory / "ca.pem"
        self.ca.write_bytes(authority)
        (directory / "server.pem").write_bytes(certificate)
        _private(directory / "server-key.pem", key)

        import bcrypt

        self.password = secrets.token_urlsafe(16)
        hashed = bcrypt.hashpw(self.password.encode(), bcrypt.gensalt(rounds=4)).decode()  # the least rounds: each request checks it
        _private(directory / "htpasswd", f"{USERNAME}:{hashed}\n".encode())
        self.credentials = directory / "credentials"
        _private(self.credentials, f"{USERNAME}:{self.password}\n".encode())

        settings: dict[str, Any] = {
            "SUSHY_EMULATOR_LISTEN_IP": "127.0.0.1",
            "SUSHY_EMULATOR_LISTEN_PORT": self.port,
            "SUSHY_EMULATOR_SSL_CERT": str(directory / "server.pem"),
            "SUSHY_EMULATOR_SSL_KEY": str(directory / "server-key.pem"),
            "SUSHY_EMULATOR_AUTH_FILE": str(directory / "htpasswd"),
            "SUSHY_EMULATOR_STATE_DIR": str(directory / "state"),
            "SUSHY_EMULATOR_FAKE_DRIVER": True,
            "SUSHY_EMULATOR_FAKE_SYSTEMS": [{"uuid": self.system_path.rsplit("/", 1)[1], "name": system_name, "power_state": "On",
                                             "nics": [{"mac": "00:5c:52:31:3a:9c", "ip": "172.22.0.100"}]}],
            "SUSHY_EMULATOR_CHASSIS": [{"Id": "chassis", "Name": "IPU-M2000", "UUID": self.chassis_path.rsplit("/", 1)[1]}],
        }
        self.config = directory / "emulator.conf"
        self.config.write_text("".join(f"{name} = {value!r}\n" for name, value in settings.items()))
        self.overlay_file = directory / "overlay.json"
        self._overlay: dict[str, Any] = {"health": {}}
        if power_delay is not None:
            self._overlay["power_delay"] = list(power_delay)
        self._write_overlay()
        self.log = directory / "emulator.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> Bmc:
        with open(self.log, "ab") as log:
            command = [sys.executable, "-m", "tests.bmc", str(self.config), str(self.overlay_file)]
            self.process = subprocess.Popen(dying_with_parent(command), cwd=REPOSITORY, stdout=log, stderr=subprocess.STDOUT)
        from tests.functional.harness import wait_until

        wait_until(self._answers, timeout=30, what="sushy-emulator")
        return self

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"sushy-emulator exited with status {self.process.returncode}:\n{self.log.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(f"{self.url}/redfish/v1/", timeout=2, context=ssl.create_default_context(cafile=self.ca)).read()
            return True
        except OSError:
            return False

    def stop_answering(self) -> None:
        """Freeze the BMC: connections are still accepted (by the kernel), nothing is answered."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def answer_again(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def fail_component(self, odata_id: str, health: str = "Critical") -> None:
        """Make the resource or array member with this @odata.id report `health`, e.g. f"{chassis_path}/Thermal#/Fans/0"."""
        self._overlay["health"][odata_id] = health
        self._write_overlay()

    def heal_component(self, odata_id: str) -> None:
        self._overlay["health"].pop(odata_id, None)
        self._write_overlay()

    def set_cables(self, cables: list[dict] | None) -> None:
        """The Redfish Cables the BMC lists (see `cable()`); None: no Cables collection at all."""
        if cables is None:
            self._overlay.pop("cables", None)
        else:
            self._overlay["cables"] = cables
        self._write_overlay()

    def set_power_delay(self, low: int, high: int) -> None:
        self._overlay["power_delay"] = [low, high]
        self._write_overlay()

    def set_power_watts(self, watts: float | None) -> None:
        if watts is None:
            self._overlay.pop("power_watts", None)
        else:
            self._overlay["power_watts"] = watts
        self._write_overlay()

    def record_event(self, severity: str, message: str, created: str = "2026-12-07T10:00:00Z") -> None:
        """An entry in the manager's SEL, as the BMC would record an event."""
        entries = self._overlay.setdefault("log_entries", [])
        entries.append({"Id": str(len(entries) + 1), "Severity": severity, "Message": message, "Created": created,
                        "EntryType": "SEL"})
        self._write_overlay()

    def _write_overlay(self) -> None:
        staging = self.overlay_file.with_suffix(".new")
        staging.write_text(json.dumps(self._overlay))
        staging.replace(self.overlay_file)  # whole, as each request reads it

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.answer_again()  # a stopped process would keep SIGTERM pending
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def _private(path: Path, data: bytes) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)


# -- the overlay, in the emulator's process


def _mark(document: Any, health: dict[str, str]) -> None:
    """Set Status.Health (and any roll-up) of the objects whose @odata.id `health` names, at any depth."""
    if isinstance(document, dict):
        level = health.get(document.get("@odata.id", ""))
        if level is not None and isinstance(document.get("Status"), dict):
            status = document["Status"]
            status["Health"] = level
            for rollup in ("HealthRollup", "HealthRollUp"):
                if rollup in status:
                    status[rollup] = level
        for value in document.values():
            _mark(value, health)
    elif isinstance(document, list):
        for value in document:
            _mark(value, health)


class _Delays:
    """Stands in for the `random` module in the fake driver, which draws a power change's delay with randint(1, 11)."""

    def __init__(self, overlay: Callable[[], dict]):
        self.overlay = overlay

    def randint(self, low: int, high: int) -> int:
        import random

        narrowed = self.overlay().get("power_delay")
        return random.randint(*narrowed) if narrowed else random.randint(low, high)


def serve(config: str, overlay_file: str) -> None:
    import flask
    from sushy_tools.emulator import main as emulator
    from sushy_tools.emulator.resources.systems import fakedriver

    app = emulator.app

    def overlay() -> dict:
        return json.loads(Path(overlay_file).read_text())

    def cables() -> list[dict]:
        return [{**document, "@odata.id": f"/redfish/v1/Cables/{document['Id']}", "@odata.type": "#Cable.v1_2_0.Cable"}
                for document in overlay().get("cables") or []]

    @app.route("/redfish/v1/Cables")
    def cable_collection():
        members = [{"@odata.id": document["@odata.id"]} for document in cables()]
        return flask.jsonify({"@odata.id": "/redfish/v1/Cables", "@odata.type": "#CableCollection.CableCollection",
                              "Name": "Cable Collection", "Members@odata.count": len(members), "Members": members})

    @app.route("/redfish/v1/Cables/<identity>")
    def cable_resource(identity):
        for document in cables():
            if document["Id"] == identity:
                return flask.jsonify(document)
        flask.abort(404)

    @app.route("/redfish/v1/Chassis/<identity>/Power")
    def chassis_power(identity):
        watts = overlay().get("power_watts")
        if watts is None:
            flask.abort(404)
        return flask.jsonify({"@odata.id": f"/redfish/v1/Chassis/{identity}/Power", "@odata.type": "#Power.v1_5_0.Power",
                              "Id": "Power", "Name": "Power", "PowerControl": [
                                  {"@odata.id": f"/redfish/v1/Chassis/{identity}/Power#/PowerControl/0", "MemberId": "0",
                                   "Name": "Chassis Power Control", "PowerConsumedWatts": watts}]})

    def log_entries() -> list[dict] | None:
        return overlay().get("log_entries")

    @app.route("/redfish/v1/Managers/<identity>/LogServices")
    def log_services(identity):
        if log_entries() is None:
            flask.abort(404)
        return flask.jsonify({"@odata.id": f"/redfish/v1/Managers/{identity}/LogServices", "Name": "Log Services",
                              "Members": [{"@odata.id": f"/redfish/v1/Managers/{identity}/LogServices/SEL"}]})

    @app.route("/redfish/v1/Managers/<identity>/LogServices/SEL")
    def sel(identity):
        if log_entries() is None:
            flask.abort(404)
        return flask.jsonify({"@odata.id": f"/redfish/v1/Managers/{identity}/LogServices/SEL", "Id": "SEL", "Name": "System Event Log",
                              "Entries": {"@odata.id": f"/redfish/v1/Managers/{identity}/LogServices/SEL/Entries"}})

    @app.route("/redfish/v1/Managers/<identity>/LogServices/SEL/Entries")
    def sel_entries(identity):
        entries = log_entries()
        if entries is None:
            flask.abort(404)
        here = f"/redfish/v1/Managers/{identity}/LogServices/SEL/Entries"
        return flask.jsonify({"@odata.id": here, "Name": "SEL Entries", "Members@odata.count": len(entries),
                              "Members": [{**entry, "@odata.id": f"{here}/{entry['Id']}", "@odata.type": "#LogEntry.v1_9_0.LogEntry"}
                                          for entry in entries]})

    @app.after_request
    def rewrite(response):
        if response.status_code != 200 or response.mimetype != "application/json":
            return response
        wanted = overlay()
        path = flask.request.path.rstrip("/")
        root = path == "/redfish/v1" and "cables" in wanted
        power = path.startswith("/redfish/v1/Chassis/") and path.count("/") == 4 and "power_watts" in wanted
        logs = path.startswith("/redfish/v1/Managers/") and path.count("/") == 4 and "log_entries" in wanted
        if not (root or power or logs) and not wanted.get("health"):
            return response
        document = json.loads(response.get_data())
        if power:
            document["Power"] = {"@odata.id": f"{path}/Power"}
        if logs:
            document["LogServices"] = {"@odata.id": f"{path}/LogServices"}
        if root:
            document["Cables"] = {"@odata.id": "/redfish/v1/Cables"}
        _mark(document, wanted.get("health") or {})
        response.set_data(json.dumps(document))
        return response

    fakedriver.random = _Delays(overlay)
    app.configure(config_file=config)
    # As sushy-emulator's main() serves it.
    ssl_context = ssl.SSLContext(ssl.PROTOCOL_TLSv1_2)
    ssl_context.load_cert_chain(app.config["SUSHY_EMULATOR_SSL_CERT"], app.config["SUSHY_EMULATOR_SSL_KEY"])
    app.run(host=app.config.get("SUSHY_EMULATOR_LISTEN_IP"), port=app.config.get("SUSHY_EMULATOR_LISTEN_PORT", 8000),
            ssl_context=ssl_context)


if __name__ == "__main__":
    serve(*sys.argv[1:3])
