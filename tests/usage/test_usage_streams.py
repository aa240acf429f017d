"""Streams of every provider: any chunking gives the same total; early closes are partial."""

from __future__ import annotations

import gzip

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from .samples import (
    ANTHROPIC,
    BEDROCK,
    CLAUDE_ON_BEDROCK,
    EVENTSTREAM,
    GEMINI,
    NDJSON,
    OPENAI,
    SSE,
    STREAMS,
    Sample,
    anthropic_stream,
    assert_counts,
    chat_chunk,
    chat_stream,
    compress,
    eventstream,
    eventstream_message,
    gemini_array,
    ollama_stream,
    read,
    responses_stream,
    split_at,
    sse,
)


@pytest.mark.parametrize("name", STREAMS)
def test_stream_split_at_every_byte_boundary(name: str) -> None:
    sample = STREAMS[name]
    for cut in range(1, len(sample.body)):
        usage = read(sample, split_at(sample.body, cut))
        assert usage.total == sample.total, (cut, usage)
        assert not usage.partial, (cut, usage)


@pytest.mark.parametrize("name", STREAMS)
def test_stream_one_byte_at_a_time(name: str) -> None:
    sample = STREAMS[name]
    chunks = [sample.body[i : i + 1] for i in range(len(sample.body))]
    assert_counts(read(sample, chunks), sample)


@pytest.mark.parametrize("coding", ["gzip", "deflate", "raw-deflate", "br"])
@pytest.mark.parametrize("name", STREAMS)
def test_compressed_stream_at_every_byte_boundary(name: str, coding: str) -> None:
    sample = STREAMS[name]
    body = compress(sample.body, coding)
    assert_counts(read(sample, coding=coding), sample)
    for cut in range(1, len(body), 3):
        usage = read(sample, split_at(body, cut), coding=coding)
        assert usage.total == sample.total, (cut, usage)


@pytest.mark.parametrize("name", STREAMS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_stream_at_random_boundaries(name: str, data: st.DataObject) -> None:
    sample = STREAMS[name]
    cuts = data.draw(st.lists(st.integers(1, len(sample.body) - 1), max_size=40))
    assert_counts(read(sample, split_at(sample.body, *cuts)), sample)


def test_anthropic_deltas_are_cumulative_not_summed() -> None:
    sample = STREAMS["anthropic-cumulative"]  # output 10 then 15: 15 wins, not 25
    assert read(sample).output == 15


def test_vllm_running_totals_are_not_summed() -> None:
    assert read(STREAMS["vllm"]).total == 19  # the last running total (10 + 9)


def test_azure_empty_first_chunk_is_not_the_usage_chunk() -> None:
    assert_counts(read(STREAMS["azure-chat"]), STREAMS["azure-chat"])


# -- early close ----------------------------------------------------------------------------


def _cut_before(sample: Sample, marker: bytes, *, occurrence: int = 1) -> list[bytes]:
    at = -1
    for _ in range(occurrence):
        at = sample.body.index(marker, at + 1)
    return [sample.body[:at]]


def test_anthropic_closed_after_message_start_is_partial() -> None:
    sample = STREAMS["anthropic"]
    usage = read(sample, _cut_before(sample, b"event: message_delta"), complete=False)
    assert (usage.total, usage.input, usage.output) == (472 + 1024 + 2, 1496, 2)
    assert usage.partial
    assert usage.problem == "stream closed before final usage"


def test_anthropic_error_event_after_message_start_is_partial() -> None:
    sample = Sample(
        f"{ANTHROPIC}/v1/messages", SSE, anthropic_stream(error_after_start=True), 0, "anthropic"
    )
    usage = read(sample)
    assert usage.total == 472 + 1024 + 2
    assert usage.partial
    assert usage.problem == "error reported in stream"


@pytest.mark.parametrize(
    ("url", "body"),
    [
        pytest.param(
            f"{ANTHROPIC}/v1/messages",
            b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error"}}\n\n',
            id="anthropic",
        ),
        pytest.param(
            f"{OPENAI}/v1/chat/completions",
            sse((None, chat_chunk("Hello", usage="absent")))
            + b'data: {"error": {"message": "server error", "type": "server_error"}}\n\n',
            id="openai-compatible",
        ),
    ],
)
def test_error_in_a_stream_without_usage_is_unknown(url: str, body: bytes) -> None:
    # Text may have been generated before the error: not knowing is not the same as nothing.
    usage = read(Sample(url, SSE, body, 0, "any"))
    assert (usage.total, usage.partial, usage.counts_nothing) == (None, True, False)
    assert usage.problem == "error reported in stream"


def test_openai_stream_closed_before_usage_chunk_is_partial_unknown() -> None:
    sample = STREAMS["openai-chat"]
    usage = read(sample, _cut_before(sample, b'"choices": []'), complete=False)
    assert usage.total is None
    assert usage.partial
    assert usage.problem == "stream closed before usage"


def test_closing_after_done_is_not_partial() -> None:
    # The OpenAI SDK stops at [DONE] and closes the response without reading to its end.
    sample = STREAMS["openai-chat"]
    assert_counts(read(sample, complete=False), sample)


@pytest.mark.parametrize("name", STREAMS)
def test_closing_after_the_end_marker_is_not_partial(name: str) -> None:
    assert_counts(read(STREAMS[name], complete=False), STREAMS[name])


def test_gemini_closed_early_keeps_the_last_running_total() -> None:
    sample = STREAMS["gemini-sse"]
    usage = read(sample, _cut_before(sample, b"data:", occurrence=3), complete=False)
    assert (usage.total, usage.partial) == (400, True)


def test_gemini_array_closed_early_keeps_the_last_complete_total() -> None:
    body = gemini_array()
    cut = body.rindex(b'"totalTokenCount"')  # inside the last element's usageMetadata
    sample = Sample(f"{GEMINI}:streamGenerateContent", "application/json", body, 418, "gemini")
    usage = read(sample, [body[:cut]], complete=False)
    assert (usage.total, usage.partial) == (400, True)


@pytest.mark.parametrize("name", STREAMS)
def test_every_early_close_is_partial_or_final(name: str) -> None:
    sample = STREAMS[name]
    for cut in range(0, len(sample.body), 11):
        usage = read(sample, [sample.body[:cut]], complete=False)
        if usage.partial:
            assert usage.problem is not None
            assert usage.total is None or usage.total <= sample.total
        else:
            assert usage.total == sample.total, (cut, usage)


def test_ollama_stream_prompt_cache_hit() -> None:
    sample = Sample(
        "http://localhost:11434/api/chat", NDJSON, ollama_stream(cache_hit=True), 298, "ollama"
    )
    usage = read(sample)
    assert (usage.total, usage.input, usage.partial) == (298, None, True)


def test_bedrock_exception_message_ends_as_error() -> None:
    body = eventstream(("messageStart", {"role": "assistant"}))
    body += eventstream_message("throttlingException", b'{"message":"slow down"}', "exception")
    sample = Sample(
        f"{BEDROCK}/{CLAUDE_ON_BEDROCK}/converse-stream", EVENTSTREAM, body, 0, "bedrock"
    )
    usage = read(sample)
    assert (usage.total, usage.partial, usage.problem) == (None, True, "error reported in stream")


# -- streams without usage ------------------------------------------------------------------

CHAT_WITHOUT_USAGE = Sample(
    f"{OPENAI}/v1/chat/completions", SSE, chat_stream(include_usage=False), 0, "openai"
)


def test_stream_without_usage_is_unknown() -> None:
    usage = read(CHAT_WITHOUT_USAGE)
    assert usage.total is None
    assert not usage.partial
    assert usage.problem == "no usage in stream (stream_options.include_usage not set?)"


def test_stream_without_usage_is_estimated_when_opted_in() -> None:
    usage = read(CHAT_WITHOUT_USAGE, estimate=True)
    text = "Hello! How can I help you today?"
    assert usage.estimated
    assert usage.total == usage.output == -(-len(text) // 4)
    assert usage.input is None
    assert usage.problem == "no usage in stream (stream_options.include_usage not set?)"


def test_estimate_opt_in_does_not_replace_reported_usage() -> None:
    assert_counts(read(STREAMS["openai-chat"], estimate=True), STREAMS["openai-chat"])


def test_estimate_of_a_responses_stream_closed_early() -> None:
    body = responses_stream()
    sample = Sample(f"{OPENAI}/v1/responses", SSE, body, 380, "openai")
    usage = read(
        sample, [body[: body.index(b"event: response.completed")]], complete=False, estimate=True
    )
    assert usage.estimated
    assert usage.partial
    assert usage.total == 8  # 32 characters of deltas


def test_compressed_stream_closed_early_is_partial() -> None:
    sample = STREAMS["anthropic"]
    body = gzip.compress(sample.body)
    usage = read(sample, [body[: len(body) // 2]], coding="gzip", complete=False)
    assert usage.partial
