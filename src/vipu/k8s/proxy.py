"""`vipu-ipu-proxy`: the V-IPU proxy between an IPUJob's launcher and vipu-server.

REST end-points:
- `POST /partitions` {id, namespace, job, uid, size, replicas}: create the job's partition, or
  reset it when the job already owns it (a restarted job starts on clean IPUs). 201 created,
  200 reset; 409 when the IPUs are not free yet or the id belongs to someone else; 400 for a
  request the controller will never satisfy; 503 when the controller cannot be reached.
- `POST /partitions/{id}/reset`, `DELETE /partitions/{id}` (the operator, when a job is deleted).
- `GET /stats`: IPUs used per namespace by tracked partitions, and in total, with those available.
- `POST /query` {size}: whether a partition of that size fits now, and how many would.
- `GET /health`.

Partitions it makes are recorded in the `ipu-partitions-tracker` ConfigMap (`tracker.py`).
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timezone

import click
import uvicorn
from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse
from kubernetes import client
from pydantic import BaseModel, Field

from vipu.api.protos import vipuuser_pb2 as pb
from vipu.api.protos import vipuuser_pb2_grpc as pb_grpc
from vipu.cli.common import Connection
from vipu.cli.config import ClientSettings
from vipu.k8s import kube
from vipu.k8s.tracker import Entry, Tracker
from vipu.model.entities import IPUS_PER_MACHINE
from vipu.model.errors import (
    AlreadyExists,
    Conflict,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
    VipuError,
)

log = logging.getLogger("vipu.k8s.proxy")

HTTP_STATUS = ((InvalidArgument, 400), (Unauthenticated, 403), (PermissionDenied, 403), (NotFound, 404),
               (AlreadyExists, 409), (Conflict, 409), (Unavailable, 503))


class PartitionRequest(BaseModel):
    id: str
    namespace: str
    job: str
    uid: str
    size: int = Field(gt=0)
    replicas: int = Field(default=0, ge=0)


class Query(BaseModel):
    size: int = Field(gt=0)


class Partitions:
    """The proxy's work, apart from HTTP: one controller, one tracker."""

    def __init__(self, connection: Connection, tracker: Tracker, cluster_id: str = ""):
        self.connection = connection
        self.tracker = tracker
        self.cluster_id = cluster_id
        self._lock = threading.Lock()  # one partition change at a time keeps the tracker true

    def _call(self, method: str, request):
        return self.connection.call(pb_grpc.UserServiceStub, method, request)

    def create(self, request: PartitionRequest) -> tuple[int, dict]:
        with self._lock:
            owner = self.tracker.get(request.id)
            if owner is not None and owner.uid == request.uid:
                try:
                    self._call("ResetPartition", pb.ResetPartitionRequest(partition_id=request.id))
                    log.info("partition %s of job %s/%s reset", request.id, request.namespace, request.job)
                    return 200, {"id": request.id, "reset": True}
                except NotFound:  # removed behind the proxy's back: make it again
                    self.tracker.drop(request.id)
                    owner = None
            if owner is not None:
                raise AlreadyExists(f"partition {request.id} belongs to job {owner.namespace}/{owner.job} (uid {owner.uid})")
            entry = Entry(request.namespace, request.job, request.uid, request.size, self.connection.address,
                          datetime.now(timezone.utc).isoformat(timespec="seconds"))
            self.tracker.put(request.id, entry)  # first, so that a crash cannot leave an untracked partition
            try:
                self._call("CreatePartition", pb.CreatePartitionRequest(requirements=pb.PartitionRequirements(
                    id=request.id, size=request.size, cluster_id=self.cluster_id, num_gcds=1,
                    num_replicas=request.replicas)))
            except AlreadyExists:
                self.tracker.drop(request.id)
                raise AlreadyExists(f"partition {request.id} exists and was not made by this proxy for job "
                                    f"{request.namespace}/{request.job}") from None
            except BaseException:
                self.tracker.drop(request.id)
                raise
            log.info("partition %s of %d IPUs created for job %s/%s", request.id, request.size, request.namespace, request.job)
            return 201, {"id": request.id, "created": True}

    def reset(self, partition_id: str) -> dict:
        self._call("ResetPartition", pb.ResetPartitionRequest(partition_id=partition_id))
        return {"id": partition_id, "reset": True}

    def remove(self, partition_id: str) -> dict:
        with self._lock:
            if self.tracker.get(partition_id) is None:
                raise NotFound(f"partition {partition_id} is not one the proxy made")
            try:
                self._call("RemovePartition", pb.RemovePartitionRequest(partition_id=partition_id, force=True))
            except NotFound:
                pass  # gone already: forget it all the same
            self.tracker.drop(partition_id)
            log.info("partition %s removed", partition_id)
            return {"id": partition_id, "removed": True}

    def _capacity(self) -> tuple[list[tuple[str, ...]], dict[str, set[int]]]:
        """The machines of each allocation in order, and the IPUs in use on each machine."""
        allocations = [tuple(a.spec.agent_ids) for a in self._call("ListAllocations", pb.ListAllocationsRequest()).allocations
                       if not self.cluster_id or a.spec.cluster_id == self.cluster_id]
        used: dict[str, set[int]] = {}
        for partition in self._call("ListPartitions", pb.ListPartitionsRequest()).partitions:
            for ipu in partition.spec.ipus:
                used.setdefault(ipu.agent_id, set()).add(ipu.agent_ipu_index)
        return allocations, used

    def stats(self) -> dict:
        allocations, used = self._capacity()
        machines = {agent for allocation in allocations for agent in allocation}
        in_use = sum(len(used.get(agent, ())) for agent in machines)
        available = len(machines) * IPUS_PER_MACHINE - in_use
        per_namespace: dict[str, int] = {}
        for entry in self.tracker.entries().values():
            per_namespace[entry.namespace] = per_namespace.get(entry.namespace, 0) + entry.size
        report = {namespace: {"used": ipus, "available": available} for namespace, ipus in sorted(per_namespace.items())}
        report["total"] = {"used": in_use, "available": available}
        return report

    def query(self, size: int) -> dict:
        if size & (size - 1):
            return {"available": False, "numOfPartitions": 0, "message": f"size must be a power of two, not {size}"}
        allocations, used = self._capacity()
        count = sum(fitting_partitions(allocation, used, size) for allocation in allocations)
        return {"available": count > 0, "numOfPartitions": count, "message": ""}


def fitting_partitions(machines: tuple[str, ...], used: dict[str, set[int]], size: int) -> int:
    """How many partitions of `size` IPUs fit side by side in the free IPUs of one allocation.

    Within a machine a partition takes an aligned group of IPUs; a larger one takes whole machines
    in a row, as the controller places them.
    """
    if size <= IPUS_PER_MACHINE:
        return sum(all(ipu not in used.get(machine, ()) for ipu in range(start, start + size))
                   for machine in machines for start in range(0, IPUS_PER_MACHINE, size))
    per_partition, count, run = size // IPUS_PER_MACHINE, 0, 0
    for machine in machines:
        run = run + 1 if not used.get(machine) else 0
        if run == per_partition:
            count, run = count + 1, 0
    return count


def create_app(partitions: Partitions) -> FastAPI:
    app = FastAPI(title="vipu IPU proxy")

    def answer(action):
        try:
            return action()
        except VipuError as error:
            status = next((code for family, code in HTTP_STATUS if isinstance(error, family)), 500)
            raise HTTPException(status_code=status, detail=error.message) from None

    @app.post("/partitions")
    def create_partition(request: PartitionRequest):
        status, body = answer(lambda: partitions.create(request))
        return JSONResponse(status_code=status, content=body)

    @app.post("/partitions/{partition_id}/reset")
    def reset_partition(partition_id: str):
        return answer(lambda: partitions.reset(partition_id))

    @app.delete("/partitions/{partition_id}")
    def remove_partition(partition_id: str):
        return answer(lambda: partitions.remove(partition_id))

    @app.get("/stats")
    def stats():
        return answer(partitions.stats)

    @app.post("/query")
    def query(request: Query):
        return answer(lambda: partitions.query(request.size))

    @app.get("/health")
    def health():
        return {"status": "ok"}

    return app


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--vipu-host", required=True, envvar="VIPU_SERVER_ADDR", help="Host of vipu-server's user end-point.")
@click.option("--vipu-port", type=click.IntRange(1, 65535), default=8090, show_default=True, envvar="VIPU_SERVER_PORT")
@click.option("--vipu-cluster", default="", envvar="VIPU_CLUSTER_NAME", help="Make partitions in this cluster only.")
@click.option("--api-user-id", default="", envvar="VIPU_API_USER_ID", help="User to act as on a secure controller.")
@click.option("--api-access-key", default="", envvar="VIPU_API_ACCESS_KEY")
@click.option("--listen-address", default="0.0.0.0", show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True, envvar="PROXY_PORT")
@click.option("--namespace", default=None, help="Where the tracker ConfigMap lives. Default: the proxy pod's namespace.")
@click.option("--api-timeout", default=50.0, show_default=True, help="Seconds to wait for vipu-server.")
def main(vipu_host, vipu_port, vipu_cluster, api_user_id, api_access_key, listen_address, port, namespace, api_timeout):
    """The V-IPU proxy for the IPUJob operator."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = ClientSettings(host=vipu_host, port=vipu_port, user_id=api_user_id, access_key=api_access_key)
    tracker = Tracker(client.CoreV1Api(kube.api_client()), namespace or kube.namespace_of_this_pod())
    known = tracker.entries()
    log.info("tracking %d partition(s) from ConfigMap %s/%s", len(known), tracker.namespace, tracker.name)
    app = create_app(Partitions(Connection(settings, api_timeout), tracker, vipu_cluster))
    uvicorn.run(app, host=listen_address, port=port, log_level="info")
