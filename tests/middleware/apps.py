"""The same small tool API on FastAPI, Starlette and Flask, each behind its middleware, driven
through the framework's own test client (Starlette's entered once per app, so the lifespan
scope goes through the middleware too and requests share one event loop).

``closing``: a store whose clients the app closes at shutdown (asyncio ones on the app's loop).

Routes: ``POST /tools/refund``, ``POST /tools/crm``, ``GET /health``, ``GET /stream``
(a streamed body), ``POST /tools/summarize`` (reports tokens in the ``TokenFuse-Tokens``
header, amount from the ``x-spend`` request header), ``POST /tools/report`` (reports them with
``report_tokens``), ``GET /stream-report`` (reports from inside the streamed body).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

# FastAPI resolves endpoint annotations in this module's namespace: import them here.
from fastapi import Request as FastAPIRequest
from fastapi import Response as FastAPIResponse

STREAM_CHUNKS = [b"chunk-%d;" % i for i in range(5)]


@dataclass
class Reply:
    status: int
    headers: Mapping[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        import json

        return json.loads(self.body)


Call = Callable[..., Reply]


def _lifespan(closing: Any) -> Any:
    """Close a store's asyncio client on the app's own loop, at shutdown."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app: Any) -> Any:
        yield
        if closing is not None:
            await closing.aclose()

    return lifespan


def _spend(value: str | None) -> float:
    return float(value or 0)


def fastapi_client(stack: ExitStack, *, closing: Any = None, **options: Any) -> Call:
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse
    from starlette.testclient import TestClient

    from tokenfuse._middleware import TokenFuse, report_tokens

    app = FastAPI(lifespan=_lifespan(closing))

    @app.post("/tools/refund")
    def refund() -> dict[str, str]:
        return {"refund": "ok"}

    @app.post("/tools/crm")
    async def crm() -> dict[str, str]:
        return {"crm": "ok"}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "up"}

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def body() -> Any:
            for chunk in STREAM_CHUNKS:
                yield chunk

        return StreamingResponse(body(), media_type="text/plain")

    @app.post("/tools/summarize")
    async def summarize(request: FastAPIRequest) -> FastAPIResponse:
        spend = request.headers.get("x-spend", "0")
        return FastAPIResponse(
            b"{}", media_type="application/json", headers={"TokenFuse-Tokens": spend}
        )

    @app.post("/tools/report")
    def report(request: FastAPIRequest) -> dict[str, bool]:  # sync: runs in the threadpool
        return {"reported": report_tokens(_spend(request.headers.get("x-spend")))}

    @app.get("/stream-report")
    async def stream_report(request: FastAPIRequest) -> StreamingResponse:
        async def body() -> Any:
            for chunk in STREAM_CHUNKS:
                report_tokens(_spend(request.headers.get("x-spend")))
                yield chunk

        return StreamingResponse(body(), media_type="text/plain")

    app.add_middleware(TokenFuse, **options)
    return _starlette_caller(stack.enter_context(TestClient(app)))


def starlette_client(stack: ExitStack, *, closing: Any = None, **options: Any) -> Call:
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from tokenfuse._middleware import TokenFuse, report_tokens

    async def refund(request: Request) -> Response:
        return JSONResponse({"refund": "ok"})

    async def crm(request: Request) -> Response:
        return JSONResponse({"crm": "ok"})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "up"})

    async def stream(request: Request) -> Response:
        async def body() -> Any:
            for chunk in STREAM_CHUNKS:
                yield chunk

        return StreamingResponse(body(), media_type="text/plain")

    async def summarize(request: Request) -> Response:
        spend = request.headers.get("x-spend", "0")
        return Response(b"{}", media_type="application/json", headers={"TokenFuse-Tokens": spend})

    async def report(request: Request) -> Response:
        return JSONResponse({"reported": report_tokens(_spend(request.headers.get("x-spend")))})

    async def stream_report(request: Request) -> Response:
        async def body() -> Any:
            for chunk in STREAM_CHUNKS:
                report_tokens(_spend(request.headers.get("x-spend")), request=request)
                yield chunk

        return StreamingResponse(body(), media_type="text/plain")

    app = Starlette(
        routes=[
            Route("/tools/refund", refund, methods=["POST"]),
            Route("/tools/crm", crm, methods=["POST"]),
            Route("/health", health),
            Route("/stream", stream),
            Route("/tools/summarize", summarize, methods=["POST"]),
            Route("/tools/report", report, methods=["POST"]),
            Route("/stream-report", stream_report),
        ],
        middleware=[Middleware(TokenFuse, **options)],
        lifespan=_lifespan(closing),
    )
    return _starlette_caller(stack.enter_context(TestClient(app)))


def _starlette_caller(client: Any) -> Call:
    def call(method: str, path: str, headers: Mapping[str, str] | None = None) -> Reply:
        response = client.request(method, path, headers=dict(headers or {}))
        return Reply(
            response.status_code,
            {name.lower(): value for name, value in response.headers.items()},
            response.content,
        )

    return call


def flask_client(stack: ExitStack, *, closing: Any = None, **options: Any) -> Call:
    from flask import Flask, Response, request

    from tokenfuse._middleware import TokenFuseWSGI, report_tokens

    app = Flask(__name__)

    @app.post("/tools/refund")
    def refund() -> dict[str, str]:
        return {"refund": "ok"}

    @app.post("/tools/crm")
    def crm() -> dict[str, str]:
        return {"crm": "ok"}

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "up"}

    @app.get("/stream")
    def stream() -> Response:
        def body() -> Iterator[bytes]:
            yield from STREAM_CHUNKS

        return Response(body(), mimetype="text/plain")

    @app.post("/tools/summarize")
    def summarize() -> Response:
        spend = request.headers.get("x-spend", "0")
        return Response(b"{}", mimetype="application/json", headers={"TokenFuse-Tokens": spend})

    @app.post("/tools/report")
    def report() -> dict[str, bool]:
        return {"reported": report_tokens(_spend(request.headers.get("x-spend")))}

    @app.get("/stream-report")
    def stream_report() -> Response:
        spend = _spend(request.headers.get("x-spend"))

        def body() -> Iterator[bytes]:
            for chunk in STREAM_CHUNKS:
                report_tokens(spend)  # outside Flask's request context: the contextvar finds it
                yield chunk

        return Response(body(), mimetype="text/plain")

    app.wsgi_app = TokenFuseWSGI(app.wsgi_app, **options)  # type: ignore[method-assign]
    if closing is not None:
        stack.callback(closing.close)
    client = app.test_client()

    def call(method: str, path: str, headers: Mapping[str, str] | None = None) -> Reply:
        response = client.open(path, method=method, headers=dict(headers or {}))
        body = response.get_data()
        response.close()
        return Reply(
            response.status_code,
            {name.lower(): value for name, value in response.headers.items()},
            body,
        )

    return call


FRAMEWORKS: dict[str, Callable[..., Call]] = {
    "fastapi": fastapi_client,
    "starlette": starlette_client,
    "flask": flask_client,
}
