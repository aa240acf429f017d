"""Which reader a response gets: routes, count-nothing endpoints, custom extractors."""

from __future__ import annotations

from types import ModuleType

import httpx
import pytest

import tokenfuse._usage as usage_pkg
from tokenfuse._usage import (
    ExtractorRegistry,
    ResponseInfo,
    ShapeExtractor,
    Usage,
    UsageReader,
    UsageShape,
)
from tokenfuse._usage.accumulator import Accumulator
from tokenfuse._usage.readers import INTERNAL_ERROR
from tokenfuse._usage.sse import SseFramer

from .samples import (
    ANTHROPIC,
    ANTHROPIC_MESSAGE,
    BODIES,
    GEMINI,
    JSON,
    OPENAI,
    OPENAI_CHAT,
    SSE,
    STREAMS,
    dumps,
    read,
    reader_for,
)


def test_all_is_complete_and_sorted() -> None:
    public = {
        name
        for name, value in vars(usage_pkg).items()
        if not name.startswith("_") and not isinstance(value, ModuleType) and name != "annotations"
    }
    assert sorted(usage_pkg.__all__) == usage_pkg.__all__
    assert set(usage_pkg.__all__) == public


def finish(reader: UsageReader | None, body: bytes = b"") -> Usage:
    assert reader is not None
    reader.feed(body)
    return reader.finish(complete=True)


@pytest.mark.parametrize(
    ("url", "provider"),
    [
        pytest.param(f"{OPENAI}/v1/responses/input_tokens", "openai", id="openai-input-tokens"),
        pytest.param(f"{ANTHROPIC}/v1/messages/count_tokens", "anthropic", id="anthropic-count"),
        pytest.param(f"{GEMINI}:countTokens", "gemini", id="gemini-count"),
        pytest.param(
            "https://bedrock-runtime.us-east-1.amazonaws.com/model/m/count-tokens",
            "bedrock",
            id="bedrock-count",
        ),
        pytest.param(
            "https://us-east5-aiplatform.googleapis.com/v1/projects/p/locations/us-east5/"
            "publishers/anthropic/models/count-tokens:rawPredict",
            "anthropic",
            id="vertex-anthropic-count",
        ),
    ],
)
def test_count_tokens_endpoints_count_nothing(url: str, provider: str) -> None:
    body = dumps({"input_tokens": 2095, "usage": {"input_tokens": 2095, "total_tokens": 2095}})
    usage = finish(reader_for(url), body)
    assert usage == Usage.nothing(provider)
    assert usage.problem is None


@pytest.mark.parametrize("method", ["GET", "get", "HEAD", "DELETE"])
@pytest.mark.parametrize("name", ["openai-responses", "anthropic-messages", "ollama-chat"])
def test_retrievals_count_nothing(method: str, name: str) -> None:
    # GET /v1/responses/{id} and friends repeat the usage of an earlier call.
    sample = BODIES[name]
    assert finish(reader_for(sample.url, method=method), sample.body).counts_nothing


def test_get_of_a_response_stream_counts_nothing() -> None:
    sample = STREAMS["openai-responses"]
    usage = finish(
        reader_for(f"{OPENAI}/v1/responses/resp_1?stream=true", SSE, method="GET"), sample.body
    )
    assert usage.counts_nothing


ERRORS = {
    "openai-429": dumps(
        {
            "error": {
                "message": "Rate limit reached",
                "type": "requests",
                "param": None,
                "code": "rate_limit_exceeded",
            }
        }
    ),
    "anthropic-529": dumps(
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    ),
    "gemini-400": dumps(
        {"error": {"code": 400, "message": "API key not valid.", "status": "INVALID_ARGUMENT"}}
    ),
    "html-502": b"<html><body>502 Bad Gateway</body></html>",
    "malformed": b'{"error": ',
    "empty": b"",
}


@pytest.mark.parametrize("status", [400, 401, 404, 429, 500, 502, 529])
@pytest.mark.parametrize("body", ERRORS.values(), ids=ERRORS.keys())
@pytest.mark.parametrize("content_type", [JSON, "text/html", None])
def test_error_responses_count_nothing(status: int, body: bytes, content_type: str | None) -> None:
    for url in (OPENAI_CHAT.url, ANTHROPIC_MESSAGE.url, "https://unknown.example/x"):
        usage = finish(reader_for(url, content_type, status=status), body)
        assert usage.counts_nothing, (url, usage)


def test_error_response_with_unsupported_encoding_counts_nothing() -> None:
    assert finish(reader_for(OPENAI_CHAT.url, status=500, encoding="compress")).counts_nothing


def test_error_response_that_reports_usage_is_counted() -> None:
    usage = read(OPENAI_CHAT, status=400)
    assert usage.total == OPENAI_CHAT.total


@pytest.mark.parametrize("content_type", ["image/png", "text/html", "audio/mpeg", None])
def test_unknown_endpoint_without_a_usage_content_type_is_not_an_llm_call(
    content_type: str | None,
) -> None:
    assert reader_for("https://cdn.example/cat.png", content_type) is None
    assert reader_for(f"{OPENAI}/v1/audio/speech", content_type) is None


@pytest.mark.parametrize(
    ("body", "total"),
    [
        pytest.param(
            dumps({"usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}),
            7,
            id="openai-style",
        ),
        pytest.param(
            dumps({"usage": {"input_tokens": 3, "output_tokens": 4}}), 7, id="anthropic-style"
        ),
        pytest.param(
            dumps(
                {"usage": {"input_tokens": 3, "cache_read_input_tokens": 10, "output_tokens": 4}}
            ),
            17,
            id="anthropic-cache",
        ),
        pytest.param(
            dumps(
                {"response": {"usage": {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}}}
            ),
            7,
            id="nested",
        ),
    ],
)
def test_unknown_endpoint_falls_back_to_the_generic_usage_reader(body: bytes, total: int) -> None:
    usage = finish(reader_for("https://llm-gateway.internal/v3/generate"), body)
    assert (usage.total, usage.provider) == (total, "generic")


def test_unknown_endpoint_stream() -> None:
    usage = finish(
        reader_for("https://llm-gateway.internal/v3/generate", SSE), STREAMS["anthropic"].body
    )
    assert usage.total == STREAMS["anthropic"].total


def test_unknown_endpoint_without_usage_is_unknown() -> None:
    usage = finish(reader_for("https://llm-gateway.internal/v3/generate"), b'{"ok": true}')
    assert (usage.total, usage.problem) == (None, "no usage in response body")


def test_known_host_unknown_path_is_named_after_the_host() -> None:
    body = dumps({"usage": {"input_tokens": 50, "output_tokens": 20, "total_tokens": 70}})
    usage = finish(reader_for(f"{OPENAI}/v1/images/generations"), body)
    assert (usage.total, usage.provider) == (70, "openai")


@pytest.mark.parametrize(
    ("url", "provider"),
    [
        ("https://contoso.openai.azure.com/openai/v1/chat/completions", "azure"),
        (
            "https://gateway.contoso.com/openai/deployments/gpt4/chat/completions?api-version=1",
            "azure",
        ),
        ("https://api.groq.com/openai/v1/chat/completions", "groq"),
        ("https://openrouter.ai/api/v1/chat/completions", "openrouter"),
        ("http://localhost:8000/v1/chat/completions", "openai-compatible"),
        ("https://API.OPENAI.COM:443/v1/chat/completions", "openai"),
    ],
)
def test_openai_compatible_provider_names(url: str, provider: str) -> None:
    assert finish(reader_for(url), OPENAI_CHAT.body).provider == provider


def test_headers_may_be_httpx_headers_in_any_case() -> None:
    registry = ExtractorRegistry()
    reader = registry.reader_for(
        method="post",
        url=OPENAI_CHAT.url,
        status_code=200,
        request_headers=httpx.Headers({"Accept-Encoding": "gzip"}),
        response_headers=httpx.Headers({"CONTENT-TYPE": "application/json; charset=utf-8"}),
    )
    assert finish(reader, OPENAI_CHAT.body).total == OPENAI_CHAT.total


@pytest.mark.parametrize(
    "kwargs",
    [
        {"url": None},
        {"status_code": "two hundred"},
        {"response_headers": 42},
        {"url": "http://[::1"},
    ],
)
def test_reader_for_never_raises(kwargs: dict[str, object]) -> None:
    call: dict[str, object] = {
        "method": "POST",
        "url": OPENAI_CHAT.url,
        "status_code": 200,
        "request_headers": None,
        "response_headers": {},
        **kwargs,
    }
    ExtractorRegistry().reader_for(**call)  # type: ignore[arg-type]


# -- custom extractors ----------------------------------------------------------------------

ACME = UsageShape(containers=(("meta", "tokens"),), input=("in",), output=("out",))
ACME_BODY = dumps({"text": "hi", "meta": {"tokens": {"in": 12, "out": 30}}})


def acme_registry() -> ExtractorRegistry:
    registry = ExtractorRegistry()
    registry.register(ShapeExtractor(ACME, provider="acme", host="acme.internal"))
    return registry


def test_shape_extractor_reads_a_custom_shape() -> None:
    reader = reader_for("https://llm.acme.internal/complete", registry=acme_registry())
    usage = finish(reader, ACME_BODY)
    assert (usage.total, usage.input, usage.output, usage.provider) == (42, 12, 30, "acme")


def test_shape_extractor_reads_a_custom_stream() -> None:
    body = b'data: {"text": "a"}\n\ndata: ' + ACME_BODY + b"\n\n"
    reader = reader_for("https://acme.internal/stream", SSE, registry=acme_registry())
    assert finish(reader, body).total == 42


def test_shape_extractor_path_filter_and_other_hosts() -> None:
    registry = ExtractorRegistry()
    registry.register(ShapeExtractor(ACME, provider="acme", path=r"^/acme/"))
    assert finish(reader_for("https://x.example/acme/go", registry=registry), ACME_BODY).total == 42
    other = finish(reader_for("https://x.example/other", registry=registry), ACME_BODY)
    assert other.total is None  # generic reader: no `usage` object
    assert (
        finish(reader_for("https://notacme.internal/x", registry=acme_registry()), ACME_BODY).total
        is None
    )


def test_custom_extractor_comes_before_builtins_and_later_ones_first() -> None:
    class Fixed:
        def __init__(self, total: float) -> None:
            self.total = total

        def reader_for(self, info: ResponseInfo) -> UsageReader | None:
            return self if info.host == "api.openai.com" else None

        def feed(self, chunk: bytes) -> None:
            pass

        def finish(self, *, complete: bool) -> Usage:
            return Usage(total=self.total, provider="fixed")

    registry = ExtractorRegistry()
    registry.register(Fixed(1))
    registry.register(Fixed(2))
    assert finish(reader_for(OPENAI_CHAT.url, registry=registry), OPENAI_CHAT.body).total == 2
    assert read(BODIES["anthropic-messages"], registry=registry).provider == "anthropic"


def test_failing_custom_extractors_are_contained() -> None:
    class Broken:
        def __init__(self, where: str) -> None:
            self.where = where

        def reader_for(self, info: ResponseInfo) -> UsageReader | None:
            if self.where == "reader_for":
                raise RuntimeError("boom")
            return self

        def feed(self, chunk: bytes) -> None:
            if self.where == "feed":
                raise RuntimeError("boom")

        def finish(self, *, complete: bool) -> Usage:
            if self.where == "finish":
                raise RuntimeError("boom")
            return "not a Usage"  # type: ignore[return-value]

    for where in ("reader_for", "feed", "finish", "wrong-type"):
        registry = ExtractorRegistry()
        registry.register(Broken(where))
        usage = finish(reader_for(OPENAI_CHAT.url, registry=registry), OPENAI_CHAT.body)
        if where == "reader_for":
            assert usage.total == OPENAI_CHAT.total  # skipped: the built-ins answer
        else:
            assert (usage.total, usage.problem) == (None, "custom usage reader failed")


def test_finish_twice_gives_the_same_answer() -> None:
    reader = reader_for(OPENAI_CHAT.url)
    assert reader is not None
    reader.feed(OPENAI_CHAT.body)
    assert reader.finish(complete=True) == reader.finish(complete=False)


def test_registry_docstring_example() -> None:
    reader = ExtractorRegistry().reader_for(
        method="POST",
        url="https://api.openai.com/v1/chat/completions",
        status_code=200,
        request_headers={},
        response_headers={"content-type": "application/json"},
    )
    assert reader is not None
    reader.feed(b'{"usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}')
    assert reader.finish(complete=True).total == 7.0


def test_vertex_anthropic_stream_route() -> None:
    url = (
        "https://us-east5-aiplatform.googleapis.com/v1/projects/p/locations/us-east5/"
        "publishers/anthropic/models/claude-sonnet-4-5:streamRawPredict"
    )
    usage = finish(reader_for(url, SSE), STREAMS["anthropic"].body)
    assert (usage.total, usage.provider) == (STREAMS["anthropic"].total, "anthropic")


def test_a_bug_in_a_framer_is_contained(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(self: object, region: bytes) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(SseFramer, "_records", boom)
    reader = reader_for(STREAMS["anthropic"].url, SSE)
    assert reader is not None
    reader.feed(STREAMS["anthropic"].body)
    reader.feed(b"more")
    usage = reader.finish(complete=True)
    assert (usage.total, usage.partial, usage.problem) == (None, True, INTERNAL_ERROR)


def test_a_bug_when_finishing_is_contained(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(self: object, *, complete: bool) -> Usage:
        raise RuntimeError("bug")

    monkeypatch.setattr(Accumulator, "result", boom)
    usage = finish(reader_for(OPENAI_CHAT.url), OPENAI_CHAT.body)
    assert (usage.total, usage.problem) == (None, INTERNAL_ERROR)


def test_responses_of_one_endpoint_are_read_as_each_says_in_turn() -> None:
    """The readers' plans are remembered per kind of response: responses of one endpoint
    that differ only in status, content-type or content-coding each get their own plan,
    and two ways of writing one content-type the same one, in whichever order they come."""
    usage = {"usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}
    body = dumps(usage)
    event = b"data: " + body + b"\n\ndata: [DONE]\n\n"
    for _ in range(2):  # the second time, every plan is a remembered one
        assert finish(reader_for(OPENAI_CHAT.url, JSON), body).total == 7
        assert (
            finish(reader_for(OPENAI_CHAT.url, " Application/JSON; charset=utf-8"), body).total == 7
        )
        assert finish(reader_for(OPENAI_CHAT.url, SSE), event).total == 7
        assert finish(reader_for(OPENAI_CHAT.url, JSON, status=500), body).counts_nothing is False
        assert finish(reader_for(OPENAI_CHAT.url, JSON, status=500), b"").counts_nothing
        unsupported = finish(reader_for(OPENAI_CHAT.url, JSON, encoding="x-unknown"), body)
        assert unsupported.total is None and "x-unknown" in (unsupported.problem or "")
