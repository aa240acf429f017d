"""``TokenFuseWSGI`` at the WSGI level: the response iterable and ``start_response``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import Clock
from tokenfuse import Identity, MemoryStore
from tokenfuse._middleware import TokenFuseWSGI, inbound_fuse, report_tokens

ENVIRON = {"REQUEST_METHOD": "POST", "PATH_INFO": "/tools/x", "HTTP_X_API_KEY": "key-wsgi-0001"}
WHO = Identity.secret("key-wsgi-0001")


class Body:
    """A lazy response body that reports tokens per chunk and counts its closes."""

    def __init__(self) -> None:
        self.closed = 0

    def __iter__(self) -> Iterator[bytes]:
        for chunk in (b"a", b"b", b"c"):
            report_tokens(10)
            yield chunk

    def close(self) -> None:
        self.closed += 1


def test_the_body_is_forwarded_lazily_and_recorded_when_closed(clock: Clock) -> None:
    body = Body()
    fuse = inbound_fuse(MemoryStore(clock=clock))
    started: list[tuple[str, list[tuple[str, str]]]] = []

    def app(environ: Any, start_response: Any) -> Body:
        start_response("200 OK", [("Content-Type", "text/plain"), ("TokenFuse-Tokens", "5")])
        return body

    start: Any = lambda status, headers, exc_info=None: started.append((status, headers))  # noqa: E731
    iterable = TokenFuseWSGI(app, fuse=fuse, count="tokens")(dict(ENVIRON), start)

    assert started == [
        (
            "200 OK",
            [
                ("Content-Type", "text/plain"),
                ("RateLimit-Policy", '"default";q=50;w=5'),
                ("RateLimit", '"default";r=49;t=1'),
            ],
        )
    ]
    assert fuse.status(WHO).rate == 0.0  # nothing recorded before the body is done
    assert list(iterable) == [b"a", b"b", b"c"]
    iterable.close()  # type: ignore[attr-defined]
    iterable.close()  # type: ignore[attr-defined]
    assert body.closed == 1
    assert fuse.status(WHO).rate == 35.0  # the header's 5 and 3 x 10 from the body


def test_start_response_exc_info_is_passed_on(clock: Clock) -> None:
    seen: list[object] = []

    def app(environ: Any, start_response: Any) -> list[bytes]:
        try:
            raise ValueError("late failure")
        except ValueError:
            start_response("500 Internal Server Error", [], sys.exc_info())
        return [b"oops"]

    start: Any = lambda status, headers, exc_info=None: seen.append(exc_info)  # noqa: E731
    TokenFuseWSGI(app, fuse=inbound_fuse(MemoryStore(clock=clock)))(dict(ENVIRON), start)

    [exc_info] = seen
    assert isinstance(exc_info, tuple)
    assert exc_info[0] is ValueError


def test_an_app_that_raises_still_records_what_it_reported(clock: Clock) -> None:
    fuse = inbound_fuse(MemoryStore(clock=clock))

    def app(environ: Any, start_response: Any) -> list[bytes]:
        report_tokens(17, request=environ)
        raise RuntimeError("handler bug")

    never_called: Any = None  # the app raises before it starts a response
    with pytest.raises(RuntimeError, match="handler bug"):
        TokenFuseWSGI(app, fuse=fuse, count="tokens")(dict(ENVIRON), never_called)

    assert fuse.status(WHO).rate == 17.0


def test_refusals_are_complete_wsgi_responses(clock: Clock) -> None:
    from tokenfuse import BucketPolicy

    fuse = inbound_fuse(MemoryStore(clock=clock), bucket=BucketPolicy(rate=1, capacity=1))
    middleware = TokenFuseWSGI(lambda environ, start_response: [b"ok"], fuse=fuse)
    started: list[tuple[str, list[tuple[str, str]]]] = []

    def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        started.append((status, headers))

    middleware(dict(ENVIRON), start)
    body = b"".join(middleware(dict(ENVIRON), start))

    status, headers = started[-1]
    assert status == "429 Too Many Requests"
    assert dict(headers)["Content-Length"] == str(len(body))
    assert dict(headers)["Retry-After"] == "1"
    assert body.startswith(b'{"type":"quota_exhausted"')
