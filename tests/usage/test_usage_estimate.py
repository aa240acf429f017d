"""Estimates and the usage option: what a request sends, and asking a stream for its usage."""

from __future__ import annotations

import gzip
import json

import pytest

from tokenfuse._usage import Usage
from tokenfuse._usage.estimate import (
    BYTES_PER_TOKEN,
    TextCounter,
    request_text_bytes,
    tokens_for,
    with_input,
)
from tokenfuse._usage.providers import takes_usage_option
from tokenfuse._usage.request import (
    refuses_usage_option,
    streams_without_usage,
    with_usage_option,
)

from .samples import OPENAI, Sample, read

# -- what a request sends ---------------------------------------------------------------------


def body(**fields: object) -> bytes:
    return json.dumps({"model": "gpt-4o", **fields}).encode()


@pytest.mark.parametrize(
    ("request_body", "text"),
    [
        pytest.param(
            body(messages=[{"role": "user", "content": "Hi there"}]), "userHi there", id="chat"
        ),
        pytest.param(
            body(
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "What is this?"},
                            {
                                "type": "image_url",
                                "image_url": {"url": "data:image/png;base64,AAAA"},
                            },
                        ],
                    }
                ]
            ),
            "user" + "text" + "What is this?" + "image_url",
            id="chat-with-image",
        ),
        pytest.param(body(prompt=["one", "two"]), "onetwo", id="completions"),
        pytest.param(
            body(input="héllo", instructions="be brief"), "héllo" + "be brief", id="responses"
        ),
        pytest.param(
            body(
                system="sys",
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "source": {"type": "base64", "data": "QUJD"}},
                        ],
                    }
                ],
            ),
            "sys" + "user" + "image" + "base64",
            id="anthropic-image",
        ),
        pytest.param(body(temperature=0.2, stream=True), "", id="no-text"),
    ],
)
def test_request_text_is_the_text_sent_without_media(request_body: bytes, text: str) -> None:
    assert request_text_bytes(request_body) == len(text.encode())


@pytest.mark.parametrize("raw", [b"not json", b"[1, 2, 3]", b"\xff\xfe"])
def test_a_request_that_is_not_a_json_object_counts_whole(raw: bytes) -> None:
    assert request_text_bytes(raw) == len(raw)


def test_tokens_are_bytes_over_the_ratio_rounded_up() -> None:
    assert BYTES_PER_TOKEN == 4
    assert [tokens_for(n) for n in (0, 1, 4, 5, 8)] == [0, 1, 1, 2, 2]


def test_text_counter_reads_escapes_and_skips_other_values() -> None:
    counter = TextCounter(("content", "arguments"))
    raw = (
        b'{"content": "a\\"b", "x": {"content":null}, "delta": {"content" : "cd"},'
        b' "arguments": "{\\"k\\": 1}", "contents": "no"}'
    )
    assert counter.count(raw) == len(b'a\\"b') + len(b"cd") + len(b'{\\"k\\": 1}')


# -- adding the input to an estimate ------------------------------------------------------------

CHAT = body(messages=[{"role": "user", "content": "12345678"}])  # 12 bytes: 3 tokens


def test_unknown_usage_becomes_an_estimate_of_the_request() -> None:
    usage = with_input(Usage.unknown("openai", "no usage in stream", partial=True), CHAT)
    assert (usage.total, usage.input, usage.output) == (3, 3, None)
    assert usage.estimated and usage.partial
    assert usage.problem == "no usage in stream"


def test_an_output_estimate_gains_the_input() -> None:
    output = Usage(total=5.0, output=5.0, provider="openai", estimated=True, problem="p")
    usage = with_input(output, CHAT)
    assert (usage.total, usage.input, usage.output, usage.estimated) == (8, 3, 5, True)


@pytest.mark.parametrize(
    "usage",
    [
        Usage(total=30.0, input=10.0, output=20.0, provider="openai"),
        Usage(total=26.0, input=25.0, output=1.0, provider="anthropic", partial=True),
        Usage.nothing("openai"),
    ],
    ids=["reported", "partial", "counts-nothing"],
)
def test_reported_usage_is_never_replaced(usage: Usage) -> None:
    assert with_input(usage, CHAT) is usage


@pytest.mark.parametrize("request_body", [None, b"", body(stream=True)])
def test_nothing_to_estimate_from_stays_unknown(request_body: bytes | None) -> None:
    unknown = Usage.unknown("openai", "no usage")
    assert with_input(unknown, request_body) is unknown


def test_a_json_body_without_usage_is_estimated_from_its_message() -> None:
    answer = {"choices": [{"message": {"role": "assistant", "content": "Hello there, friend!"}}]}
    sample = Sample(
        f"{OPENAI}/v1/chat/completions",
        "application/json",
        json.dumps(answer).encode(),
        None,
        "openai",
    )
    usage = read(sample, estimate=True)
    assert usage.estimated
    assert usage.output == tokens_for(len("Hello there, friend!"))
    assert read(sample).total is None  # not asked to estimate: unknown


# -- the usage option -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "path", "takes"),
    [
        ("api.openai.com", "/v1/chat/completions", True),
        ("api.openai.com", "/v1/completions", True),
        ("x.openai.azure.com", "/openai/deployments/gpt/chat/completions", True),
        ("127.0.0.1", "/v1/chat/completions", True),
        ("api.openai.com", "/v1/responses", False),  # always reports usage
        ("api.openai.com", "/v1/embeddings", False),
        ("api.anthropic.com", "/v1/messages", False),
        ("api.groq.com", "/openai/v1/chat/completions", False),  # reports it unasked
        ("api.mistral.ai", "/v1/chat/completions", False),
        ("openrouter.ai", "/api/v1/chat/completions", False),
    ],
)
def test_which_endpoints_take_the_usage_option(host: str, path: str, takes: bool) -> None:
    assert takes_usage_option(host, path) is takes


def test_the_option_is_added_at_the_end_and_nothing_else_changes() -> None:
    sent = (
        b'{"model":"m","messages":[{"role":"user","content":"\\u00e9 \\"stream\\""}],'
        b'"stream":true}\n'
    )
    asked = with_usage_option(sent)
    assert asked == sent[:-2] + b',"stream_options":{"include_usage":true}}\n'
    assert json.loads(asked)["messages"] == json.loads(sent)["messages"]
    assert streams_without_usage(sent) and not streams_without_usage(asked)


def test_other_stream_options_are_kept_in_order() -> None:
    sent = (
        b'{"stream": true, "stream_options": {"continuous_usage_stats": true, '
        b'"include_usage": false}, "model": "m"}'
    )
    asked = with_usage_option(sent)
    assert asked is not None
    parsed = json.loads(asked)
    assert list(parsed) == ["stream", "stream_options", "model"]
    assert parsed["stream_options"] == {"continuous_usage_stats": True, "include_usage": True}


def test_a_null_stream_options_is_replaced_not_repeated() -> None:
    asked = with_usage_option(b'{"stream": true, "stream_options": null}')
    assert asked is not None
    assert asked.count(b"stream_options") == 1
    assert json.loads(asked)["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    "sent",
    [
        b'{"model": "m", "messages": []}',  # not a stream
        b'{"stream": false}',
        b'{"stream": "true"}',
        b'{"stream": true, "stream_options": {"include_usage": true}}',  # asks already
        b'{"stream": true, "stream_options": "yes"}',  # the server refuses it anyway
        b'{"stream": true,',  # not JSON
        b'[{"stream": true}]',
        b'{"stream": true, "messages": [{"content": "\\ud800"}], "stream_options": {}}',
    ],
)
def test_requests_that_are_left_as_they_are(sent: bytes) -> None:
    assert with_usage_option(sent) is None


@pytest.mark.parametrize(
    ("error", "refuses"),
    [
        (b'{"error": {"message": "Unrecognized request argument supplied: stream_options"}}', True),
        (b'{"detail": [{"loc": ["body", "stream_options", "include_usage"]}]}', True),
        (b'{"error": {"message": "model not found"}}', False),
        (b"", False),
    ],
)
def test_a_refusal_names_the_option(error: bytes, refuses: bool) -> None:
    assert refuses_usage_option(error) is refuses
    assert refuses_usage_option(gzip.compress(error), "gzip") is refuses


def test_an_error_in_an_unknown_coding_is_not_a_refusal() -> None:
    assert not refuses_usage_option(b"stream_options", "compress")


def test_a_text_count_is_the_sum_of_its_keys_regex_matches_wherever_the_keys_first_are() -> None:
    """The count starts each key's regex where ``find`` sees the key first: the same sum as
    matching the whole text, for keys absent, first late, repeated, as values, or cut."""
    import random
    import re

    from tokenfuse._usage.estimate import TextCounter

    keys = ("content", "text")
    plain = [
        re.compile(
            rb'"%s"[ \t\r\n]*:[ \t\r\n]*"([^"\\]*(?:\\.[^"\\]*)*)"' % key.encode(), re.DOTALL
        )
        for key in keys
    ]
    parts = [b'"content"', b'"text"', b": ", b'"', b'ab\\"c', b"x", b"{", b"null", b'"content":']
    rng = random.Random(5)
    counter = TextCounter(keys)
    for _ in range(2_000):
        data = b"".join(rng.choice(parts) for _ in range(rng.randrange(30)))
        expected = sum(m.end(1) - m.start(1) for p in plain for m in p.finditer(data))
        assert counter.count(data) == expected, data
