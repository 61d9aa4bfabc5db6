"""The V-IPU controllers the proxy may use, in the order it tries them.

Written as the seed's Helm value `vipuControllers` is: `host:port:key=value` entries, comma
separated, each with the node label marking the Kubernetes nodes that reach that controller's
IPUs. The list lives in a ConfigMap an administrator may edit at any time; `ControllerList` reads
it again every `refresh` seconds, and keeps the last good list when an edit is malformed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from vipu.model.errors import InvalidArgument

log = logging.getLogger("vipu.k8s.controllers")

CONFIGMAP_KEY = "vipuControllers"


@dataclass(frozen=True)
class Controller:
    host: str
    port: int
    label_key: str = ""
    label_value: str = ""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def node_selector(self) -> dict[str, str]:
        return {self.label_key: self.label_value} if self.label_key else {}

    def describe(self) -> dict:
        return {"host": self.host, "port": self.port, "label": f"{self.label_key}={self.label_value}" if self.label_key else ""}


def parse(text: str) -> list[Controller]:
    """`pod001:8090:ipunode=node1,pod002:8091:ipunode=node2` as controllers, or InvalidArgument."""
    controllers = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        fields = entry.split(":")
        if len(fields) not in (2, 3) or not fields[0] or not fields[1].isdigit() or not 0 < int(fields[1]) < 65536:
            raise InvalidArgument(f"{entry!r} is not host:port:key=value")
        key, value = "", ""
        if len(fields) == 3:
            key, _, value = fields[2].partition("=")
            if not key or not _:
                raise InvalidArgument(f"{entry!r}: the node label must be key=value, not {fields[2]!r}")
        controllers.append(Controller(fields[0], int(fields[1]), key, value))
    if not controllers:
        raise InvalidArgument("no V-IPU controller is listed")
    return controllers


class ControllerList:
    """The current list: from `read()` (the ConfigMap's text, or None if it has none), re-read in the background."""

    def __init__(self, read: Callable[[], str | None], fallback: list[Controller], refresh: float):
        self._read = read
        self._fallback = fallback
        self._current = fallback
        self._lock = threading.Lock()
        self.reload()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, args=(refresh,), name="controller list", daemon=True)
        self._thread.start()

    def __call__(self) -> list[Controller]:
        with self._lock:
            return list(self._current)

    def reload(self) -> None:
        try:
            text = self._read()
            controllers = parse(text) if text is not None else self._fallback
        except InvalidArgument as error:
            log.warning("the V-IPU controller list is not usable, keeping the last one: %s", error.message)
            return
        except Exception as error:  # noqa: BLE001 - the API server is unreachable for now: keep what we have
            log.warning("cannot read the V-IPU controller list, keeping the last one: %s", error)
            return
        with self._lock:
            if controllers != self._current:
                log.info("V-IPU controllers: %s", ", ".join(c.address for c in controllers))
            self._current = controllers

    def _follow(self, refresh: float) -> None:
        while not self._stop.wait(refresh):
            self.reload()

    def stop(self) -> None:
        self._stop.set()

