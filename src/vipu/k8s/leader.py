"""Leader election on a coordination.k8s.io Lease, so that of several operator replicas one acts.

A replica leads while it renews the lease within its duration; the others stand by and take the
lease once it has not been renewed for that long. A leader that cannot renew in time stops acting
(the operator exits, and its pod is restarted to stand by), so two replicas never act at once as
long as their clocks agree to within the lease's duration.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("vipu.k8s.leader")


def _micro_time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElection:
    def __init__(self, coordination: client.CoordinationV1Api, namespace: str, name: str, identity: str,
                 lease_seconds: float = 15.0, retry_seconds: float = 2.0):
        self.api = coordination
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_seconds, self.retry_seconds = lease_seconds, retry_seconds
        self._stop = threading.Event()

    def try_acquire(self) -> bool:
        """Take or renew the lease if it is free, expired or ours; whether we hold it now."""
        now = datetime.now(UTC)
        spec = {"holderIdentity": self.identity, "leaseDurationSeconds": max(1, round(self.lease_seconds)),
                "renewTime": _micro_time(now)}
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as error:
            if error.status != 404:
                raise
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {**spec, "acquireTime": _micro_time(now), "leaseTransitions": 0}}
            return self._attempt(self.api.create_namespaced_lease, self.namespace, body)
        current, metadata = lease.spec, lease.metadata
        if current is None or metadata is None:  # the API server fills both in; callers log it and try again
            raise ValueError(f"lease {self.namespace}/{self.name} has no spec or metadata")
        held = current.holder_identity
        renewed = current.renew_time
        expiry = renewed + timedelta(seconds=current.lease_duration_seconds or self.lease_seconds) if renewed else now
        if held and held != self.identity and now < expiry:
            return False
        if held != self.identity:
            spec.update(acquireTime=_micro_time(now), leaseTransitions=(current.lease_transitions or 0) + 1)
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": metadata.resource_version},
                "spec": {**self.api.api_client.sanitize_for_serialization(current), **spec}}
        return self._attempt(self.api.replace_namespaced_lease, self.name, self.namespace, body)

    @staticmethod
    def _attempt(call, *args) -> bool:
        try:
            call(*args)
            return True
        except ApiException as error:
            if error.status == 409:  # another replica wrote it first
                return False
            raise

    def acquire(self) -> None:
        """Block until this replica leads."""
        while not self._stop.is_set():
            try:
                if self.try_acquire():
                    return
            except Exception as error:  # noqa: BLE001 - the API server is away for a moment: try again
                log.warning("cannot reach lease %s/%s: %s", self.namespace, self.name, error)
            self._stop.wait(self.retry_seconds)

    def keep(self, on_lost) -> threading.Thread:
        """Renew the lease in the background; call `on_lost` once it could not be renewed in time."""

        def renew() -> None:
            last = datetime.now(UTC)
            while not self._stop.wait(self.retry_seconds):
                try:
                    if self.try_acquire():
                        last = datetime.now(UTC)
                        continue
                    lost, reason = True, "another replica holds the lease"
                except Exception as error:  # noqa: BLE001 - give up before the lease could expire under another leader
                    lost, reason = (datetime.now(UTC) - last).total_seconds() >= self.lease_seconds * 2 / 3, str(error)
                if lost:
                    log.error("lost the lease %s/%s: %s", self.namespace, self.name, reason)
                    on_lost()
                    return

        thread = threading.Thread(target=renew, name="lease renewal", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()
