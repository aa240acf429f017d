"""Non-streaming bodies of every provider, plain and compressed."""

from __future__ import annotations

import gzip

import httpx
import pytest

from tokenfuse._usage import default_registry

from .samples import (
    ANTHROPIC_MESSAGE,
    BEDROCK_INVOKE,
    BODIES,
    CHAT_USAGE,
    JSON,
    OLLAMA_DONE,
    OPENAI,
    Sample,
    assert_counts,
    chat_completion,
    dumps,
    embeddings_body,
    read,
    reader_for,
    split_at,
)

CODINGS = ["identity", "gzip", "deflate", "raw-deflate", "br"]


@pytest.mark.parametrize("coding", CODINGS)
@pytest.mark.parametrize("name", BODIES)
def test_body_total_is_the_providers_total(name: str, coding: str) -> None:
    assert_counts(read(BODIES[name], coding=coding), BODIES[name])


@pytest.mark.parametrize("name", ["openai-chat", "anthropic-messages", "gemini-generate"])
def test_body_in_many_chunks(name: str) -> None:
    sample = BODIES[name]
    body = gzip.compress(sample.body)
    chunks = [body[i : i + 7] for i in range(0, len(body), 7)]
    assert_counts(read(sample, chunks, coding="gzip"), sample)


@pytest.mark.parametrize("coding", ["identity", "gzip"])
def test_large_embeddings_body_is_read_from_its_tail(coding: str) -> None:
    body = embeddings_body(400)  # ~3.3 MB of base64 vectors: over the 2 MiB parse bound
    assert len(body) > 3_000_000
    sample = Sample(f"{OPENAI}/v1/embeddings", JSON, body, 3200, "openai", 3200)
    compressed = gzip.compress(body) if coding == "gzip" else body
    chunks = [compressed[i : i + 65536] for i in range(0, len(compressed), 65536)]
    assert_counts(read(sample, chunks, coding=coding), sample)


def test_bedrock_invoke_reads_headers_case_insensitively() -> None:
    headers = httpx.Headers({**BEDROCK_INVOKE.headers, "content-type": JSON})
    reader = default_registry.reader_for(
        method="POST",
        url=BEDROCK_INVOKE.url,
        status_code=200,
        request_headers=None,
        response_headers=headers,
    )
    assert reader is not None
    reader.feed(b"not even JSON: the headers are the answer")
    assert_counts(reader.finish(complete=True), BEDROCK_INVOKE)


def test_bedrock_invoke_without_headers_falls_back_to_the_body() -> None:
    sample = Sample(BEDROCK_INVOKE.url, JSON, BEDROCK_INVOKE.body, 145, "bedrock", 25, 120)
    assert_counts(read(sample), sample)


def test_bedrock_invoke_bad_header_is_not_counted() -> None:
    headers = {"x-amzn-bedrock-input-token-count": "-5", "x-amzn-bedrock-output-token-count": "9"}
    body = dumps({"content": []})
    usage = read(Sample(BEDROCK_INVOKE.url, JSON, body, 0, "bedrock", headers=headers))
    assert usage.total is None
    assert usage.problem == "no usage in response body"


def test_ollama_prompt_cache_hit_is_partial_not_zero_input() -> None:
    done = {k: v for k, v in OLLAMA_DONE.items() if k != "prompt_eval_count"}
    usage = read(Sample("http://localhost:11434/api/chat", JSON, dumps(done), 298, "ollama"))
    assert (usage.total, usage.input, usage.output) == (298, None, 298)
    assert usage.partial
    assert usage.problem == "input tokens not reported"


def test_zero_usage_is_counted_as_zero() -> None:
    body = dumps(chat_completion({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}))
    usage = read(Sample(f"{OPENAI}/v1/chat/completions", JSON, body, 0, "openai"))
    assert usage.total == 0
    assert not usage.counts_nothing
    assert usage.problem is None


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        pytest.param(b"", "empty body", id="empty"),
        pytest.param(b'{"id": "chatcmpl-1", "usage": {"prompt', "malformed JSON", id="truncated"),
        pytest.param(b"<html>502 Bad Gateway</html>", "malformed JSON", id="html"),
        pytest.param(b'{"usage": 1} trailing', "malformed JSON", id="trailing"),
        pytest.param(b"\xff\xfe\x00{", "malformed JSON", id="bad-utf8"),
        pytest.param(b"[" * 100_000, "malformed JSON", id="deep-nesting"),
        pytest.param(b'{"a":' * 100_000, "malformed JSON", id="deep-object"),
        pytest.param(b'{"usage": 1}\x0b', "malformed JSON", id="not-json-blank-after"),
        pytest.param(b'{"usage": {"total_tokens": 3}', "malformed JSON", id="unclosed"),
        pytest.param(dumps(chat_completion(None)), "no usage in response body", id="null-usage"),
        pytest.param(b'"usage"', "no usage in response body", id="string"),
    ],
)
def test_bad_bodies_are_unknown_with_a_problem(body: bytes, problem: str) -> None:
    usage = read(Sample(f"{OPENAI}/v1/chat/completions", JSON, body, 0, "openai"))
    assert usage.total is None
    assert usage.problem == problem
    assert not usage.counts_nothing


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-32-le", "utf-8-sig"])
def test_a_body_in_another_unicode_encoding_is_read_as_json_loads_reads_it(
    encoding: str,
) -> None:
    # RFC 8259 wants UTF-8, but `json.loads` detects the others, and so does the reader.
    body = dumps(chat_completion()).decode().encode(encoding)
    usage = read(Sample(f"{OPENAI}/v1/chat/completions", JSON, body, 0, "openai"))
    assert usage.total == CHAT_USAGE["total_tokens"]
    assert usage.problem is None


def test_body_closed_before_usage_is_partial_unknown() -> None:
    body = ANTHROPIC_MESSAGE.body
    cut = body.index(b'"usage"')
    usage = read(ANTHROPIC_MESSAGE, [body[:cut]], complete=False)
    assert usage.total is None
    assert usage.partial


def test_body_read_whole_then_closed_is_not_partial() -> None:
    # The client may close a response after reading all of it, before seeing the end.
    chunks = split_at(ANTHROPIC_MESSAGE.body, 100)
    assert_counts(read(ANTHROPIC_MESSAGE, chunks, complete=False), ANTHROPIC_MESSAGE)


def test_wrong_content_type_on_a_known_endpoint_is_sniffed() -> None:
    for content_type in ("text/plain", None, "application/octet-stream"):
        reader = reader_for(ANTHROPIC_MESSAGE.url, content_type)
        assert reader is not None
        reader.feed(b"\n  " + ANTHROPIC_MESSAGE.body)
        assert_counts(reader.finish(complete=True), ANTHROPIC_MESSAGE)


def test_unrecognisable_body_on_a_known_endpoint() -> None:
    reader = reader_for(ANTHROPIC_MESSAGE.url, "text/plain")
    assert reader is not None
    reader.feed(b"Internal error, please retry")
    usage = reader.finish(complete=True)
    assert usage.total is None
    assert usage.problem == "unrecognised response body"
