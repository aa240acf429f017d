"""``TokenFuseWSGI``: the same containment for Flask and any WSGI app.

It speaks WSGI and nothing else: the decision, the refusal and the headers come from ``Guard``
(``policy.py``), shared with the ASGI middleware.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from http import HTTPStatus
from typing import TYPE_CHECKING

from .._errors import ConfigurationError, StoreUnavailable
from .._fuse import Fuse
from .identify import Identify
from .policy import Anonymous, Cost, Count, Exclude, Guard, Plan, Refusal, Reply, Tiers, logger
from .report import DECISION_KEY, REPORT_KEY, TOKENS_HEADER, Report, _current, parse_amount
from .request import WsgiRequest

if TYPE_CHECKING:
    from _typeshed import OptExcInfo
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = ["TokenFuseWSGI"]


def _status_line(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Unknown"


def _latin1(value: str) -> str:
    return value.encode("latin-1", "replace").decode("latin-1")


class _GuardedBody:
    """The app's response iterable, unchanged, with the request's ``Report`` in context while
    each chunk is produced; closing it records what was reported."""

    def __init__(self, body: Iterable[bytes], report: Report, plan: Plan) -> None:
        self._body = body
        self._chunks: Iterator[bytes] | None = None
        self._report = report
        self._plan = plan
        self._closed = False

    def __iter__(self) -> _GuardedBody:
        return self

    def __next__(self) -> bytes:
        token = _current.set(self._report)
        try:
            if self._chunks is None:
                self._chunks = iter(self._body)
            return next(self._chunks)
        finally:
            _current.reset(token)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            _record(self._plan, self._report)


def _record(plan: Plan, report: Report) -> None:
    total = report.total
    if total > 0:
        try:
            plan.fuse.record(plan.identity, total)
        except StoreUnavailable:
            logger.warning("tokenfuse: store unavailable, %g tokens not recorded", total)


class TokenFuseWSGI:
    """Contain each caller of a WSGI app (Flask, Django, ...): the options of ``TokenFuse``.

    >>> app.wsgi_app = TokenFuseWSGI(app.wsgi_app)                      # doctest: +SKIP
    >>> app.wsgi_app = TokenFuseWSGI(                                   # doctest: +SKIP
    ...     app.wsgi_app, fuse=inbound_fuse(RedisStore.from_url(url)), exclude=["/health"]
    ... )

    See ``TokenFuse`` for the options; they mean the same here.
    """

    def __init__(
        self,
        app: WSGIApplication,
        *,
        fuse: Fuse | None = None,
        identify: Identify | None = None,
        anonymous: Anonymous = "shared",
        cost: Cost = 1.0,
        tiers: Tiers | None = None,
        count: Count = "calls",
        exclude: Exclude = (),
        shadow: bool = False,
        refusal: Refusal | None = None,
        policy_name: str = "default",
        tokens_header: str = TOKENS_HEADER,
    ) -> None:
        self.app = app
        self.guard = Guard(
            fuse=fuse,
            identify=identify,
            anonymous=anonymous,
            cost=cost,
            tiers=tiers,
            count=count,
            exclude=exclude,
            shadow=shadow,
            refusal=refusal,
            policy_name=policy_name,
        )
        if not self.guard.fuse.has_sync:
            raise ConfigurationError(
                f"TokenFuseWSGI needs a store with a sync face; {self.guard.fuse.store!r} is "
                "async-only (use RedisStore.from_url, or TokenFuse for ASGI apps)"
            )
        self.tokens_header = tokens_header.lower()

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        guard = self.guard
        request = WsgiRequest(environ)
        plan = guard.plan(request)
        if plan is None:
            return self.app(environ, start_response)
        try:
            decision = plan.fuse.admit(
                plan.identity, cost=plan.cost, amount=plan.amount, bucket=plan.bucket
            )
        except StoreUnavailable as exc:
            return self._reply(start_response, guard.unavailable(exc))
        environ[DECISION_KEY] = decision
        outcome = guard.settle(plan, decision, request)
        if outcome.reply is not None:
            return self._reply(start_response, outcome.reply)

        extra = list(outcome.headers)
        tokens_header = self.tokens_header
        report = Report() if guard.count == "tokens" else None

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

        if report is None:
            return self.app(environ, start_with_headers)
        environ[REPORT_KEY] = report
        token = _current.set(report)
        try:
            body = self.app(environ, start_with_headers)
        except BaseException:
            _record(plan, report)
            raise
        finally:
            _current.reset(token)
        return _GuardedBody(body, report, plan)

    @staticmethod
    def _reply(start_response: StartResponse, reply: Reply) -> list[bytes]:
        headers = [(name, _latin1(value)) for name, value in reply.headers]
        if not any(name.lower() == "content-length" for name, _ in headers):
            headers.append(("Content-Length", str(len(reply.body))))
        start_response(_status_line(reply.status), headers)
        return [reply.body]
