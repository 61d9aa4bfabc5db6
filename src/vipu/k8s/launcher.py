"""`vipu-ipujob-init`: the init container of an IPUJob's launcher pod.

It waits until every worker pod of the job is Ready, then has the V-IPU proxy create the job's
partition (or reset it, when the job already owns it from an earlier run). A job that does not
fit yet waits in the controller's queue, first come first served: the proxy answers 202 with its
place and reason after each WAIT_SECONDS, and it asks again at once. When the controller or the
proxy cannot be reached, or a 202 comes back well before WAIT_SECONDS (the controller's places
for waiting calls were all taken, so nobody waited), it backs off before asking again. A request
that can never succeed (a bad size, say) ends it with status 1 and the reason on standard error.
Everything it needs comes from the environment the operator gives it (`jobs.launcher_pod`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping

import click
from kubernetes import client, watch

from vipu.client.retry import RetryPolicy, Verdict, answered_early, verdict_of_http
from vipu.k8s import kube, rest
from vipu.k8s.jobs import JOB_LABEL, ROLE_LABEL

log = logging.getLogger("vipu-ipujob-init")

WAITING = RetryPolicy(attempts=None, first_delay=1.0, longest_delay=30.0)  # while the proxy or the controller is away
WAIT_SECONDS = 20  # how long each call waits in the controller's queue; within the REST call's timeout


def _ready(pod: client.V1Pod) -> bool:
    if pod.metadata is None or pod.metadata.deletion_timestamp is not None or pod.status is None:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def wait_for_workers(core: client.CoreV1Api, namespace: str, job: str, count: int) -> None:
    selector = f"{JOB_LABEL}={job},{ROLE_LABEL}=worker"
    pods = core.list_namespaced_pod(namespace, label_selector=selector)
    ready = {p.metadata.name for p in pods.items if p.metadata is not None and _ready(p)}
    version = pods.metadata.resource_version if pods.metadata is not None else None  # the API server sets it
    while len(ready) < count:
        log.info("%d of %d workers ready", len(ready), count)
        for event in watch.Watch().stream(core.list_namespaced_pod, namespace, label_selector=selector,
                                          resource_version=version, timeout_seconds=60):
            pod = event["object"]
            version = pod.metadata.resource_version
            if event["type"] != "DELETED" and _ready(pod):
                ready.add(pod.metadata.name)
            else:
                ready.discard(pod.metadata.name)
            if len(ready) >= count:
                break
    log.info("all %d workers ready", count)


class Refused(Exception):
    """The proxy will never grant this request."""


def obtain_partition(env: Mapping[str, str]) -> dict:
    """Create or reset the job's partition through the proxy, waiting while the IPUs are taken."""
    body = {"id": env["IPUJOB_PARTITION"], "namespace": env["IPUJOB_NAMESPACE"], "job": env["IPUJOB_NAME"],
            "uid": env["IPUJOB_UID"], "size": int(env["IPUJOB_IPUS"]), "replicas": int(env.get("IPUJOB_MODEL_REPLICAS", "0")),
            "controller": env.get("IPUJOB_CONTROLLER", ""), "wait": WAIT_SECONDS,
            "expected_seconds": int(expected) if (expected := env.get("IPUJOB_EXPECTED_SECONDS", "")).isdigit() else 0,
            "reservation": env.get("IPUJOB_RESERVATION", ""), "gcds": int(env.get("IPUJOB_GCDS", "1"))}
    url = env["VIPU_PROXY_URL"].rstrip("/") + "/partitions"
    delays, said = WAITING.delays(), ""
    while True:
        began = time.monotonic()
        try:
            status, reply = rest.call("POST", url, body)
        except OSError as error:
            status, reply = 503, {"detail": f"the proxy at {url} cannot be reached ({getattr(error, 'reason', error)})"}
        if status in (200, 201):
            return reply
        if verdict_of_http(status) is Verdict.NEVER:  # 404: the job is gone; 422: the hardware failed it
            raise Refused(reply.get("detail", f"HTTP {status}"))
        why = reply.get("detail", f"HTTP {status}")
        if why != said:
            log.info("waiting for partition %s of %d IPUs: %s", body["id"], body["size"], why)
            said = why
        if status == 202:  # it waits in the controller's queue, and keeps its place there
            body["resume"] = True
            if not answered_early(WAIT_SECONDS, time.monotonic() - began):  # the call waited its time: ask again at once
                delays = WAITING.delays()
                continue
        time.sleep(next(delays))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """The IPUJob launcher's init container: waits for the job's workers, then has the V-IPU proxy
    create the job's partition (or reset it, on a restart) and writes its IPUoF configuration.

    It takes no arguments: the operator gives it IPUJOB_NAME, IPUJOB_NAMESPACE, IPUJOB_UID,
    IPUJOB_WORKERS, IPUJOB_PARTITION, IPUJOB_IPUS and VIPU_PROXY_URL in its environment, and
    IPUJOB_EXPECTED_SECONDS, how long the job is expected to run, when it knows; IPUJOB_GCDS, the
    GCDs its partition is split into (1 when not given); IPUJOB_RESERVATION,
    the vipu reservation to make it in, if any."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s vipu-ipujob-init: %(message)s", stream=sys.stderr)
    env = os.environ
    missing = [k for k in ("IPUJOB_NAME", "IPUJOB_NAMESPACE", "IPUJOB_UID", "IPUJOB_WORKERS", "IPUJOB_PARTITION",
                           "IPUJOB_IPUS", "VIPU_PROXY_URL") if not env.get(k)]
    if missing:
        print(f"vipu-ipujob-init: missing from the environment: {', '.join(missing)}", file=sys.stderr)
        sys.exit(2)
    try:
        wait_for_workers(client.CoreV1Api(kube.api_client()), env["IPUJOB_NAMESPACE"], env["IPUJOB_NAME"],
                         int(env["IPUJOB_WORKERS"]))
        reply = obtain_partition(env)
    except Refused as refusal:
        print(f"vipu-ipujob-init (partition {env['IPUJOB_PARTITION']}): failed: {refusal}", file=sys.stderr)
        sys.exit(1)
    verb = "reset" if reply.get("reset") else "created"
    print(f"vipu-ipujob-init: partition {env['IPUJOB_PARTITION']} {verb}", file=sys.stderr)
