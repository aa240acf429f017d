"""The admin ASGI app: a JSON API over a ``Panel`` and one live page on top of it.

Endpoints (every ``/api`` one needs the bearer token, ``auth``):

==========================================  ====================================================
``GET  /``                                  the dashboard page (static; asks for the token)
``GET  /api/info``                          the fuse, its policies, what the page can do
``GET  /api/keys``                          keys, open first: ``state`` (open, near, ok,
                                            idle), ``sort``, ``q``, ``limit``, ``offset``
``GET  /api/keys/{ref}``                    one key: window, per-minute history, events
``POST /api/keys/{ref}/reset``              close it now
``POST /api/keys/{ref}/forgive``            ``Fuse.forgive`` (501 where it does not exist)
``PUT  /api/keys/{ref}/limit``              ``{"limit": "50k/min"}`` (null clears it)
``PUT  /api/keys/{ref}/bucket``             ``{"rate": "10/s", "capacity": 50}`` (null: the
                                            policy's; a missing field stays as it is)
``POST /api/lookup``                        ``{"name": ...}`` or ``{"secret": ...}``: the key id
``GET  /api/events``                        the newest events of the store's log: ``count``
``GET  /api/stream``                        Server-Sent Events: ``keys`` every ``refresh``
                                            seconds, ``fuse`` for each logged event
``GET  /metrics``                           Prometheus, when ``prometheus_client`` is installed
==========================================  ====================================================

``{ref}`` is a key id (or a unique start of one) or a name, read as the CLI reads a ``KEY``
(``tokenfuse.admin.KeyRef``); ``?by=id`` or ``?by=name`` says which when it could be both. A
raw credential is never put in a URL: ``/api/lookup`` takes it in the body.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from importlib import resources
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from .._admin.refs import AmbiguousKey, KeyNotFound, KeyRef
from .._admin.service import NotAvailable
from .._core.velocity import VelocityPolicy
from .._errors import ConfigurationError, StoreUnavailable, TokenFuseError
from .._fuse import Fuse
from .._stores.event_log import LoggedEvent
from .._stores.ops import UNSET
from .auth import Gatekeeper
from .history import MinuteHistory
from .service import SORTS, Listing, Panel

__all__ = ["app"]

T = TypeVar("T")

#: How long one event stream lasts before the page reconnects (bounds a forgotten tab).
STREAM_SECONDS = 600.0
_MAX_BODY = 16_384
_STATIC = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
_PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
_STATUS = {
    ConfigurationError: 400,
    KeyNotFound: 404,
    AmbiguousKey: 409,
    NotAvailable: 501,
    StoreUnavailable: 503,
}


def _static(name: str) -> bytes:
    return (resources.files(__package__) / "static" / name).read_bytes()


class _Guard:
    """ASGI middleware: the gatekeeper's word on every request but the page's own."""

    def __init__(self, app: ASGIApp, keeper: Gatekeeper) -> None:
        self.app = app
        self.keeper = keeper

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _guarded(scope):
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            client, server = scope.get("client"), scope.get("server")
            refusal = self.keeper.refusal(
                headers=headers,
                client=client[0] if client else None,
                server=server[0] if server else None,
                scheme=scope.get("scheme", "http"),
            )
            if refusal is not None:
                status, reason = refusal
                extra = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
                response = JSONResponse({"error": reason}, status, {**_HEADERS, **extra})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _guarded(scope: Scope) -> bool:
    """Everything but the page and its static files: deny by default."""
    path, root = scope["path"], scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return not (path in ("", "/") or path.startswith("/static/"))


class _Api:
    """The handlers: each reads its parameters, asks the ``Panel``, answers JSON."""

    def __init__(self, fuse: Fuse, panel: Panel, refresh: float, stream_seconds: float) -> None:
        self.fuse = fuse
        self.panel = panel
        self.refresh = refresh
        self.stream_seconds = stream_seconds
        self._snapshots: dict[tuple[Any, ...], tuple[float, Listing]] = {}
        self._snapshot_lock = asyncio.Lock()

    async def _call(self, sync: Callable[..., T], *args: Any, **kw: Any) -> T:
        """``Panel`` (and ``Admin`` under it) is sync: run it in a worker thread."""
        return await run_in_threadpool(sync, *args, **kw)

    async def _log(
        self, sync: Callable[..., T], asynchronous: Callable[..., Awaitable[T]], *args: Any
    ) -> T:
        """The event log's asyncio method when the store has that face (a blocking read waits
        on the server, not in a thread), else the sync one in a worker thread."""
        if self.fuse.has_async:
            return await asynchronous(*args)
        return await run_in_threadpool(sync, *args)

    # -- reads ----------------------------------------------------------------------------------

    async def info(self, request: Request) -> Response:
        velocity, bucket = self.fuse.velocity or VelocityPolicy(), self.fuse.bucket
        return _json(
            {
                "fuse": self.fuse.name,
                "store": repr(self.fuse.store),
                "unit": velocity.unit,
                "refresh": self.refresh,
                "forgive": hasattr(self.fuse, "forgive"),
                "sorts": list(SORTS),
                "velocity": {
                    "limit": velocity.limit,
                    "spike_multiple": velocity.spike_multiple,
                    "min_baseline": velocity.min_baseline,
                    "cold_start_limit": velocity.cold_start_limit,
                    "cooldown": velocity.cooldown,
                },
                "bucket": None
                if bucket is None
                else {"rate": bucket.rate, "capacity": bucket.capacity},
            }
        )

    def _listing_options(self, request: Request) -> dict[str, Any]:
        query = request.query_params
        return {
            "state": query.get("state", "all"),
            "sort": query.get("sort", "state"),
            "search": query.get("q", "")[:100],
            "limit": min(_integer(query.get("limit"), 50), 500),
            "offset": _integer(query.get("offset"), 0),
        }

    async def keys(self, request: Request) -> Response:
        options = self._listing_options(request)
        listing = await self._call(self.panel.keys, **options)
        return _json(listing.to_json())

    async def detail(self, request: Request) -> Response:
        ref, by = _ref(request)
        detail = await self._call(self.panel.detail, ref, by=by)
        return _json(detail.to_json())

    async def events(self, request: Request) -> Response:
        count = min(_integer(request.query_params.get("count"), 50), 1_000)
        log = self.panel.events
        events = await self._log(log.recent, log.arecent, count)
        return _json({"events": [event.to_json() for event in events]})

    async def lookup(self, request: Request) -> Response:
        ref = _ref_of(await _body(request))
        try:
            detail = await self._call(self.panel.detail, ref)
        except KeyNotFound:
            key_id = ref.identity().key_id if ref.kind != "id" else None
            return _json({"key_id": key_id, "label": None, "exists": False})
        return _json({"key_id": detail.key.key_id, "label": detail.key.label, "exists": True})

    # -- changes --------------------------------------------------------------------------------

    async def _changed(self, key_id: str, what: str) -> Response:
        self._snapshots.clear()  # the next snapshot shows the change
        return _json({"ok": True, "key_id": key_id, "done": what})

    async def reset(self, request: Request) -> Response:
        ref, by = _ref(request)
        view = await self._call(self.panel.reset, ref, by=by)
        return await self._changed(view.key_id, "reset")

    async def forgive(self, request: Request) -> Response:
        ref, by = _ref(request)
        view = await self._call(self.panel.forgive, ref, by=by)
        return await self._changed(view.key_id, "forgive")

    async def limit(self, request: Request) -> Response:
        ref, by = _ref(request)
        body = await _body(request)
        if "limit" not in body:
            raise ConfigurationError('send {"limit": "50k/min"} (null clears the limit)')
        view = await self._call(self.panel.set_limit, ref, _setting(body["limit"]), by=by)
        return await self._changed(view.key_id, "limit")

    async def bucket(self, request: Request) -> Response:
        ref, by = _ref(request)
        body = await _body(request)
        if not {"rate", "capacity"} & body.keys():
            raise ConfigurationError('send {"rate": "10/s", "capacity": 50} (either, or both)')
        rate = _setting(body["rate"]) if "rate" in body else UNSET
        capacity = _setting(body["capacity"]) if "capacity" in body else UNSET
        if isinstance(capacity, str):
            capacity = _float(capacity, "capacity")
        settings = {"rate": rate, "capacity": capacity, "by": by}
        view = await self._call(self.panel.set_bucket, ref, **settings)
        return await self._changed(view.key_id, "bucket")

    # -- the live stream --------------------------------------------------------------------

    async def _snapshot(self, options: dict[str, Any]) -> Listing:
        """A listing shared by every open page asking the same: at most one scan per half
        refresh period, however many pages are open."""
        wanted = tuple(sorted(options.items()))
        loop = asyncio.get_running_loop()
        async with self._snapshot_lock:
            cached = self._snapshots.get(wanted)
            if cached is not None and loop.time() - cached[0] < self.refresh / 2:
                return cached[1]
            listing = await self._call(self.panel.keys, **options)
            if len(self._snapshots) > 32:
                self._snapshots.clear()
            self._snapshots[wanted] = (loop.time(), listing)
            return listing

    async def stream(self, request: Request) -> Response:
        options = {**self._listing_options(request), "limit": 200}
        if "limit" in request.query_params:
            options["limit"] = min(_integer(request.query_params.get("limit"), 200), 500)
        return StreamingResponse(
            self._events(options),
            media_type="text/event-stream",
            headers={**_HEADERS, "X-Accel-Buffering": "no"},
        )

    async def _events(self, options: dict[str, Any]) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        log = self.panel.events
        ends = loop.time() + self.stream_seconds
        recent = await self._log(log.recent, log.arecent, 50)
        last = recent[-1].id if recent else ""
        yield f"retry: {int(self.refresh * 1000)}\n\n"
        for event in recent:
            yield _sse("fuse", event.to_json(), event.id)
        while loop.time() < ends:
            try:
                yield _sse("keys", (await self._snapshot(options)).to_json())
            except StoreUnavailable as exc:
                yield _sse("problem", {"error": str(exc)})
            next_snapshot = loop.time() + self.refresh
            while (wait := next_snapshot - loop.time()) > 0:
                try:
                    new: list[LoggedEvent] = await self._log(log.read, log.aread, last, 100, wait)
                except StoreUnavailable as exc:
                    yield _sse("problem", {"error": str(exc)})
                    await asyncio.sleep(wait)
                    break
                for event in new:
                    last = event.id
                    yield _sse("fuse", event.to_json(), event.id)

    # -- the page -------------------------------------------------------------------------------

    async def page(self, request: Request) -> Response:
        headers = {**_HEADERS, "Content-Security-Policy": _PAGE_POLICY}
        return Response(_static("index.html"), 200, headers, "text/html; charset=utf-8")

    async def asset(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC:
            raise HTTPException(404)
        return Response(_static(name), 200, _HEADERS, _STATIC[name])


def _sse(kind: str, data: object, id: str | None = None) -> str:
    # JSON has no newline of its own once dumped compactly, so one data line carries it.
    head = f"id: {id}\n" if id else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def _json(data: object, status: int = 200) -> JSONResponse:
    return JSONResponse(data, status, _HEADERS)


def _integer(text: str | None, default: int) -> int:
    try:
        return max(int(text), 0) if text is not None else default
    except ValueError:
        raise ConfigurationError(f"not a whole number: {text!r}") from None


def _float(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigurationError(f"{what} must be a number, not {text!r}") from None
    if not math.isfinite(value):
        raise ConfigurationError(f"{what} must be a finite number")
    return value


def _setting(value: object) -> float | str | None:
    """A limit, rate or capacity from JSON: a number, a rate string, or null (or "")."""
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigurationError(f"expected a number, a rate such as '50k/min', or null: {value!r}")
    return value.strip() if isinstance(value, str) else float(value)


def _ref(request: Request) -> tuple[str, Any]:
    by = request.query_params.get("by", "auto")
    if by not in ("auto", "id", "name"):
        raise ConfigurationError("by must be auto, id or name")
    return request.path_params["ref"], by


async def _body(request: Request) -> dict[str, Any]:
    body = await request.body()
    if len(body) > _MAX_BODY:
        raise ConfigurationError("request body too large")
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        raise ConfigurationError("the body must be a JSON object") from None
    if not isinstance(data, dict):
        raise ConfigurationError("the body must be a JSON object")
    return data


def _ref_of(body: dict[str, Any]) -> KeyRef:
    """The key a lookup names: a name, a raw credential (hashed at once, never kept or shown),
    or a key id."""
    for field, make in (("name", KeyRef.name), ("secret", KeyRef.secret), ("id", KeyRef.key_id)):
        value = body.get(field)
        if isinstance(value, str) and value:
            return make(value)
    raise ConfigurationError('send {"name": ...}, {"secret": ...} or {"id": ...}')


async def _error(request: Request, exc: Exception) -> Response:
    status = next((code for kind, code in _STATUS.items() if isinstance(exc, kind)), 500)
    return _json({"error": str(exc), "type": type(exc).__name__}, status)


def app(
    fuse: Fuse,
    *,
    token: str | None = None,
    allow_no_token_on_loopback: bool = False,
    refresh: float = 2.0,
    allowed_origins: Iterable[str] = (),
    stream_seconds: float = STREAM_SECONDS,
) -> ASGIApp:
    """The admin app of ``fuse``: mount it (``Mount("/admin", app(fuse, token=...))``) or
    serve it (``tokenfuse.admin.serve``).

    Args:
        fuse: whose keys to show and steer.
        token: the bearer token every API request must carry (16 characters at least).
        allow_no_token_on_loopback: serve without a token, to loopback clients only.
        refresh: seconds between two key tables pushed to an open page.
        allowed_origins: origins besides the app's own that may call it (a page served
            behind a proxy under another name).
        stream_seconds: how long one event stream lasts before the page reconnects.

    >>> from starlette.routing import Mount                        # doctest: +SKIP
    >>> routes = [Mount("/admin", tokenfuse.admin.app(fuse, token=os.environ["ADMIN_TOKEN"]))]
    """
    keeper = Gatekeeper(
        token,
        allow_no_token_on_loopback=allow_no_token_on_loopback,
        allowed_origins=allowed_origins,
    )
    if not (math.isfinite(refresh) and refresh > 0):
        raise ConfigurationError("refresh must be a positive number of seconds")
    panel = Panel(fuse, history=MinuteHistory())
    api = _Api(fuse, panel, refresh, stream_seconds)
    routes: list[BaseRoute] = [
        Route("/", api.page),
        Route("/static/{name}", api.asset),
        Route("/api/info", api.info),
        Route("/api/keys", api.keys),
        Route("/api/keys/{ref}", api.detail),
        Route("/api/keys/{ref}/reset", api.reset, methods=["POST"]),
        Route("/api/keys/{ref}/forgive", api.forgive, methods=["POST"]),
        Route("/api/keys/{ref}/limit", api.limit, methods=["PUT"]),
        Route("/api/keys/{ref}/bucket", api.bucket, methods=["PUT"]),
        Route("/api/lookup", api.lookup, methods=["POST"]),
        Route("/api/events", api.events),
        Route("/api/stream", api.stream),
    ]
    metrics = _metrics_endpoint()
    if metrics is not None:
        routes.append(Route("/metrics", metrics))
    inner = Starlette(routes=routes, exception_handlers={TokenFuseError: _error})
    return _Guard(inner, keeper)


def _metrics_endpoint() -> Callable[[Request], Awaitable[Response]] | None:
    """``/metrics``: Prometheus' default registry (where tokenfuse's metrics are), when
    ``prometheus_client`` is installed."""
    try:
        import prometheus_client
    except ImportError:
        return None

    async def metrics(request: Request) -> Response:
        body = prometheus_client.generate_latest()
        return Response(body, 200, _HEADERS, prometheus_client.CONTENT_TYPE_LATEST)

    return metrics
