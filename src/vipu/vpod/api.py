"""The orchestration REST API (FastAPI; its OpenAPI document is served at /openapi.json).

Callers present a Keystone token (`X-Auth-Token`, when the orchestrator has Keystone: see
`vipu.vpod.identity`) or `Authorization: Bearer KEY`, the orchestrator's administrator key made
by `vipu-vpod init` (checked against a salted scrypt hash, in constant time). A tenant sees,
creates and releases only its own vPODs; another tenant's looks like one that does not exist.
Every refusal is one JSON line, `{"error": "..."}`, with the HTTP status
`vipu.client.retry.http_status` gives its family.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from vipu.client.retry import http_status
from vipu.model.errors import NotFound, PermissionDenied, Unauthenticated, VipuError
from vipu.store.vpods import SiteMachine, Vpod
from vipu.vpod.identity import SITE_ADMINISTRATOR, Caller, KeystoneTokens
from vipu.vpod.orchestrator import Credentials, Orchestrator

SCRYPT = {"n": 2**14, "r": 8, "p": 1, "dklen": 32}
ADMIN_KEY_SETTING = "admin_key"


def hash_key(key: str) -> str:
    salt = secrets.token_bytes(16)
    return f"{base64.b64encode(salt).decode()}:{base64.b64encode(hashlib.scrypt(key.encode(), salt=salt, **SCRYPT)).decode()}"


def key_matches(key: str, stored: str) -> bool:
    salt, digest = (base64.b64decode(part) for part in stored.split(":"))
    return hmac.compare_digest(hashlib.scrypt(key.encode(), salt=salt, **SCRYPT), digest)


class CreateVpod(BaseModel):
    tenant: str = Field(description="The tenant (a Keystone project when Keystone is the identity).")
    machines: int = Field(ge=1, le=4096, description="IPU-Machines, consecutive in a rack, 4 IPUs each.")
    topology: str = Field("mesh", description="mesh or torus: how each IPU-Link domain is cabled.")
    ilds: int = Field(1, ge=1, description="IPU-Link domains.")
    user: str = Field("", description="The tenant's first user; the tenant's name if empty.")


def vpod_document(vpod: Vpod) -> dict:
    user_port, admin_port, metrics_port = vpod.ports
    return {"id": vpod.id, "tenant": vpod.tenant, "state": vpod.state, "step": vpod.step, "machines": vpod.machines,
            "topology": vpod.topology, "ilds": vpod.ilds, "user": vpod.user_id, "user_port": user_port, "admin_port": admin_port,
            "metrics_port": metrics_port, "error": vpod.error, "created_at": vpod.created_at, "released_at": vpod.released_at}


def credentials_document(credentials: Credentials) -> dict:
    return {"user": credentials.user_id, "access_key": credentials.access_key, "host": credentials.host,
            "port": credentials.port, "admin_port": credentials.admin_port, "server_ca": credentials.server_ca.decode(),
            "client_cert": credentials.client_cert.decode(), "client_key": credentials.client_key.decode()}


class RepairedMachines(BaseModel):
    machines: list[str] = Field(min_length=1, description="Machines held back by a failed release test, repaired since.")


def machine_document(machine: SiteMachine) -> dict:
    return {"name": machine.name, "position": machine.position, "host": machine.host, "port": machine.port,
            "vpod": machine.vpod_id, "held_back": machine.held_back}


def make_app(orchestrator: Orchestrator, tokens: KeystoneTokens | None = None) -> FastAPI:
    app = FastAPI(title="vipu-vpod", description="Tenant vPODs of an IPU site: a controller per tenant, machines handed over safely.")
    stored_key = orchestrator.store.setting(ADMIN_KEY_SETTING)
    asked = "a Keystone token (X-Auth-Token) or " if tokens is not None else ""

    def caller_of(request: Request) -> Caller:
        token = request.headers.get("x-auth-token", "")
        if token and tokens is not None:
            return tokens.caller(token)
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and key and stored_key is not None and key_matches(key.strip(), stored_key):
            return SITE_ADMINISTRATOR
        raise Unauthenticated(f"give {asked}the orchestrator's administrator key (Authorization: Bearer KEY)")

    def refusal(error: VipuError) -> JSONResponse:
        return JSONResponse(status_code=http_status(error), content={"error": error.message})

    @app.exception_handler(VipuError)
    def refused(request: Request, error: VipuError) -> JSONResponse:
        return refusal(error)

    @app.middleware("http")
    async def authenticate(request: Request, call_next):
        if request.url.path in ("/openapi.json", "/docs"):
            return await call_next(request)
        try:  # scrypt or a call to Keystone: off the event loop
            request.state.caller = await run_in_threadpool(caller_of, request)
        except VipuError as error:
            return refusal(error)
        return await call_next(request)

    def visible(request: Request, vpod_id: str) -> Vpod:
        """The vPOD, if the caller may see it: another tenant's looks like one that does not exist."""
        caller: Caller = request.state.caller
        vpod = orchestrator.store.get(vpod_id)
        if not caller.admin and vpod.tenant != caller.tenant:
            raise NotFound(f"vPOD {vpod_id} does not exist")
        return vpod

    @app.post("/v1/vpods", status_code=201)
    def create_vpod(request: Request, body: CreateVpod) -> dict:
        caller: Caller = request.state.caller
        if not caller.admin and body.tenant != caller.tenant:
            raise PermissionDenied(f"a token of project {caller.tenant} makes vPODs of tenant {caller.tenant} only, not {body.tenant}")
        vpod, credentials = orchestrator.create(body.tenant, body.machines, body.topology, body.ilds, body.user)
        return {"vpod": vpod_document(vpod), "credentials": credentials_document(credentials)}

    @app.get("/v1/vpods")
    def list_vpods(request: Request, tenant: str | None = None) -> dict:
        caller: Caller = request.state.caller
        if not caller.admin:
            tenant = caller.tenant
        return {"vpods": [vpod_document(v) for v in orchestrator.store.list(tenant)]}

    @app.get("/v1/vpods/{vpod_id}")
    def get_vpod(request: Request, vpod_id: str) -> dict:
        return {"vpod": vpod_document(visible(request, vpod_id))}

    @app.get("/v1/vpods/{vpod_id}/credentials")
    def get_credentials(request: Request, vpod_id: str) -> dict:
        return {"credentials": credentials_document(orchestrator.credentials(visible(request, vpod_id).id))}

    @app.delete("/v1/vpods/{vpod_id}")
    def release_vpod(request: Request, vpod_id: str) -> dict:
        return {"vpod": vpod_document(orchestrator.release(visible(request, vpod_id).id))}

    def administrator(request: Request) -> None:
        if not request.state.caller.admin:
            raise PermissionDenied("the site's machines are for its administrators")

    @app.get("/v1/machines")
    def list_machines(request: Request) -> dict:
        administrator(request)
        return {"machines": [machine_document(m) for m in orchestrator.store.machines()]}

    @app.post("/v1/machines/repaired")
    def repaired_machines(request: Request, body: RepairedMachines) -> dict:
        """Machines held back by a failed release test go back to the pool."""
        administrator(request)
        orchestrator.store.repaired(body.machines)
        return {"machines": [machine_document(m) for m in orchestrator.store.machines()]}

    return app
