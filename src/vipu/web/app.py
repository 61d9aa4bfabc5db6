"""The dashboard's pages and its stream of changes (FastAPI).

Pages are rendered here from the viewer's `Source` (Jinja2, autoescaped); one small script of
ours (`static/dashboard.js`) listens to `/events` (server-sent events) and, when a part the page
shows has changed, fetches the page's main block again and swaps it in, so a change appears
without a reload. Forms post to the same origin only; in secure mode every page but the login
needs a session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import zlib
from collections.abc import AsyncIterator
from datetime import UTC
from urllib.parse import parse_qs, quote, urlsplit

from fastapi import FastAPI, Request
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from google.protobuf.timestamp_pb2 import Timestamp
from jinja2 import Environment, PackageLoader, select_autoescape

from vipu import __version__
from vipu.api.convert import account_from_proto, account_uses_from_proto
from vipu.api.protos import admin_pb2, vipuuser_pb2
from vipu.client import PermissionDenied, Unauthenticated, VipuError
from vipu.client.admin import since_time
from vipu.client.retry import http_status
from vipu.model import times
from vipu.model.accounts import AccountLine, account_lines
from vipu.model.ipuof_attributes import ATTACH_KEY_ATTRIBUTE
from vipu.model.times import age_text, utc_text
from vipu.web import cabling, ledger, racks
from vipu.web.sessions import COOKIE, SESSION_SECONDS, Sessions
from vipu.web.sources import PARTS, RETRY_SECONDS, Source

HEARTBEAT_SECONDS = 15.0  # a comment down an idle event stream, so that a closed tab is noticed
THROTTLE_SECONDS = 0.25  # at most this often a page is told to redraw: a burst of changes is one redraw
MAX_FORM_BYTES = 4096
TESTS = ("Sync-Link", "Cabling", "IPU-Link", "Traffic", "GW-Link", "Version", "PFC-settings")
LINK_SPANS = (*((text, text) for text in map(times.duration_text, (3600, 86_400, 7 * 86_400))), ("", "all kept"))  # ?since=
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # not no-referrer: under it a browser sends its forms' Origin as "null"
    "Cache-Control": "no-store",
}


class LoginNeeded(Exception):
    pass


class FormTooLarge(Exception):
    pass


def age(created: Timestamp) -> str:
    """How long ago a protobuf Timestamp was, as a person says it."""
    return age_text(time.time() - created.seconds) if created.seconds else "-"


def create_app(sessions: Sessions, controller: str) -> FastAPI:
    """The dashboard over `sessions`; `controller` names the vipu-server it shows, for the pages."""
    app = FastAPI(title="vipu dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(packages=[("vipu.web", "static")]), name="static")
    # A rack of a thousand machines is half a megabyte of HTML (the event stream is never compressed).
    app.add_middleware(GZipMiddleware, minimum_size=4096, compresslevel=5)
    templates = Environment(loader=PackageLoader("vipu.web"), autoescape=select_autoescape(["html"]), trim_blocks=True,
                            lstrip_blocks=True)
    templates.filters["digest"] = lambda text: f"{zlib.crc32(str(text).encode()):08x}"  # a live region's, to redraw only what changed
    templates.globals.update(version=__version__, controller=controller, secure=sessions.secure, age=age, created_at=created_at,
                             expected_end=expected_end,
                             tests=TESTS, ready_state=racks.ready_state, operation_state=racks.operation_state,
                             routing=routing, shown_attributes=shown_attributes, palette_css=racks.PALETTE_CSS, utc=utc_text)

    @app.middleware("http")
    async def guarded(request: Request, call_next):
        if request.method == "POST" and not _same_origin(request):
            response = Response("refused: a form of another site", status_code=403)
        else:
            response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    @app.exception_handler(LoginNeeded)
    async def to_login(request: Request, _: LoginNeeded):
        return RedirectResponse(f"/login?next={quote(request.url.path)}", status_code=303)

    @app.exception_handler(FormTooLarge)
    async def too_large(request: Request, _: FormTooLarge):
        return Response(f"refused: a form larger than {MAX_FORM_BYTES} bytes", status_code=413)

    def source_of(request: Request) -> Source:
        source = sessions.source(request.cookies.get(COOKIE))
        if source is None:
            raise LoginNeeded()
        return source

    def page(request: Request, name: str, status: int = 200, **values) -> HTMLResponse:
        """The page, or only its main block when the page's script asks for it to redraw."""
        template = templates.get_template(name)
        context = {"request": request, "path": request.url.path, **values}
        if request.headers.get("x-vipu-fragment"):
            return HTMLResponse("".join(template.blocks["main"](template.new_context(context))), status_code=status)
        return HTMLResponse(template.render(context), status_code=status)

    def shown(request: Request, name: str, draw, **values) -> Response:
        """A page drawn from the viewer's source, marked with the source's version before it read
        anything (the page's event stream then tells of any change since); a failure of the API
        becomes a page saying why."""
        source = source_of(request)
        version = source.version
        try:
            return page(request, name, viewer=source.viewer, problem=source.problem, drawn_at=version, **draw(source), **values)
        except Unauthenticated:
            sessions.logout(request.cookies.get(COOKIE))
            raise LoginNeeded() from None
        except VipuError as error:
            return page(request, "error.html", http_status(error), viewer=source.viewer, problem=source.problem, drawn_at=version,
                        message=error.message)

    @app.get("/", response_class=HTMLResponse)
    def rack_page(request: Request, heat: str = ""):
        """The racks; `heat` (temperature or utilisation, for an administrator) colours each IPU by its reading."""
        def draw(source: Source) -> dict:
            drawn = _racks(source)
            kind = heat if heat in racks.HEAT_SCALES and source.viewer.admin else ""
            if kind:
                racks.colour_by_heat(drawn, source.telemetry_or_none() or [], kind)
            _, low, high, form = racks.HEAT_SCALES.get(kind, ("", 0.0, 0.0, "{}"))
            return {"racks": drawn, "tests_report": _tests(source), "bookings": racks.timeline(source.reservations(), time.time()),
                    "timeline_days": racks.TIMELINE_DAYS, "heat": kind,
                    "heat_range": f"blue {form.format(low)} → red {form.format(high)}" if kind else ""}

        return shown(request, "racks.html", draw)

    @app.get("/machines/{agent_id}", response_class=HTMLResponse)
    def machine_page(request: Request, agent_id: str, grep: str = ""):
        """A machine: its state, its IPUs' telemetry now, and its log (the latest lines, those matching `grep`)."""
        def draw(source: Source) -> dict:
            agent = next((a for a in source.agents() if a.id == agent_id), None)
            if agent is None:
                return {"agent": None, "agent_id": agent_id}
            telemetry = next((t for t in source.telemetry_or_none() or [] if t.agent_id == agent_id), None)
            try:
                lines, log_problem = source.machine_log(agent_id, grep), ""
            except VipuError as error:
                lines, log_problem = [], error.message
            return {"agent": agent, "agent_id": agent_id, "telemetry": telemetry, "lines": lines, "log_problem": log_problem,
                    "grep": grep}

        return shown(request, "machine.html", draw)

    @app.get("/partitions", response_class=HTMLResponse)
    def partitions_page(request: Request):
        def draw(source: Source) -> dict:
            partitions = sorted(source.partitions(), key=lambda p: p.id)
            return {"partitions": partitions, "tones": racks.partition_tones(p.id for p in partitions)}

        return shown(request, "partitions.html", draw)

    @app.get("/partitions/{partition_id}", response_class=HTMLResponse)
    def partition_page(request: Request, partition_id: str):
        def draw(source: Source) -> dict:
            partition = next((p for p in source.partitions() if p.id == partition_id), None)
            if partition is None:
                return {"partition": None, "partition_id": partition_id}
            try:
                config, config_problem = source.user.ipuof_config(partition_id), ""
            except VipuError as error:  # not ACTIVE: no usable configuration
                config, config_problem = None, error.message
            shown_racks = _racks(source)
            shown_racks.groups = [g for g in shown_racks.groups if _holds(g, partition_id)]
            try:
                telemetry = source.user.partition_telemetry(partition_id)
            except VipuError:  # a controller that does not collect it: the page goes without
                telemetry = None
            return {"partition": partition, "partition_id": partition_id, "racks": shown_racks, "config": config,
                    "config_problem": config_problem, "telemetry": telemetry,
                    "utilisation_line": racks.utilisation_line(telemetry.history) if telemetry is not None else ""}

        return shown(request, "partition.html", draw)

    @app.get("/cabling", response_class=HTMLResponse)
    def cabling_page(request: Request):
        def draw(source: Source) -> dict:
            if not source.viewer.admin:
                return {"drawings": None}
            unhealthy = source.unhealthy_links()
            wirings = [(cluster, source.cabling(cluster.id)) for cluster in sorted(source.clusters(), key=lambda c: c.id)]
            known = {**unhealthy, **source.links_named(cabling.partners((c for _, w in wirings for c in w.cables), unhealthy))}
            worst_first = sorted(unhealthy.values(), key=lambda link: (-cabling.UNHEALTHY.index(link.health), link.name))
            return {"drawings": [(cluster, wiring, cabling.draw(cluster, wiring, known)) for cluster, wiring in wirings],
                    "unhealthy": worst_first}

        return shown(request, "cabling.html", draw)

    @app.get("/links/{name}", response_class=HTMLResponse)
    def link_page(request: Request, name: str, since: str = ""):
        """A link of the link ledger: its health, cable and events, and its history as charts
        (`since`: a time ago or a date and time, as vipu-admin's --since; empty: all that is kept)."""
        def draw(source: Source) -> dict:
            since_at = since_time(since)
            link = source.link_history(name, since_at)
            return {"link": link, "since_at": since_at, "charts": ledger.charts(ledger.grown(link)), "replaced": ledger.replaced(link)}

        return shown(request, "link.html", draw, link_name=name, since=since, spans=LINK_SPANS)

    @app.get("/accounts", response_class=HTMLResponse)
    def accounts_page(request: Request):
        return shown(request, "accounts.html", lambda source: {"accounts": _accounts_view(source)})

    @app.get("/tests", response_class=HTMLResponse)
    def tests_page(request: Request):
        return shown(request, "tests.html", _tests_view, error="")

    @app.post("/tests")
    async def start_test(request: Request):
        """Start (or stop) a cluster test, then show the page following it; a refusal is shown on the page."""
        form = await _form(request)
        source = source_of(request)
        try:
            if source.admin is None:
                raise PermissionDenied("only administrators run cluster tests")
            if form.get("action") == "stop":
                await asyncio.to_thread(source.admin.stop_cluster_test)
            else:
                chosen = tuple(t for t in TESTS if form.get(f"test-{t}"))
                await asyncio.to_thread(source.admin.test_cluster, form.get("cluster", ""), chosen, False)
        except VipuError as error:
            refused = await asyncio.to_thread(shown, request, "tests.html", _tests_view, error=error.message)
            refused.status_code = http_status(error)
            return refused
        return RedirectResponse("/tests", status_code=303)

    @app.get("/login", response_class=HTMLResponse)
    def login_page(request: Request, next: str = "/"):
        if not sessions.secure:
            return RedirectResponse("/", status_code=303)
        return page(request, "login.html", viewer=None, problem="", next=_local(next), refused="")

    @app.post("/login")
    async def login(request: Request):
        form = await _form(request)
        target = _local(form.get("next", "/"))
        try:
            session_id = await asyncio.to_thread(sessions.login, form.get("user", "").strip(), form.get("key", "").strip(),
                                                 request.client.host if request.client else "")
        except VipuError as error:
            return page(request, "login.html", http_status(error), viewer=None, problem="", next=target, refused=error.message)
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(COOKIE, session_id, max_age=SESSION_SECONDS, httponly=True, secure=True, samesite="strict")
        return response

    @app.post("/logout")
    def logout(request: Request):
        sessions.logout(request.cookies.get(COOKIE))
        response = RedirectResponse("/login" if sessions.secure else "/", status_code=303)
        response.delete_cookie(COOKIE)
        return response

    @app.get("/events")
    async def events(request: Request, since: int = -1):
        session_id = request.cookies.get(COOKIE)
        source = sessions.source(session_id)
        if source is None:
            return Response("log in first", status_code=401)
        return StreamingResponse(_changes(source, since, lambda: sessions.source(session_id) is source), media_type="text/event-stream")

    return app


async def _changes(source: Source, since: int, still_valid) -> AsyncIterator[str]:
    """Server-sent events: `change` with the parts changed, at most every THROTTLE_SECONDS, and
    at once if the source heard of changes after version `since`, that of the page listening;
    while the source is not watching, `change` of every part every RETRY_SECONDS (the page
    polls); `ended` when the session has."""
    loop = asyncio.get_running_loop()
    pending: set[str] = set()  # the parts changed since the page was last told: one set, however many changes
    changed = asyncio.Event()

    def add(parts: set[str]) -> None:
        pending.update(parts)
        changed.set()

    def heard(parts: set[str]) -> None:  # on the watch's thread
        with contextlib.suppress(RuntimeError):  # the server has stopped, and its loop with it
            loop.call_soon_threadsafe(add, parts)

    stop = source.listen(heard)
    if source.version != since:  # changed between the page's drawing and now
        add(set(PARTS))
    try:
        yield f"retry: {int(RETRY_SECONDS * 1000)}\n\n"
        while True:
            yield f"event: state\ndata: {'live' if source.watching else 'polling'}\n\n"
            try:
                await asyncio.wait_for(changed.wait(), HEARTBEAT_SECONDS if source.watching else RETRY_SECONDS)
            except TimeoutError:
                if not source.watching:
                    add(set(PARTS))
            if not still_valid():
                yield "event: ended\ndata: \n\n"
                return
            if not changed.is_set():
                yield ": quiet\n\n"
                continue
            await asyncio.sleep(THROTTLE_SECONDS)  # a burst of changes becomes one redraw
            parts = set(pending)
            pending.clear()
            changed.clear()
            yield f"event: change\ndata: {json.dumps(sorted(parts))}\n\n"
    finally:
        stop()


def _racks(source: Source) -> racks.Racks:
    if source.viewer.admin:
        return racks.pod_racks(source.agents(), source.clusters(), source.partitions())
    return racks.allocation_racks(source.allocations(), source.partitions())


def _holds(group: racks.Group, partition_id: str) -> bool:
    return any(ipu.partition_id == partition_id for machine in group.machines() for ipu in machine.ipus)


def _tests(source: Source) -> admin_pb2.ClusterTestReport | None:
    return source.tests() if source.viewer.admin else None


def _accounts_view(source: Source) -> list[AccountLine] | None:
    accounts = source.accounts()
    if accounts is None:
        return None
    return [line for message in accounts for line in account_lines(account_from_proto(message), account_uses_from_proto(message))]


def _tests_view(source: Source) -> dict:
    if not source.viewer.admin:
        return {"report": None, "clusters": None}
    return {"report": source.tests(), "clusters": sorted(c.id for c in source.clusters())}


def _local(target: str) -> str:
    """Only a path of this site, so that the login cannot be made to send a browser elsewhere."""
    parts = urlsplit(target)
    return target if target.startswith("/") and not target.startswith("//") and not parts.netloc and not parts.scheme else "/"


def _same_origin(request: Request) -> bool:
    """A form posted from a page of this site (the browser says where from; one that says nothing is no browser's form)."""
    origin = request.headers.get("origin")
    return origin is None or urlsplit(origin).netloc == request.headers.get("host", "")


async def _form(request: Request) -> dict[str, str]:
    """The fields of a posted form; FormTooLarge past MAX_FORM_BYTES, as soon as its Content-Length
    says so or its body grows past it (the login is posted by anyone, before any session)."""
    length = request.headers.get("content-length", "0")
    if not length.isdigit() or int(length) > MAX_FORM_BYTES:
        raise FormTooLarge()
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise FormTooLarge()
    return {key: values[-1] for key, values in parse_qs(body.decode(errors="replace")).items()}


def routing(partition: vipuuser_pb2.Partition) -> str:
    return vipuuser_pb2.IpuLinkRoutingType.Name(partition.spec.ipulink_routing_type).removeprefix("IRT_")


def shown_attributes(gcd: vipuuser_pb2.PartitionConfig.Gcd) -> list[tuple[str, str]]:
    """A GCD's IPUoF attributes but its attach key: that opens the partition's IPUs to whoever holds it."""
    return sorted((key, value) for key, value in gcd.attributes.items() if key != ATTACH_KEY_ATTRIBUTE)


def created_at(partition: vipuuser_pb2.Partition) -> str:
    return utc_text(partition.created.seconds)


def expected_end(partition: vipuuser_pb2.Partition) -> str:
    """When a partition is expected to end (its start and expected duration); "-" when unknown."""
    started = partition.created.ToDatetime(tzinfo=UTC) if partition.created.seconds else None
    return utc_text(times.expected_end(started, partition.status.expected_seconds))
