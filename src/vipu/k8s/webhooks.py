"""`vipu-ipu-webhook`: the IPUJob admission webhooks, served over TLS.

- Mutating (`mipujob.graphcore.ai`, `/mutate-graphcore-ai-v1alpha1-ipujob`): fills in the
  defaults a job may leave out, so what is stored says what will run.
- Validating (`vipujob.graphcore.ai`, `/validate-graphcore-ai-v1alpha1-ipujob`): refuses a job the
  operator could not run, with the operator's own reason (`jobs.parse`), so `kubectl apply` says
  what is wrong instead of the job failing later.
"""

from __future__ import annotations

import base64
import json
import logging

import click
import uvicorn
from fastapi import FastAPI, Request

from vipu.k8s import jobs
from vipu.model.errors import InvalidArgument

log = logging.getLogger("vipu.k8s.webhooks")

MUTATE_PATH = "/mutate-graphcore-ai-v1alpha1-ipujob"
VALIDATE_PATH = "/validate-graphcore-ai-v1alpha1-ipujob"
DEFAULTS = (
    (("workers", "replicas"), 1),
    (("numGcds",), 1),
    (("restartPolicy", "type"), "Never"),
    (("restartPolicy", "backOffLimit"), jobs.DEFAULT_BACKOFF_LIMIT),
    (("cleanPodPolicy",), "None"),
)


def _pointer(path: tuple[str, ...]) -> str:
    return "/spec/" + "/".join(part.replace("~", "~0").replace("/", "~1") for part in path)


def default_patch(spec: dict) -> list[dict]:
    """JSON Patch operations storing the backoff limit in the seed's spelling (`backOffLimit`, where
    vipu's first one, `backoffLimit`, was given alone) and adding each missing default (and any object
    that is to hold it)."""
    spec = json.loads(json.dumps(spec))
    operations: list[dict] = []
    restart = spec.get("restartPolicy")
    seeds, vipus = jobs.BACKOFF_LIMITS
    if isinstance(restart, dict) and vipus in restart:
        if restart.get(seeds) == restart[vipus]:  # the same limit twice is stored once
            operations.append({"op": "remove", "path": _pointer(("restartPolicy", vipus))})
        elif seeds not in restart:  # two that differ stay for the validating webhook to refuse
            operations.append({"op": "move", "from": _pointer(("restartPolicy", vipus)), "path": _pointer(("restartPolicy", seeds))})
            restart[seeds] = restart[vipus]
    for path, value in DEFAULTS:
        node = spec
        for depth, part in enumerate(path[:-1]):
            if part not in node:
                operations.append({"op": "add", "path": _pointer(path[:depth + 1]), "value": {}})
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):  # not an object: validation refuses it
                break
        else:
            if path[-1] not in node:
                operations.append({"op": "add", "path": _pointer(path), "value": value})
                node[path[-1]] = value
    return operations


def _review(body: dict, allowed: bool, message: str = "", patch: list[dict] | None = None) -> dict:
    response = {"uid": body["request"]["uid"], "allowed": allowed}
    if message:
        response["status"] = {"code": 200 if allowed else 422, "message": message}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": body.get("apiVersion", "admission.k8s.io/v1"), "kind": "AdmissionReview", "response": response}


def mutate(body: dict) -> dict:
    spec = body["request"]["object"].get("spec")
    return _review(body, True, patch=default_patch(spec) if isinstance(spec, dict) else None)


def validate(body: dict) -> dict:
    request = body["request"]
    if request.get("operation") == "DELETE":
        return _review(body, True)
    job = request["object"]
    try:
        jobs.parse(job)
    except InvalidArgument as error:
        name = (job.get("metadata") or {}).get("name") or "(unnamed)"
        log.info("refused IPUJob %s/%s: %s", request.get("namespace", ""), name, error.message)
        return _review(body, False, f"IPUJob {name}: {error.message}")
    return _review(body, True)


def create_app() -> FastAPI:
    app = FastAPI(title="vipu IPUJob admission webhooks")

    @app.post(MUTATE_PATH)
    async def mutating(request: Request):
        return mutate(await request.json())

    @app.post(VALIDATE_PATH)
    async def validating(request: Request):
        return validate(await request.json())

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok"}

    return app


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--listen-address", default="0.0.0.0", show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), default=8443, show_default=True)
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), required=True, help="The server certificate (PEM).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), required=True, help="Its private key (PEM).")
def main(listen_address, port, tls_cert, tls_key):
    """The IPUJob admission webhooks."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(), host=listen_address, port=port, ssl_certfile=tls_cert, ssl_keyfile=tls_key, log_level="warning")
