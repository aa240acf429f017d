"""`reader_for_response`: the one entry an HTTP client calls, with a `ResponseHead`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import pytest

from tokenfuse._usage import (
    ExtractorRegistry,
    ResponseHead,
    ResponseInfo,
    ShapeExtractor,
    Usage,
    UsageReader,
    UsageShape,
    reader_for_response,
)

from .samples import BODIES, JSON, OPENAI_CHAT, STREAMS, Sample, dumps

SAMPLES = {**{f"body-{k}": v for k, v in BODIES.items()}, **STREAMS}


def head_of(sample: Sample, *, status: int = 200, method: str = "POST") -> ResponseHead:
    """What a client hands over: lower-case response header names, the path as sent."""
    parts = urlsplit(sample.url)
    headers = {name.lower(): value for name, value in sample.headers.items()}
    headers["content-type"] = sample.content_type
    return ResponseHead(
        method=method,
        url=sample.url,
        host=(parts.hostname or "").lower(),
        path=parts.path,
        status_code=status,
        request_headers={"Accept-Encoding": "gzip"},
        response_headers=headers,
    )


def usage_of(reader: UsageReader | None, body: bytes) -> Usage | None:
    if reader is None:
        return None
    reader.feed(body)
    return reader.finish(complete=True)


def by_parts(head: ResponseHead, registry: ExtractorRegistry) -> UsageReader | None:
    return registry.reader_for(
        method=head.method,
        url=str(head.url),
        status_code=head.status_code,
        request_headers=head.request_headers,
        response_headers=head.response_headers,
    )


def acme_registry() -> ExtractorRegistry:
    registry = ExtractorRegistry()
    shape = UsageShape(containers=(("meta", "tokens"),), input=("in",), output=("out",))
    registry.register(ShapeExtractor(shape, provider="acme", host="acme.internal"))
    return registry


@pytest.mark.parametrize("registry", [ExtractorRegistry(), acme_registry()], ids=["plain", "acme"])
@pytest.mark.parametrize(("status", "method"), [(200, "POST"), (500, "POST"), (200, "GET")])
@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_a_head_reads_as_the_parts_of_the_same_response(
    name: str, status: int, method: str, registry: ExtractorRegistry
) -> None:
    sample = SAMPLES[name]
    head = head_of(sample, status=status, method=method)
    usage = usage_of(reader_for_response(head, registry), sample.body)
    assert usage == usage_of(by_parts(head, registry), sample.body)
    if (status, method) == (200, "POST"):
        assert usage is not None
        assert (usage.total, usage.provider) == (sample.total, sample.provider)


def test_the_docstring_example() -> None:
    head = ResponseHead(
        method="POST",
        url="https://api.openai.com/v1/chat/completions",
        host="api.openai.com",
        path="/v1/chat/completions",
        status_code=200,
        request_headers={},
        response_headers={"content-type": "application/json"},
    )
    body = b'{"usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}'
    assert usage_of(reader_for_response(head), body) == Usage(7.0, 3.0, 4.0, "openai")


def test_extractors_see_the_head_normalised_as_a_response_info() -> None:
    seen: list[ResponseInfo] = []

    class Spy:
        def reader_for(self, info: ResponseInfo) -> UsageReader | None:
            seen.append(info)
            return None

    registry = ExtractorRegistry()
    registry.register(Spy())
    url = "https://API.openai.com:443/v1/chat/completions?api-version=1"
    head = ResponseHead(
        method="POST",
        url=url,
        host="api.openai.com",
        path="/v1/chat/completions",
        status_code=200,
        request_headers={"X-Trace": "7"},
        response_headers={"content-type": JSON},
        estimate=True,
    )
    assert usage_of(reader_for_response(head, registry), OPENAI_CHAT.body) is not None
    [info] = seen
    assert info == ResponseInfo(
        method="POST",
        url=url,
        host="api.openai.com",
        path="/v1/chat/completions",
        query="api-version=1",
        status_code=200,
        request_headers={"x-trace": "7"},
        response_headers={"content-type": JSON},
        estimate=True,
    )


class Asked(ExtractorRegistry):
    """A registry that overrides `reader_for`: it is asked through it."""

    def __init__(self, answer: UsageReader | None = None, error: Exception | None = None) -> None:
        super().__init__()
        self.answer, self.error = answer, error
        self.calls: list[dict[str, Any]] = []

    def reader_for(self, **parts: Any) -> UsageReader | None:  # type: ignore[override]
        self.calls.append(parts)
        if self.error is not None:
            raise self.error
        return self.answer


class Failing:
    def feed(self, chunk: bytes) -> None:
        raise RuntimeError("feed bug")

    def finish(self, *, complete: bool) -> Usage:
        raise RuntimeError("finish bug")


def test_a_registry_overriding_reader_for_is_asked_with_the_parts() -> None:
    registry = Asked(answer=None)
    head = head_of(STREAMS["anthropic"])
    assert reader_for_response(head, registry) is None
    [parts] = registry.calls
    headers: Mapping[str, str] = parts.pop("response_headers")
    assert parts == {
        "method": "POST",
        "url": STREAMS["anthropic"].url,
        "status_code": 200,
        "request_headers": {"Accept-Encoding": "gzip"},
        "estimate": False,
    }
    assert headers["Content-Type"] == headers["content-type"] == STREAMS["anthropic"].content_type
    assert dict(headers) == head.response_headers


def test_the_reader_of_an_overriding_registry_is_guarded() -> None:
    usage = usage_of(reader_for_response(head_of(OPENAI_CHAT), Asked(Failing())), b"{}")
    assert usage == Usage.unknown("custom", "custom usage reader failed")


def test_the_failure_of_an_overriding_registry_is_the_callers_to_contain() -> None:
    with pytest.raises(LookupError):
        reader_for_response(head_of(OPENAI_CHAT), Asked(error=LookupError("registry bug")))


def test_any_object_with_reader_for_is_asked_too() -> None:
    class Nine:
        def feed(self, chunk: bytes) -> None:
            pass

        def finish(self, *, complete: bool) -> Usage:
            return Usage(total=9.0, provider="nine")

    class Registry:
        def reader_for(self, **parts: Any) -> UsageReader | None:
            return Nine() if parts["method"] == "POST" else None

    registry: Any = Registry()
    assert usage_of(reader_for_response(head_of(OPENAI_CHAT), registry), dumps({})) == Usage(
        total=9.0, provider="nine"
    )
    assert reader_for_response(head_of(OPENAI_CHAT, method="GET"), registry) is None


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_responses_of_one_kind_read_at_once_share_nothing(name: str) -> None:
    # The built-ins work out how a kind of response is read once, then make a fresh reader
    # for each response: two of them read byte by byte, interleaved, each count their own.
    sample = STREAMS[name]
    head = head_of(sample)
    first, second = reader_for_response(head), reader_for_response(head)
    assert first is not None and second is not None
    half = len(sample.body) // 2
    for at in range(len(sample.body)):
        first.feed(sample.body[at : at + 1])
        if at < half:
            second.feed(sample.body[at : at + 1])
    whole, cut = first.finish(complete=True), second.finish(complete=False)
    assert (whole.total, whole.provider) == (sample.total, sample.provider)
    assert cut.partial or cut.total is None
