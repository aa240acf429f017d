"""The loop step's two header reads (an SDK's retry, an event stream), made from the
library's raw header entries: each must answer as the library's own ``headers.get`` reading
does, whatever the headers hold (repeated, empty, odd bytes, names in any case)."""

from __future__ import annotations

from typing import Any

import httpx
import httpx2
import pytest

from tokenfuse._transport.loop_step import _event_stream, _is_retry

LIBRARIES = [httpx, httpx2]

RETRY_HEADERS: list[list[tuple[bytes, bytes]]] = [
    [],
    [(b"x-stainless-retry-count", b"0")],
    [(b"X-Stainless-Retry-Count", b"0")],
    [(b"x-stainless-retry-count", b"1")],
    [(b"x-stainless-retry-count", b"")],
    [(b"x-stainless-retry-count", b" 0")],
    [(b"x-stainless-retry-count", b"00")],
    [(b"x-stainless-retry-count", b"\xff")],
    [(b"x-stainless-retry-count", b"0"), (b"x-stainless-retry-count", b"0")],
    [(b"x-stainless-retry-count", b""), (b"X-STAINLESS-RETRY-COUNT", b"")],
    [(b"x-stainless-retry-count-2", b"3"), (b"x-stainless-lang", b"python")],
]

CONTENT_TYPES: list[list[tuple[bytes, bytes]]] = [
    [],
    [(b"content-type", b"text/event-stream")],
    [(b"Content-Type", b"text/event-stream; charset=utf-8")],
    [(b"content-type", b"application/json")],
    [(b"content-type", b"TEXT/EVENT-STREAM")],
    [(b"content-type", b"application/json"), (b"content-type", b"text/event-stream")],
    [(b"content-type", b"text/event-\xffstream")],
    [(b"content-type", b"\xfftext/event-stream")],
    [(b"x-content-type", b"text/event-stream")],
]


def _reference_retry(request: Any) -> bool:
    # What the step read through httpx's own look-up before.
    return request.headers.get("x-stainless-retry-count", "0") not in ("", "0")


def _reference_stream(response: Any) -> bool:
    return "text/event-stream" in response.headers.get("content-type", "")


@pytest.mark.parametrize("library", LIBRARIES, ids=lambda m: m.__name__)
@pytest.mark.parametrize("headers", RETRY_HEADERS)
def test_a_retry_is_read_as_the_library_reads_the_header(
    library: Any, headers: list[tuple[bytes, bytes]]
) -> None:
    request = library.Request("POST", "https://api.example/v1/x", headers=headers, content=b"{}")
    assert _is_retry(request) is _reference_retry(request)


@pytest.mark.parametrize("library", LIBRARIES, ids=lambda m: m.__name__)
@pytest.mark.parametrize("headers", CONTENT_TYPES)
def test_an_event_stream_is_read_as_the_library_reads_the_header(
    library: Any, headers: list[tuple[bytes, bytes]]
) -> None:
    response = library.Response(200, headers=headers, content=b"")
    assert _event_stream(response) is _reference_stream(response)


def test_the_reads_answer_what_they_say() -> None:
    # Against the reference alone, both could be wrong the same way: a few answers by hand.
    def request(*headers: tuple[bytes, bytes]) -> Any:
        return httpx.Request("POST", "https://api.example/", headers=list(headers))

    assert not _is_retry(request())
    assert not _is_retry(request((b"X-Stainless-Retry-Count", b"0")))
    assert _is_retry(request((b"x-stainless-retry-count", b"2")))
    assert _is_retry(
        request((b"x-stainless-retry-count", b"0"), (b"x-stainless-retry-count", b"0"))
    )
    event = httpx.Response(200, headers={"Content-Type": "text/event-stream; charset=utf-8"})
    assert _event_stream(event)
    assert not _event_stream(httpx.Response(200, headers={"content-type": "application/json"}))


class _PlainHeaders:
    """Headers of no library's own type: read through ``raw`` (``header_entries``)."""

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.raw = raw


class _Message:
    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.headers = _PlainHeaders(raw)


def test_headers_of_another_type_are_read_through_raw() -> None:
    assert _is_retry(_Message([(b"X-Stainless-Retry-Count", b"1")]))
    assert not _is_retry(_Message([(b"X-Stainless-Retry-Count", b"0")]))
    assert _event_stream(_Message([(b"Content-Type", b"text/event-stream")]))
