"""Who calls the orchestration API: a site administrator, or a tenant.

Without Keystone, callers present the orchestrator's administrator key (`Authorization: Bearer`)
and are site administrators. With Keystone (`vipu-vpod serve --keystone-url`), callers present
an OpenStack token (`X-Auth-Token`); the orchestrator validates it with keystoneauth1 as its own
service user. A token scoped to a project is that tenant (the project's name); one carrying the
site administrators' role on the site's administration project serves every tenant. Validations are remembered for a short while, and
never past the token's own expiry: a revoked token is refused within CACHE_SECONDS. Projects are
tenants only in the one domain the orchestrator is given, where their names are unique.
"""

from __future__ import annotations

import datetime
import threading
import time
from dataclasses import dataclass

from vipu.model.errors import PermissionDenied, Unauthenticated, Unavailable

CACHE_SECONDS = 10.0  # a revoked token is refused at most this long after its revocation
CACHE_ENTRIES = 10_000


@dataclass(frozen=True)
class Caller:
    name: str
    tenant: str | None  # None: a site administrator, who may act for any tenant

    @property
    def admin(self) -> bool:
        return self.tenant is None


SITE_ADMINISTRATOR = Caller("administrator", None)


class KeystoneTokens:
    def __init__(self, auth_url: str, username: str, password: str, project: str, admin_role: str = "admin",
                 admin_project: str = "admin", user_domain: str = "Default", project_domain: str = "Default", timeout: float = 10.0):
        """`username`, `password`, `project`: the orchestrator's service user, which may validate tokens.
        A site administrator holds `admin_role` on `admin_project`; that role elsewhere is a tenant's own."""
        from keystoneauth1 import session
        from keystoneauth1.identity import v3

        self.auth_url = auth_url.rstrip("/")
        self.admin_role, self.admin_project, self.domain = admin_role, admin_project, project_domain
        self.session = session.Session(auth=v3.Password(auth_url=self.auth_url, username=username, password=password,
                                                        project_name=project, user_domain_name=user_domain,
                                                        project_domain_name=project_domain), timeout=timeout)
        self._known: dict[str, tuple[float, Caller]] = {}
        self._lock = threading.Lock()

    def caller(self, token: str) -> Caller:
        now = time.time()
        with self._lock:
            known = self._known.get(token)
        if known is not None and known[0] > now:
            return known[1]
        caller, expires = self._validate(token)
        with self._lock:
            if len(self._known) >= CACHE_ENTRIES:
                self._known = {t: k for t, k in self._known.items() if k[0] > now}
            self._known[token] = (min(now + CACHE_SECONDS, expires), caller)
        return caller

    def _validate(self, token: str) -> tuple[Caller, float]:
        from keystoneauth1 import exceptions

        try:
            answer = self.session.get(f"{self.auth_url}/auth/tokens", headers={"X-Subject-Token": token}, raise_exc=False)
        except exceptions.ClientException as error:
            raise Unavailable(f"cannot reach Keystone at {self.auth_url} to check the token: {error}") from None
        if answer.status_code in (401, 404):
            raise Unauthenticated("the Keystone token is not valid: expired, revoked, or from another Keystone")
        if answer.status_code != 200:
            raise Unavailable(f"Keystone at {self.auth_url} answered {answer.status_code} when asked to check the token")
        try:
            body = answer.json()["token"]
            expires = datetime.datetime.fromisoformat(body["expires_at"].replace("Z", "+00:00")).timestamp()
        except (ValueError, KeyError, TypeError, AttributeError):
            raise Unavailable(f"Keystone at {self.auth_url} answered the token check with something else than a token") from None
        user = body.get("user", {}).get("name", "?")
        project = body.get("project", {}).get("name")
        domain = body.get("project", {}).get("domain", {}).get("name")
        if project and domain != self.domain:  # names are unique within a domain only
            raise PermissionDenied(f"project {project} of domain {domain} is not a tenant of this site (domain {self.domain})")
        if project == self.admin_project and self.admin_role in {role.get("name") for role in body.get("roles", [])}:
            return Caller(user, None), expires
        if not project:
            raise PermissionDenied(f"the token of {user} is not scoped to a project: ask Keystone for a token of the tenant's project")
        return Caller(user, project), expires
