"""The orchestration REST API (FastAPI; its OpenAPI document is served at /openapi.json).

Callers present a Keystone token (`X-Auth-Token`, when the orchestrator has Keystone: see
`vipu.vpod.identity`) or `Authorization: Bearer KEY`, the orchestrator's administrator key made
by `vipu-vpod init` (checked against a salted scrypt hash, in constant time). A tenant sees,
creates and releases only its own vPODs; another tenant's looks like one that does not exist.
Every refusal is one JSON line, `{"error": "..."}`, with the HTTP status
`vipu.client.retry.http_status` gives its family. The document names both: each route's reply
and error models, and the security schemes (KeystoneToken, AdminKey) its routes accept.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
from typing import Literal

import uvicorn
from fastapi import Depends, FastAPI, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from vipu.api.status import RateLimitedLog
from vipu.client.retry import http_status
from vipu.model.entities import shown
from vipu.model.errors import NotFound, PermissionDenied, Unauthenticated, VipuError
from vipu.model.throttle import LoginThrottle
from vipu.vpod.identity import SITE_ADMINISTRATOR, Caller, KeystoneTokens
from vipu.vpod.orchestrator import Credentials, Orchestrator, internal_error
from vipu.vpod.store import SiteMachine, Vpod
from vipu.vpod.tenants import VmRequest

log = logging.getLogger(__name__)

SCRYPT = {"n": 2**14, "r": 8, "p": 1, "dklen": 32}
ADMIN_KEY_SETTING = "admin_key"
ADMINISTRATOR = "administrator"  # whom the administrator key's failures are counted against, by address and key tried


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


class RepairedMachines(BaseModel):
    machines: list[str] = Field(min_length=1, description="Machines held back by a failed release test, repaired since.")


class ErrorReply(BaseModel):
    """Every refusal and failure: one line saying why."""

    error: str = Field(description="Why, in one line.")


class VpodView(BaseModel):
    """A vPOD: its machines, where its controller listens, and how far its creation or release went."""

    id: str
    tenant: str
    state: Literal["Creating", "Active", "Releasing", "Released", "Failed"] = Field(
        description="Failed: its creation failed, and its machines are being given back (then Released, the reason kept).")
    step: str = Field(description="The last step done of its creation or release.")
    machines: list[str] = Field(description="In rack order.")
    topology: str
    ilds: int
    user: str = Field(description="The tenant's first user in its controller.")
    user_port: int
    admin_port: int
    metrics_port: int
    error: str = Field(description="Why its creation failed, or why its release stopped; empty otherwise.")
    created_at: float = Field(description="Seconds since the epoch.")
    released_at: float | None = None


class CredentialsView(BaseModel):
    """What the tenant's first user needs to reach their controller (mutual TLS and an access key)."""

    user: str
    access_key: str
    host: str
    port: int = Field(description="The controller's user end-point.")
    admin_port: int
    server_ca: str = Field(description="PEM: the authority the controller's server certificate is checked against.")
    client_cert: str = Field(description="PEM: the user's client certificate.")
    client_key: str = Field(description="PEM: its key.")


class MachineView(BaseModel):
    name: str
    position: int = Field(description="Rack order, 0 first.")
    host: str
    port: int = Field(description="The machine's agent.")
    vpod: str = Field(description="The vPOD holding it; empty when free.")
    held_back: str = Field(description="Why a failed release test keeps it out of the pool; empty when not.")


class CreatedReply(BaseModel):
    vpod: VpodView
    credentials: CredentialsView


class VpodReply(BaseModel):
    vpod: VpodView


class VpodsReply(BaseModel):
    vpods: list[VpodView]


class CreateVm(BaseModel):
    name: str = Field(description="The VM's name within its vPOD.")
    flavor: str = Field(description="A Nova flavor, by name or id.")
    image: str = Field(description="A Glance image (a Poplar image with vipu installed), by name or id.")
    key: str = Field("", description="A Nova key pair of the orchestrator's OpenStack user whose public key may log in.")
    public_key: str = Field("", description="An OpenSSH public key that may log in, given to the VM in its user data "
                                            "(a tenant's own Nova key pairs are its users', which no one else may boot with).")


class VmView(BaseModel):
    """A tenant's Poplar VM: a Nova server on the vPOD's network, its vipu configured for the tenant's controller."""

    name: str
    server_id: str = Field(description="Nova's id of its server.")
    status: str = Field(description="Nova's: ACTIVE once booted.")
    address: str = Field(description="Its address on the vPOD's network.")
    ssh: str = Field(description="How to log in to it.")


class VmReply(BaseModel):
    vm: VmView


class VmsReply(BaseModel):
    vms: list[VmView]


class CredentialsReply(BaseModel):
    credentials: CredentialsView


class MachinesReply(BaseModel):
    machines: list[MachineView]


def vpod_view(vpod: Vpod) -> VpodView:
    user_port, admin_port, metrics_port = vpod.ports
    return VpodView(id=vpod.id, tenant=vpod.tenant, state=vpod.state, step=vpod.step, machines=vpod.machines,  # type: ignore[arg-type]
                    topology=vpod.topology, ilds=vpod.ilds, user=vpod.user_id, user_port=user_port, admin_port=admin_port,
                    metrics_port=metrics_port, error=vpod.error, created_at=vpod.created_at, released_at=vpod.released_at)


def credentials_view(credentials: Credentials) -> CredentialsView:
    return CredentialsView(user=credentials.user_id, access_key=credentials.access_key, host=credentials.host, port=credentials.port,
                           admin_port=credentials.admin_port, server_ca=credentials.server_ca.decode(),
                           client_cert=credentials.client_cert.decode(), client_key=credentials.client_key.decode())


def machine_view(machine: SiteMachine) -> MachineView:
    return MachineView(name=machine.name, position=machine.position, host=machine.host, port=machine.port, vpod=machine.vpod_id,
                       held_back=machine.held_back)


def _errors(**described: str) -> dict[int | str, dict]:
    """The error responses of a route, each an ErrorReply: those every route may give, and `described` (status_NNN=why)."""
    every = {401: "No credentials, or credentials not valid (an unknown key, an expired or revoked token).",
             500: "An internal error of vipu-vpod.",
             503: "The store, or Keystone, cannot be reached; or another operation changed the same vPOD: try again."}
    every.update({int(name.removeprefix("status_")): why for name, why in described.items()})
    return {status: {"model": ErrorReply, "description": why} for status, why in sorted(every.items())}


NOT_VALID = "The request is not well formed: a field missing, of the wrong kind or out of range."

KEYSTONE_TOKEN = APIKeyHeader(name="X-Auth-Token", scheme_name="KeystoneToken", auto_error=False,
                              description="An OpenStack Keystone token: scoped to a tenant's project, it acts for that tenant only; "
                                          "with the site administrators' role on their project, for every tenant.")
ADMIN_KEY = HTTPBearer(scheme_name="AdminKey", auto_error=False,
                       description="The orchestrator's administrator key, made by vipu-vpod init: a site administrator.")


class KeyRefusals:
    """Calls refused for the administrator key: counted by reason in `vipu_vpod_failed_logins_total`
    and logged at a bounded rate (vipu-server's RateLimitedLog)."""

    def __init__(self, registry: CollectorRegistry):
        self.counter = Counter("vipu_vpod_failed_logins", "Calls to vipu-vpod refused for the administrator key, by reason.",
                               ["reason"], registry=registry)
        for reason in ("no key", "wrong key", "locked out"):
            self.counter.labels(reason)
        self.log = RateLimitedLog(logger=log)

    def refused(self, address: str, reason: str) -> None:
        self.counter.labels(reason).inc()
        self.log.warning("a call from %s refused: %s", address or "an unknown address", reason)


def key_tried(given: str) -> str:
    """What a lockout counts a key under: a short digest of the key tried, never the key itself, so
    that guesses are locked out and the right key, which nobody guessing sends, never is."""
    if not given:
        return f"{ADMINISTRATOR} (no key)"
    return f"{ADMINISTRATOR} (key {hashlib.sha256(given.encode()).hexdigest()[:12]})"


def server_config(app: FastAPI, host: str, port: int, trusted_proxies: tuple[str, ...] = (), **options) -> uvicorn.Config:
    """How the API is served: a caller's address is the socket's, or what a proxy the site named
    says (X-Forwarded-For); never a header anyone else may send, loopback included."""
    return uvicorn.Config(app, host=host, port=port, proxy_headers=bool(trusted_proxies),
                          forwarded_allow_ips=list(trusted_proxies) or None, **options)


def make_app(orchestrator: Orchestrator, tokens: KeystoneTokens | None = None, throttle: LoginThrottle | None = None) -> FastAPI:
    """The API. Its OpenAPI document declares the KeystoneToken scheme only when Keystone is the
    identity. `throttle` counts wrong administrator keys by address and key tried, and locks that
    key out from that address (by default 10 within 60 s, for 60 s): the right key from the same
    address still gets in (the address is the caller's: see `server_config`). /metrics, outside
    the document, counts the refusals."""
    app = FastAPI(title="vipu-vpod", description="Tenant vPODs of an IPU site: a controller per tenant, machines handed over safely.")
    stored_key = orchestrator.store.setting(ADMIN_KEY_SETTING)
    decoy = hash_key(secrets.token_urlsafe(16))  # what a call without a key is checked against, so that it costs what a wrong key does
    asked = "a Keystone token (X-Auth-Token) or " if tokens is not None else ""
    throttle = throttle or LoginThrottle()
    registry = CollectorRegistry()
    refusals = KeyRefusals(registry)

    def identify(request: Request, token: str | None, bearer: HTTPAuthorizationCredentials | None) -> Caller:
        """Run in a worker thread (FastAPI's for sync dependencies): scrypt and Keystone stay off the
        event loop. Every refusal for the key costs one scrypt, key or none, but for a locked-out
        address, which costs none."""
        if token and tokens is not None:
            return tokens.caller(token)
        address = request.client.host if request.client else ""
        given = bearer.credentials.strip() if bearer is not None and bearer.credentials else ""
        tried = key_tried(given)
        try:
            throttle.check(address, tried)
        except Unauthenticated:
            refusals.refused(address, "locked out")
            raise
        matches = key_matches(given, stored_key or decoy)
        if matches and given and stored_key is not None:
            throttle.succeeded(address, tried)
            return SITE_ADMINISTRATOR
        refusals.refused(address, "wrong key" if given else "no key")
        for lockout in throttle.failed(address, tried):
            log.warning("%s", lockout)
        raise Unauthenticated(f"give {asked}the orchestrator's administrator key (Authorization: Bearer KEY)")

    def token_or_key(request: Request, token: str | None = Security(KEYSTONE_TOKEN),
                     bearer: HTTPAuthorizationCredentials | None = Security(ADMIN_KEY)) -> Caller:
        return identify(request, token, bearer)

    def key_only(request: Request, bearer: HTTPAuthorizationCredentials | None = Security(ADMIN_KEY)) -> Caller:
        return identify(request, None, bearer)

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        """Counts only (refusals by reason), as vipu-server's metrics end-point: no credentials."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    authenticated = token_or_key if tokens is not None else key_only

    def refusal(error: VipuError) -> JSONResponse:
        return JSONResponse(status_code=http_status(error), content={"error": error.message})

    @app.exception_handler(VipuError)
    def refused(request: Request, error: VipuError) -> JSONResponse:
        return refusal(error)

    @app.exception_handler(RequestValidationError)
    def not_valid(request: Request, error: RequestValidationError) -> JSONResponse:
        reasons = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'body'}: {e.get('msg')}" for e in error.errors())
        return JSONResponse(status_code=422, content={"error": f"the request is not valid: {reasons}"})

    @app.exception_handler(StarletteHTTPException)
    def http_refusal(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(status_code=error.status_code, content={"error": str(error.detail)}, headers=error.headers)

    @app.exception_handler(Exception)
    def failed(request: Request, error: Exception) -> JSONResponse:
        """Starlette raises the error again once this answered, and the server logs it whole."""
        return refusal(internal_error(error))

    def visible(caller: Caller, vpod_id: str) -> Vpod:
        """The vPOD, if the caller may see it: another tenant's looks like one that does not exist."""
        vpod = orchestrator.store.get(vpod_id)
        if not caller.admin and vpod.tenant != caller.tenant:
            raise NotFound(f"vPOD {shown(vpod_id)} does not exist")
        return vpod

    @app.post("/v1/vpods", status_code=201, response_model=CreatedReply, responses=_errors(
        status_400="A tenant, user, topology or shape that is not valid, or that the site's cables cannot form.",
        status_403="A tenant's token asks for another tenant's vPOD.",
        status_409="Not enough free machines side by side, or no free ports for the controller.", status_422=NOT_VALID))
    def create_vpod(body: CreateVpod, caller: Caller = Depends(authenticated)) -> CreatedReply:
        """Create a tenant's vPOD: its own controller, its machines, its first user (steps 1 to 3 of seed 003)."""
        if not caller.admin and body.tenant != caller.tenant:
            raise PermissionDenied(f"a token of project {caller.tenant} makes vPODs of tenant {caller.tenant} only, not {body.tenant}")
        vpod, credentials = orchestrator.create(body.tenant, body.machines, body.topology, body.ilds, body.user)
        return CreatedReply(vpod=vpod_view(vpod), credentials=credentials_view(credentials))

    @app.get("/v1/vpods", response_model=VpodsReply, responses=_errors(status_422=NOT_VALID))
    def list_vpods(tenant: str | None = None, caller: Caller = Depends(authenticated)) -> VpodsReply:
        """The vPODs not released: a tenant's own, or (for an administrator) every tenant's or `tenant`'s."""
        if not caller.admin:
            tenant = caller.tenant
        return VpodsReply(vpods=[vpod_view(v) for v in orchestrator.store.list(tenant)])

    @app.get("/v1/vpods/{vpod_id}", response_model=VpodReply, responses=_errors(
        status_404="No such vPOD, or another tenant's.", status_422=NOT_VALID))
    def get_vpod(vpod_id: str, caller: Caller = Depends(authenticated)) -> VpodReply:
        """One vPOD, released ones too."""
        return VpodReply(vpod=vpod_view(visible(caller, vpod_id)))

    @app.get("/v1/vpods/{vpod_id}/credentials", response_model=CredentialsReply, responses=_errors(
        status_404="No such vPOD, or another tenant's.", status_409="The vPOD is not Active.", status_422=NOT_VALID))
    def get_credentials(vpod_id: str, caller: Caller = Depends(authenticated)) -> CredentialsReply:
        """The tenant's first user's credentials for their controller."""
        return CredentialsReply(credentials=credentials_view(orchestrator.credentials(visible(caller, vpod_id).id)))

    @app.delete("/v1/vpods/{vpod_id}", response_model=VpodReply, responses=_errors(
        status_404="No such vPOD (or released already), or another tenant's.",
        status_409="Another operation on the vPOD did not end in time.", status_422=NOT_VALID))
    def release_vpod(vpod_id: str, caller: Caller = Depends(authenticated)) -> VpodReply:
        """Release a vPOD: its partitions removed, its machines taken back clean, its controller stopped and archived."""
        return VpodReply(vpod=vpod_view(orchestrator.release(visible(caller, vpod_id).id)))

    @app.post("/v1/vpods/{vpod_id}/vms", status_code=201, response_model=VmReply, responses=_errors(
        status_400="A name, flavor, image or key pair that is not valid or not known, or a runner that makes no VMs.",
        status_404="No such vPOD, or another tenant's.",
        status_409="The vPOD is not Active, has a VM of that name, or as many VMs as the site allows a vPOD.",
        status_422=NOT_VALID, status_503="Nova refused or failed the server (a quota, no valid host)."))
    def create_vm(vpod_id: str, body: CreateVm, caller: Caller = Depends(authenticated)) -> VmReply:
        """Boot a Poplar VM on the vPOD's network, on the site's Poplar hosts, given the tenant's vipu
        configuration (steps 4 and 5 of seed 003)."""
        vm = orchestrator.create_vm(visible(caller, vpod_id).id, VmRequest(body.name, body.flavor, body.image, body.key, body.public_key))
        return VmReply(vm=VmView(**vm.__dict__))

    @app.get("/v1/vpods/{vpod_id}/vms", response_model=VmsReply, responses=_errors(
        status_404="No such vPOD, or another tenant's.", status_422=NOT_VALID))
    def list_vms(vpod_id: str, caller: Caller = Depends(authenticated)) -> VmsReply:
        """The vPOD's Poplar VMs."""
        return VmsReply(vms=[VmView(**vm.__dict__) for vm in orchestrator.vms(visible(caller, vpod_id).id)])

    @app.delete("/v1/vpods/{vpod_id}/vms/{name}", response_model=VmReply, responses=_errors(
        status_404="No such vPOD or VM, or another tenant's.", status_422=NOT_VALID))
    def delete_vm(vpod_id: str, name: str, caller: Caller = Depends(authenticated)) -> VmReply:
        """Delete a Poplar VM and wait for it to go (a release deletes them all); the VM as it was."""
        return VmReply(vm=VmView(**orchestrator.delete_vm(visible(caller, vpod_id).id, name).__dict__))

    def administrator(caller: Caller = Depends(authenticated)) -> Caller:
        if not caller.admin:
            raise PermissionDenied("the site's machines are for its administrators")
        return caller

    @app.get("/v1/machines", response_model=MachinesReply, responses=_errors(status_403="The caller is a tenant."))
    def list_machines(caller: Caller = Depends(administrator)) -> MachinesReply:
        """The site's machines in rack order, the vPOD holding each, and those held back."""
        return MachinesReply(machines=[machine_view(m) for m in orchestrator.store.machines()])

    @app.post("/v1/machines/repaired", response_model=MachinesReply, responses=_errors(
        status_403="The caller is a tenant.", status_404="A machine that is not the site's.",
        status_409="A machine in a vPOD, or not held back.", status_422=NOT_VALID))
    def repaired_machines(body: RepairedMachines, caller: Caller = Depends(administrator)) -> MachinesReply:
        """Machines held back by a failed release test go back to the pool."""
        orchestrator.store.repaired(body.machines)
        return MachinesReply(machines=[machine_view(m) for m in orchestrator.store.machines()])

    return app
