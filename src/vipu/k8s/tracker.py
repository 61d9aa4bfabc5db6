"""The `ipu-partitions-tracker` ConfigMap: which IPUJob each partition the proxy made belongs to.

One key per partition, its value a JSON object (namespace, job, uid, size, controller, created).
The proxy creates the ConfigMap itself rather than through the Helm chart, so that uninstalling the
chart leaves it behind and a proxy installed again picks up the partitions it was managing.
Partitions made by hand with `vipu create partition` are never in it.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass

from kubernetes import client
from kubernetes.client.exceptions import ApiException

NAME = "ipu-partitions-tracker"


@dataclass(frozen=True)
class Entry:
    namespace: str
    job: str
    uid: str
    size: int
    controller: str
    created: str


class Tracker:
    def __init__(self, core: client.CoreV1Api, namespace: str, name: str = NAME):
        self.core = core
        self.namespace = namespace
        self.name = name
        self._lock = threading.Lock()

    def entries(self) -> dict[str, Entry]:
        data = self._read().data or {}
        return {key: Entry(**json.loads(value)) for key, value in sorted(data.items())}

    def get(self, partition_id: str) -> Entry | None:
        return self.entries().get(partition_id)

    def put(self, partition_id: str, entry: Entry) -> None:
        self._change(lambda data: data.__setitem__(partition_id, json.dumps(asdict(entry), sort_keys=True)))

    def drop(self, partition_id: str) -> None:
        self._change(lambda data: data.pop(partition_id, None))

    def _read(self) -> client.V1ConfigMap:
        try:
            return self.core.read_namespaced_config_map(self.name, self.namespace)
        except ApiException as error:
            if error.status != 404:
                raise
        body = client.V1ConfigMap(metadata=client.V1ObjectMeta(
            name=self.name, namespace=self.namespace, labels={"app.kubernetes.io/component": "ipu-partitions-tracker"}))
        try:
            return self.core.create_namespaced_config_map(self.namespace, body)
        except ApiException as error:
            if error.status != 409:  # another proxy made it first
                raise
            return self.core.read_namespaced_config_map(self.name, self.namespace)

    def _change(self, edit) -> None:
        """Read, edit and replace, again if someone else replaced it in between."""
        with self._lock:
            while True:
                current = self._read()
                data = dict(current.data or {})
                edit(data)
                current.data = data
                try:
                    self.core.replace_namespaced_config_map(self.name, self.namespace, current)
                    return
                except ApiException as error:
                    if error.status != 409:
                        raise
