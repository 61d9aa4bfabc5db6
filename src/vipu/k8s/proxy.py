"""`vipu-ipu-proxy`: the V-IPU proxy between IPUJobs and the V-IPU controllers (vipu-server).

REST end-points:
- `POST /controllers/choose` {namespace, job, uid, size[, id, replicas, expected_seconds, reservation]}: the
  controller the job's pods go to (the operator asks before it makes them; they run on the nodes
  carrying that controller's label): the first in the list with room for the job now. When none has, and the
  job's partition `id` is given, its request waits for room in the queue of the controller that
  can hold it with the least work ahead (first come, first served there), and the answer is 409
  with its place and reason until it has started; then that controller.
- `POST /partitions` {id, namespace, job, uid, size, replicas, controller[, gcds, wait, resume,
  expected_seconds, reservation]}: create the job's partition (expected to run `expected_seconds`
  from its start, when given; in the vipu reservation named, when given), or reset it when the
  job already owns it (a restarted job starts on clean IPUs; not when `resume`, the launcher's
  next try after a 202, finds it started). A request that
  does not fit waits in the controller's queue; the call waits up to `wait` seconds for it. 201
  created, 200 reset, 202 still waiting (its place and reason); errors as
  `vipu.client.retry.http_status` says: 409 when the id belongs to someone else, 401 when the
  controller refuses the proxy's credentials (try later), 400, 403, 404 or 422 (the hardware
  failed it) for what asking again cannot mend, 503 when the controller cannot be reached, 500
  for anything else.
- `POST /partitions/{id}/reset`, `DELETE /partitions/{id}` (the operator, when a job is deleted).
- `GET /stats`: IPUs used per namespace by tracked partitions, and in total, with those available.
- `POST /query` {size}: how many partitions of that size fit now (`available`: whether it could be answered).
- `POST /scheduler/filter` and `/scheduler/prioritize`: a kube-scheduler extender steering pods
  that ask for IPUs (annotation `graphcore.ai/ipus: N`) to nodes whose controller has room.
- `GET /health`, and `GET /metrics` for Prometheus.

Partitions it makes are recorded in the `ipu-partitions-tracker` ConfigMap (`tracker.py`); the
controllers come from a ConfigMap an administrator may edit (`controllers.py`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import typing
from collections.abc import Callable
from datetime import UTC, datetime

import click
import uvicorn
from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter, Gauge, make_asgi_app
from pydantic import BaseModel, Field

from vipu.api.protos import vipuuser_pb2
from vipu.client.retry import http_status
from vipu.client.settings import ClientSettings
from vipu.client.user import UserClient
from vipu.k8s import kube
from vipu.k8s.controllers import CONFIGMAP_KEY, Controller, ControllerList
from vipu.k8s.tracker import Entry, Tracker
from vipu.model.accounts import NO_ACCOUNTS, AccountMap
from vipu.model.entities import ID_MAX_LENGTH
from vipu.model.errors import (
    AlreadyExists,
    Conflict,
    HardwareFailure,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
    VipuError,
)
from vipu.model.waiting import MAX_EXPECTED_SECONDS, WAIT_CALL_SECONDS

log = logging.getLogger("vipu.k8s.proxy")

# Refusals of a create that the controller gives before it makes anything: nothing to clean up.
REFUSED_BEFORE_MAKING = (InvalidArgument, NotFound, PermissionDenied, Unauthenticated, Conflict)
# How long a job's request may wait in a controller's queue; the job asks again after that.
QUEUE_SECONDS = 24 * 3600


class JobRequest(BaseModel):
    namespace: str
    job: str
    uid: str
    size: int = Field(gt=0)
    id: str = ""  # the job's partition: given, a job with no room anywhere waits in a controller's queue
    replicas: int = Field(default=0, ge=0)
    gcds: int = Field(default=1, ge=1, le=64)  # the GCDs its partition is split into (spec.numGcds)
    expected_seconds: int = Field(default=0, ge=0, le=MAX_EXPECTED_SECONDS)  # how long the job is expected to run; 0: unknown
    reservation: str = Field(default="", max_length=ID_MAX_LENGTH)  # the vipu reservation to make its partition in (spec.reservation)


class PartitionRequest(JobRequest):
    id: str
    controller: str = ""  # host:port; the first listed when empty
    wait: int = Field(default=0, ge=0, le=WAIT_CALL_SECONDS)  # seconds this call waits for a waiting request
    resume: bool = False  # the launcher asks again after a 202: a started partition is not reset


class Query(BaseModel):
    size: int = Field(gt=0)


class Partitions:
    """The proxy's work, apart from HTTP: the listed controllers and one tracker."""

    def __init__(self, controllers: Callable[[], list[Controller]], connect: Callable[[Controller], UserClient],
                 tracker: Tracker, cluster_id: str = "", job_alive: Callable[[str, str, str], bool] = lambda *_: True,
                 queue_seconds: int = QUEUE_SECONDS, accounts: AccountMap = NO_ACCOUNTS):
        """`job_alive(namespace, name, uid)`: whether that IPUJob exists and is not being deleted;
        `accounts`, the vipu account a job's partition is made on, by the job's namespace."""
        self.job_alive = job_alive
        self.accounts = accounts
        self.queue_seconds = queue_seconds
        self.controllers = controllers
        self._connect = connect
        self._clients: dict[str, UserClient] = {}
        self.tracker = tracker
        self.cluster_id = cluster_id
        self._lock = threading.Lock()  # one partition change at a time keeps the tracker true

    def _controller(self, address: str) -> Controller:
        listed = self.controllers()
        if not address:
            return listed[0]
        found = next((c for c in listed if c.address == address), None)
        if found is None:
            raise InvalidArgument(f"V-IPU controller {address} is not in the proxy's list ({', '.join(c.address for c in listed)})")
        return found

    def _user(self, controller: Controller) -> UserClient:
        if controller.address not in self._clients:
            self._clients[controller.address] = self._connect(controller)
        return self._clients[controller.address]

    def _owned(self, partition_id: str) -> tuple[Entry, Controller]:
        entry = self.tracker.get(partition_id)
        if entry is None:
            raise NotFound(f"partition {partition_id} is not one the proxy made")
        return entry, self._owned_controller(entry)

    def choose(self, request: JobRequest) -> dict:
        """The controller a job's pods and partition go to: its own if it has one (once its request
        has started), else the one with the reservation it names, else the first with room; else,
        given the job's partition id, its request waits in a controller's queue and the Conflict
        says where and why."""
        owned = next(((partition_id, e) for partition_id, e in self.tracker.entries().items() if e.uid == request.uid), None)
        if owned is not None:
            controller = self._owned_controller(owned[1])
            try:
                queued = self._queued(controller, owned[0])
            except Conflict:  # its request ended (it waited its time, or was cancelled): it is asked for again
                self.tracker.drop(owned[0])
            else:
                if queued is not None:
                    raise Conflict(_waiting(controller, queued)["detail"])
                return controller.describe()
        if request.reservation:  # made there or nowhere: its launcher's create waits for room in the reservation
            return self._holding(request.reservation).describe()
        refusals = []
        for controller in self.controllers():
            try:
                fits = self._room(controller, request.size).fitting
            except VipuError as error:
                refusals.append(f"{controller.address}: {error.message}")
                continue
            if fits:
                return controller.describe()
            refusals.append(f"{controller.address}: no room")
        if not request.id:
            raise Conflict(f"no V-IPU controller has room for {request.size} IPUs now ({'; '.join(refusals)})")
        controller = self._least_work_ahead(request.size)
        status, answer = self.create(PartitionRequest(**request.model_dump(), controller=controller.address))
        if status == 202:
            raise Conflict(answer["detail"])
        return controller.describe()

    def _holding(self, reservation: str) -> Controller:
        """The listed controller that has the reservation; NotFound if none has, Unavailable if
        none that answered has it but some did not answer (it may be theirs)."""
        silent = []
        for controller in self.controllers():
            try:
                if any(r.name == reservation for r in self._user(controller).list_reservations()):
                    return controller
            except VipuError as error:
                silent.append(f"{controller.address}: {error.message}")
        if silent:
            raise Unavailable(f"no V-IPU controller that answered has reservation {reservation}, and some did not answer "
                              f"({'; '.join(silent)})")
        raise NotFound(f"no V-IPU controller has reservation {reservation}")

    def _queued(self, controller: Controller, partition_id: str) -> vipuuser_pb2.QueuedRequest | None:
        """Where the partition's request waits at the controller; None if it does not wait (the
        partition exists, or nothing yet: the launcher's create settles it)."""
        try:
            state = self._user(controller).wait_once(partition_id, 0)
        except NotFound:
            return None
        return state.queued if state.HasField("queued") else None

    def _least_work_ahead(self, size: int) -> Controller:
        """Of the controllers with an allocation big enough, the one with the fewest IPUs in use and
        waiting; the first listed if none can say."""
        work: dict[str, tuple[int, int]] = {}
        for controller in self.controllers():
            try:
                rooms = self._room(controller).allocations
                if max((a.total_ipus for a in rooms), default=0) >= size:
                    queued = sum(q.size for q in self._user(controller).list_queued())
                    work[controller.address] = (sum(a.used_ipus for a in rooms) + queued, len(work))
            except VipuError as error:
                log.warning("cannot ask %s for its queue: %s", controller.address, error.message)
        chosen = min(work, key=lambda address: work[address], default=None)
        return self._controller(chosen or "")

    def _owned_controller(self, entry: Entry) -> Controller:
        """The controller holding a tracked partition, still reached if since dropped from the list."""
        host, _, port = entry.controller.rpartition(":")
        return next((c for c in self.controllers() if c.address == entry.controller), None) or Controller(host, int(port))

    def create(self, request: PartitionRequest) -> tuple[int, dict]:
        """Create the job's partition, queueing its request if there is no room, or reset the one it
        owns; then wait for a waiting request up to `request.wait` seconds."""
        with self._lock:
            owner = self.tracker.get(request.id)
            if owner is not None and owner.uid == request.uid:
                controller = self._owned_controller(owner)
                user = self._user(controller)
                try:
                    state = user.wait_once(request.id, 0)
                except (NotFound, Conflict):  # removed behind the proxy's back, its request ended: make it again
                    self.tracker.drop(request.id)
                    owner = None
                else:
                    if not state.HasField("queued") and not request.resume:
                        user.reset_partition(request.id)
                        log.info("partition %s of job %s/%s reset", request.id, request.namespace, request.job)
                        return 200, {"id": request.id, "reset": True}
            if owner is not None:
                if owner.uid != request.uid:
                    raise AlreadyExists(f"partition {request.id} belongs to job {owner.namespace}/{owner.job} (uid {owner.uid})")
            else:
                controller = self._make(request)
        return self._waited(controller, request.id, request.wait)

    def _make(self, request: PartitionRequest) -> Controller:
        """Ask the controller for the job's partition, tracked first; its request may wait there. The caller holds the lock."""
        if not self.job_alive(request.namespace, request.job, request.uid):
            # its finaliser may have released the job's IPUs already: a partition now would be left behind
            raise NotFound(f"job {request.namespace}/{request.job} is gone or being deleted: no partition for it")
        controller = self._controller(request.controller)
        entry = Entry(request.namespace, request.job, request.uid, request.size, controller.address,
                      datetime.now(UTC).isoformat(timespec="seconds"))
        self.tracker.put(request.id, entry)  # first, so that a crash cannot leave an untracked partition
        try:
            # The proxy tracks the request and withdraws it when its job goes (not a waiter's lease): its
            # launcher asks after it only while its pod runs.
            made = self._user(controller).create_or_queue(request.id, request.size, cluster_id=self.cluster_id,
                                                          num_replicas=request.replicas, num_gcds=request.gcds,
                                                          wait_seconds=self.queue_seconds,
                                                          detached=True, expected_seconds=request.expected_seconds,
                                                          reservation=request.reservation,
                                                          account=self.accounts.of(request.namespace),
                                                          labels={"ipujob": request.job, "namespace": request.namespace})
        except AlreadyExists:
            self.tracker.drop(request.id)
            raise AlreadyExists(f"partition {request.id} exists on {controller.address} and was not made by this proxy "
                                f"for job {request.namespace}/{request.job}") from None
        except REFUSED_BEFORE_MAKING:
            self.tracker.drop(request.id)
            raise
        except BaseException as failure:
            self._release_after_failed_create(request.id, controller, failure)
            raise
        if made.HasField("queued"):
            log.info("partition %s of %d IPUs for job %s/%s waits on %s: %s", request.id, request.size, request.namespace,
                     request.job, controller.address, made.queued.reason)
        else:
            log.info("partition %s of %d IPUs created on %s for job %s/%s", request.id, request.size, controller.address,
                     request.namespace, request.job)
        return controller

    def _waited(self, controller: Controller, partition_id: str, seconds: int) -> tuple[int, dict]:
        """Wait up to `seconds` for the partition (outside the lock): 201 once it is ACTIVE, 202 while its request waits."""
        try:
            state = self._user(controller).wait_once(partition_id, seconds)
        except (Conflict, HardwareFailure):  # its request expired or was cancelled, or its create failed: nothing is left
            with self._lock:
                self.tracker.drop(partition_id)
            raise
        if state.HasField("queued"):
            return 202, _waiting(controller, state.queued)
        if state.status.ready_state == vipuuser_pb2.PS_ERROR:
            failure = HardwareFailure(f"partition {partition_id} is in ERROR: {'; '.join(state.status.errors)}")
            with self._lock:
                self._release_after_failed_create(partition_id, controller, failure)
            raise failure
        if state.status.ready_state != vipuuser_pb2.PS_ACTIVE:  # its machines are being configured
            return 202, {"id": partition_id, "waiting": True, "controller": controller.address,
                         "detail": f"partition {partition_id} is being made on V-IPU controller {controller.address}"}
        return 201, {"id": partition_id, "created": True, "controller": controller.address}

    def _release_after_failed_create(self, partition_id: str, controller: Controller, failure: BaseException) -> None:
        """A create that reached the controller and failed may have left the partition (in ERROR,
        or made after the answer was lost): remove it, and stop tracking it only once it is gone.
        Until then the tracker keeps it, so that the job's finaliser or its next try releases it."""
        try:
            self._user(controller).remove_partition(partition_id, force=True)
        except NotFound:
            if not isinstance(failure, HardwareFailure):  # no answer came: the create may be queued still
                log.warning("partition %s: no answer to its create (%s) and none there yet; still tracked, so that "
                            "the job's next try or its deletion settles it", partition_id, failure)
                return
        except VipuError as error:
            log.warning("partition %s failed to be created (%s) and cannot be removed yet (%s); still tracked, so that "
                        "the job's deletion removes it", partition_id, failure, error.message)
            return
        self.tracker.drop(partition_id)
        log.info("partition %s failed to be created on %s and nothing of it is left: %s", partition_id, controller.address, failure)

    def reset(self, partition_id: str) -> dict:
        _, controller = self._owned(partition_id)
        self._user(controller).reset_partition(partition_id)
        return {"id": partition_id, "reset": True}

    def drains(self, partition_id: str, uid: str = "") -> dict:
        """What the operators' drains say of a tracked partition (of the job of `uid`, if given): a
        line per machine of it being drained (none: none is), for its IPUJob's condition."""
        entry, controller = self._owned(partition_id)
        if uid and entry.uid != uid:  # a job of the same name, deleted: its partition is not this one's
            raise NotFound(f"partition {partition_id} is job {entry.namespace}/{entry.job}'s of uid {entry.uid}, not of uid {uid}")
        status = self._user(controller).partition_status(partition_id)
        return {"id": partition_id, "controller": controller.address, "drains": list(status.drain_notices)}

    def remove(self, partition_id: str) -> dict:
        with self._lock:
            _, controller = self._owned(partition_id)
            with contextlib.suppress(NotFound):  # gone already: forget it all the same
                self._user(controller).remove_partition(partition_id, force=True)
            self.tracker.drop(partition_id)
            log.info("partition %s removed from %s", partition_id, controller.address)
            return {"id": partition_id, "removed": True}

    def _room(self, controller: Controller, size: int = 0):
        """The controller's room in the proxy's cluster (or all its allocations): one call."""
        return self._user(controller).capacity(size, cluster_id=self.cluster_id)

    def usage(self, controller: Controller) -> tuple[int, int]:
        """IPUs in use and free in the controller's allocations."""
        allocations = self._room(controller).allocations
        return sum(a.used_ipus for a in allocations), sum(a.free_ipus for a in allocations)

    def stats(self) -> dict:
        in_use = available = 0
        made: set[str] = set()  # tracked partitions that exist, not requests that wait
        for controller in self.controllers():
            busy, free = self.usage(controller)
            in_use += busy
            available += free
            made |= {p.id for p in self._user(controller).list_partitions()}
        per_namespace: dict[str, int] = {}
        for partition_id, entry in self.tracker.entries().items():
            if partition_id in made:
                per_namespace[entry.namespace] = per_namespace.get(entry.namespace, 0) + entry.size
        report = {namespace: {"used": ipus, "available": available} for namespace, ipus in sorted(per_namespace.items())}
        report["total"] = {"used": in_use, "available": available}
        return report

    def rooms(self, size: int) -> dict[str, int]:
        """How many partitions of `size` fit now on each listed controller, by address: one call each,
        made once for all the nodes of a scheduler's question."""
        rooms = {}
        for controller in self.controllers():
            try:
                rooms[controller.address] = self._room(controller, size).fitting
            except VipuError as error:
                log.warning("cannot ask %s for room: %s", controller.address, error.message)
                rooms[controller.address] = 0
        return rooms

    def node_room(self, labels: dict[str, str], size: int, rooms: dict[str, int]) -> tuple[int, str]:
        """How many partitions of `size` fit now on the controllers whose label a node carries (from
        `rooms`), and if none, why not."""
        mine = [c for c in self.controllers() if c.label_key and labels.get(c.label_key) == c.label_value]
        if not mine:
            return 0, "the node carries no V-IPU controller's label"
        count = sum(rooms.get(c.address, 0) for c in mine)
        return count, "" if count else f"no room for {size} IPUs on {', '.join(c.address for c in mine)}"

    def query(self, size: int) -> dict:
        """As the seed's example answers it: `available` says the question could be answered (a
        valid size, and every controller answered), `numOfPartitions` how many partitions of the
        size fit now, 0 included; `message` says why a question was not answered."""
        if size & (size - 1):
            return {"available": False, "numOfPartitions": 0, "message": f"size must be a power of two, not {size}"}
        count, unanswered = 0, []
        for controller in self.controllers():
            try:
                count += self._room(controller, size).fitting
            except VipuError as error:
                unanswered.append(f"{controller.address}: {error.message}")
        if unanswered:
            return {"available": False, "numOfPartitions": count, "message": f"no answer from {'; '.join(unanswered)}"}
        return {"available": True, "numOfPartitions": count, "message": ""}


def _waiting(controller: Controller, queued: vipuuser_pb2.QueuedRequest) -> dict:
    """The answer for a request that waits in a controller's queue."""
    return {"id": queued.partition_id, "waiting": True, "controller": controller.address, "position": queued.position,
            "detail": f"waiting in the queue of V-IPU controller {controller.address} (number {queued.position}): {queued.reason}"}


IPUS_ANNOTATION = "graphcore.ai/ipus"


def requested_ipus(pod: dict) -> int:
    """The IPUs a pod asks for in its `graphcore.ai/ipus` annotation; 0 when it asks for none."""
    text = str(((pod.get("metadata") or {}).get("annotations") or {}).get(IPUS_ANNOTATION, "")).strip()
    return int(text) if text.isdigit() else 0


AVAILABLE_ANNOTATION = "graphcore.ai/ipus-available"
MASTER_LABELS = {"node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master"}


def advertise(core: client.CoreV1Api, partitions: Partitions, on_master: bool) -> None:
    """Annotate each node that reaches a controller with the IPUs free there (`graphcore.ai/ipus-available`);
    control-plane nodes only when asked to (ipuVisibility.advertiseOnMaster)."""
    free: dict[str, int] = {}
    for node in core.list_node().items:
        metadata = node.metadata
        if metadata is None or metadata.name is None:  # not from the API server, which names every node
            continue
        labels = metadata.labels or {}
        if not on_master and MASTER_LABELS & labels.keys():
            continue
        mine = [c for c in partitions.controllers() if c.label_key and labels.get(c.label_key) == c.label_value]
        if not mine:
            continue
        for controller in mine:
            if controller.address not in free:
                free[controller.address] = partitions.usage(controller)[1]
        value = str(sum(free[c.address] for c in mine))
        if (metadata.annotations or {}).get(AVAILABLE_ANNOTATION) != value:
            core.patch_node(metadata.name, {"metadata": {"annotations": {AVAILABLE_ANNOTATION: value}}})


def create_app(partitions: Partitions, registry: CollectorRegistry | None = None) -> FastAPI:
    """The REST end-points, with Prometheus metrics of them at `/metrics`."""
    app = FastAPI(title="vipu IPU proxy")
    registry = registry or CollectorRegistry()
    requests = Counter("vipu_proxy_requests", "Requests answered, by end-point and HTTP status", ["endpoint", "status"],
                       registry=registry)
    Gauge("vipu_proxy_tracked_partitions", "Partitions in the tracker ConfigMap", registry=registry).set_function(
        lambda: len(partitions.tracker.entries()))
    app.mount("/metrics", make_asgi_app(registry))

    @app.middleware("http")
    async def count(request, call_next):
        response = await call_next(request)
        route = request.scope.get("route")
        requests.labels(getattr(route, "path", "other"), str(response.status_code)).inc()
        return response

    def answer(action):
        try:
            return action()
        except VipuError as error:
            raise HTTPException(status_code=http_status(error), detail=error.message) from None

    @app.post("/controllers/choose")
    def choose_controller(request: JobRequest):
        return answer(lambda: partitions.choose(request))

    @app.post("/partitions")
    def create_partition(request: PartitionRequest):
        status, body = answer(lambda: partitions.create(request))
        return JSONResponse(status_code=status, content=body)

    @app.post("/partitions/{partition_id}/reset")
    def reset_partition(partition_id: str):
        return answer(lambda: partitions.reset(partition_id))

    @app.get("/partitions/{partition_id}/drains")
    def partition_drains(partition_id: str, uid: str = ""):
        return answer(lambda: partitions.drains(partition_id, uid))

    @app.delete("/partitions/{partition_id}")
    def remove_partition(partition_id: str):
        return answer(lambda: partitions.remove(partition_id))

    @app.get("/stats")
    def stats():
        return answer(partitions.stats)

    @app.post("/query")
    def query(request: Query):
        return answer(lambda: partitions.query(request.size))

    @app.post("/scheduler/filter")
    def scheduler_filter(arguments: dict):
        """kube-scheduler's extender filter: pods asking for IPUs only on nodes whose controller has room."""
        size = requested_ipus(arguments.get("Pod") or {})
        nodes = (arguments.get("Nodes") or {}).get("items") or []
        if not size:
            return {"Nodes": {"items": nodes}, "FailedNodes": {}, "Error": ""}
        passing, failed, rooms = [], {}, partitions.rooms(size)
        for node in nodes:
            room, why = partitions.node_room(node["metadata"].get("labels") or {}, size, rooms)
            if room:
                passing.append(node)
            else:
                failed[node["metadata"]["name"]] = why
        return {"Nodes": {"items": passing}, "FailedNodes": failed, "Error": ""}

    @app.post("/scheduler/prioritize")
    def scheduler_prioritize(arguments: dict):
        """Nodes whose controllers have more room for the pod's IPUs score higher (0 to 10)."""
        size = requested_ipus(arguments.get("Pod") or {})
        nodes = (arguments.get("Nodes") or {}).get("items") or []
        per_controller = partitions.rooms(size) if size else {}
        rooms = {n["metadata"]["name"]: partitions.node_room(n["metadata"].get("labels") or {}, size, per_controller)[0]
                 if size else 0 for n in nodes}
        most = max(rooms.values(), default=0) or 1
        return [{"Host": name, "Score": round(10 * room / most)} for name, room in rooms.items()]

    @app.get("/health")
    def health():
        return {"status": "ok"}

    return app


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--vipu-host", default="localhost", show_default=True, envvar="VIPU_SERVER_ADDR",
              help="Host of vipu-server's user end-point, when no controller list is given.")
@click.option("--vipu-port", type=click.IntRange(1, 65535), default=8090, show_default=True, envvar="VIPU_SERVER_PORT")
@click.option("--controllers-configmap", default="", envvar="VIPU_CONTROLLERS_CONFIGMAP",
              help=f"ConfigMap (in --namespace) whose key {CONFIGMAP_KEY} lists the controllers: host:port:key=value,...")
@click.option("--controllers-refresh", type=click.FloatRange(0.1), default=30.0, show_default=True,
              help="Seconds between readings of that ConfigMap.")
@click.option("--vipu-cluster", default="", envvar="VIPU_CLUSTER_NAME", help="Make partitions in this cluster only.")
@click.option("--api-user-id", default="", envvar="VIPU_API_USER_ID", help="User to act as on a secure controller.")
@click.option("--api-access-key", default="", envvar="VIPU_API_ACCESS_KEY")
@click.option("--listen-address", default="0.0.0.0", show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True, envvar="PROXY_PORT")
@click.option("--namespace", default=None, help="Where the tracker and controller ConfigMaps live. Default: the proxy pod's namespace.")
@click.option("--api-timeout", default=50.0, show_default=True, help="Seconds to wait for vipu-server.")
@click.option("--advertise-on-master", is_flag=True, help="Annotate control-plane nodes with free IPUs too.")
@click.option("--accounts", default="", envvar="VIPU_ACCOUNTS", metavar="same|NAMESPACE=ACCOUNT,...",
              help="The vipu account an IPUJob's partition is made on, by the job's namespace: same (the namespace's name), "
                   "or pairs (and *=same or *=ACCOUNT for the rest). Default: none.")
def main(vipu_host, vipu_port, controllers_configmap, controllers_refresh, vipu_cluster, api_user_id, api_access_key,
         listen_address, port, namespace, api_timeout, advertise_on_master, accounts):
    """The V-IPU proxy for the IPUJob operator."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        account_map = AccountMap.parse(accounts, "--accounts")
    except VipuError as bad:
        raise click.BadParameter(bad.message, param_hint="--accounts") from None
    core = client.CoreV1Api(kube.api_client())
    namespace = namespace or kube.namespace_of_this_pod()
    tracker = Tracker(core, namespace)
    known = tracker.entries()
    log.info("tracking %d partition(s) from ConfigMap %s/%s", len(known), tracker.namespace, tracker.name)

    def read_list() -> str | None:
        if not controllers_configmap:
            return None
        try:
            return (core.read_namespaced_config_map(controllers_configmap, namespace).data or {}).get(CONFIGMAP_KEY)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    controllers = ControllerList(read_list, [Controller(vipu_host, vipu_port)], controllers_refresh)

    def connect(controller: Controller) -> UserClient:
        settings = ClientSettings(host=controller.host, port=controller.port, user_id=api_user_id, access_key=api_access_key)
        return UserClient(settings, api_timeout)

    jobs_api = client.CustomObjectsApi(core.api_client)

    def job_alive(job_namespace: str, job: str, uid: str) -> bool:
        try:
            found = typing.cast(dict, jobs_api.get_namespaced_custom_object("graphcore.ai", "v1alpha1", job_namespace, "ipujobs", job))
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return found["metadata"].get("uid") == uid and not found["metadata"].get("deletionTimestamp")

    partitions = Partitions(controllers, connect, tracker, vipu_cluster, job_alive, accounts=account_map)

    def advertising() -> None:
        while True:
            try:
                advertise(core, partitions, advertise_on_master)
            except Exception as error:  # noqa: BLE001 - a controller or the API server away for a moment: next round
                log.warning("cannot advertise IPU availability on nodes: %s", error)
            time.sleep(controllers_refresh)

    threading.Thread(target=advertising, name="advertise", daemon=True).start()
    uvicorn.run(create_app(partitions), host=listen_address, port=port, log_level="warning")
