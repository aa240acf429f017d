"""Inbound: ``TokenFuseWSGI``, the same containment for Flask and any WSGI app.

It speaks WSGI and nothing else: the options, the decision, the refusal, the headers and the
token report come from ``InboundGuard`` (``guard.py``), shared with the ASGI middleware.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from functools import partial
from http import HTTPStatus
from typing import TYPE_CHECKING

from .._errors import StoreUnavailable
from .guard import Outcome, Plan
from .loops import LoopCall, iterable_closing, read_wsgi_body, status_of
from .reply import Reply, unavailable
from .report import Report, parse_amount
from .request import WsgiRequest
from .run_binding import run_of
from .shell import InboundMiddleware

if TYPE_CHECKING:
    from _typeshed import OptExcInfo
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment
else:
    WSGIApplication = object  # the typeshed stubs exist for type checkers only

__all__ = ["TokenFuseWSGI"]


def _status_line(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Unknown"


def _latin1(value: str) -> str:
    return value.encode("latin-1", "replace").decode("latin-1")


def _send_reply(start_response: StartResponse, reply: Reply) -> list[bytes]:
    headers = [(name, _latin1(value)) for name, value in reply.headers]
    if not any(name.lower() == "content-length" for name, _ in headers):
        headers.append(("Content-Length", str(len(reply.body))))
    start_response(_status_line(reply.status), headers)
    return [reply.body]


class _ReportingBody:
    """The app's response iterable, unchanged, with the request's ``Report`` active while
    each chunk is produced; closing it records what was reported."""

    def __init__(self, body: Iterable[bytes], report: Report, record: Callable[[], None]) -> None:
        self._body = body
        self._chunks: Iterator[bytes] | None = None
        self._report = report
        self._record = record
        self._closed = False

    def __iter__(self) -> _ReportingBody:
        return self

    def __next__(self) -> bytes:
        with self._report.active():
            if self._chunks is None:
                self._chunks = iter(self._body)
            return next(self._chunks)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            self._record()


class TokenFuseWSGI(InboundMiddleware[WSGIApplication]):
    """Contain each caller of a WSGI app (Flask, Django, ...): the options of ``TokenFuse``.

    >>> app.wsgi_app = TokenFuseWSGI(app.wsgi_app)                      # doctest: +SKIP
    >>> app.wsgi_app = TokenFuseWSGI(                                   # doctest: +SKIP
    ...     app.wsgi_app, fuse=inbound_fuse(RedisStore.from_url(url)), exclude=["/health"]
    ... )

    The keyword options are described in ``InboundOptions``; they mean the same here. The
    fuse's store needs a sync face.
    """

    face = "sync"
    otherwise = "TokenFuse for ASGI apps"

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        request = WsgiRequest(environ)
        with run_of(request):  # run budgets: the caller's run, bound for the handler
            return self._guarded(environ, start_response, request)

    def _guarded(
        self, environ: WSGIEnvironment, start_response: StartResponse, request: WsgiRequest
    ) -> Iterable[bytes]:
        plan = self.guard.plan(request)
        if plan is None:
            return self.app(environ, start_response)
        # The failure-loop breaker fingerprints the body (loops.py)
        body = read_wsgi_body(request) if self.guard.loops is not None else None
        try:  # one round trip: the admission and the failure-loop check
            admission = self.guard.admit(plan, request, body)
        except StoreUnavailable as exc:
            return _send_reply(start_response, unavailable(exc))
        outcome = self.guard.settle(plan, admission.decision, request)
        if outcome.reply is not None:
            return _send_reply(start_response, outcome.reply)
        watch, reply = self.guard.check_loops(plan, admission, request)
        if reply is not None:
            return _send_reply(start_response, reply)
        if watch is not None:
            return self._watched(environ, start_response, outcome, plan, watch)
        return self._run(environ, self._with_headers(start_response, outcome), outcome, plan)

    def _run(
        self, environ: WSGIEnvironment, start: StartResponse, outcome: Outcome, plan: Plan
    ) -> Iterable[bytes]:
        report = outcome.report
        if report is None:
            return self.app(environ, start)
        record = partial(self.guard.record, plan, report)
        try:
            with report.active():
                body = self.app(environ, start)
        except BaseException:
            record()
            raise
        return _ReportingBody(body, report, record)

    def _watched(
        self,
        environ: WSGIEnvironment,
        start_response: StartResponse,
        outcome: Outcome,
        plan: Plan,
        watch: LoopCall,
    ) -> Iterable[bytes]:
        """``_run``, noting the response's status for the failure-loop breaker once the
        body is closed (500 when the app raises or never starts a response)."""
        loops = self.guard.loops
        assert loops is not None
        status = [500]
        start = self._with_headers(start_response, outcome)

        def start_noting(
            line: str, headers: list[tuple[str, str]], exc_info: OptExcInfo | None = None
        ) -> Callable[[bytes], object]:
            status[0] = status_of(line)
            return start(line, headers, exc_info)

        def note() -> None:
            loops.note(watch, status[0])

        try:
            body = self._run(environ, start_noting, outcome, plan)
        except BaseException:
            note()
            raise
        return iterable_closing(body, note)

    def _with_headers(self, start_response: StartResponse, outcome: Outcome) -> StartResponse:
        """``start_response``, adding the outcome's headers to the response and taking the
        tokens header out of it (into the report, when counting tokens)."""
        extra = outcome.headers
        tokens_header, report = self.guard.tokens_header, outcome.report

        def start_with_headers(
            status: str, headers: list[tuple[str, str]], exc_info: OptExcInfo | None = None
        ) -> Callable[[bytes], object]:
            kept = []
            for name, value in headers:
                if name.lower() == tokens_header:
                    if report is not None:
                        report.add(parse_amount(value))
                    continue
                kept.append((name, value))
            kept.extend(extra)
            return start_response(status, kept, exc_info)

        return start_with_headers
