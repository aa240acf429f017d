"""SSE, NDJSON, eventstream and JSON-body framing details."""

from __future__ import annotations

import json
import struct
import zlib

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tokenfuse._usage.eventstream import parse_headers
from tokenfuse._usage.model import UsageShape
from tokenfuse._usage.providers import GEMINI, OLLAMA
from tokenfuse._usage.providers import OPENAI as OPENAI_SHAPE
from tokenfuse._usage.scan import UsageScanner

from .samples import (
    BEDROCK,
    CLAUDE_ON_BEDROCK,
    EVENTSTREAM,
    NDJSON,
    OPENAI,
    SSE,
    STREAMS,
    Sample,
    converse_stream,
    dumps,
    eventstream,
    eventstream_message,
    read,
)

USAGE = b'{"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5}}'


def chat(body: bytes, chunks: list[bytes] | None = None, complete: bool = True) -> float | None:
    sample = Sample(f"{OPENAI}/v1/chat/completions", SSE, body, 5, "openai")
    return read(sample, chunks, complete=complete).total


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"data: " + USAGE + b"\n\n", id="lf"),
        pytest.param(b"data: " + USAGE + b"\r\n\r\n", id="crlf"),
        pytest.param(b"data: " + USAGE + b"\r\r", id="cr"),
        pytest.param(b"data:" + USAGE + b"\n\n", id="no-space"),
        pytest.param(b": OPENROUTER PROCESSING\n\ndata: " + USAGE + b"\n\n", id="comment"),
        pytest.param(b"id: 7\nretry: 100\nevent: chunk\ndata: " + USAGE + b"\n\n", id="fields"),
        pytest.param(
            b'data: {"choices":[],\ndata: "usage":{"total_tokens":5}}\n\n', id="multiline"
        ),
        pytest.param(b"data: " + USAGE + b"\n\ndata: [DONE]\n\n", id="done"),
        pytest.param(b"\n\n\ndata: " + USAGE + b"\n\n", id="leading-blank-lines"),
        pytest.param(b"data: " + USAGE, id="no-final-blank-line"),
    ],
)
def test_sse_framing(body: bytes) -> None:
    assert chat(body) == 5


def test_sse_line_separators_inside_json_strings_do_not_split() -> None:
    text = "line\u2028separator\u0085next\u2029para"
    chunk = json.dumps({"choices": [{"delta": {"content": text}}]}, ensure_ascii=False)
    body = f"data: {chunk}\n\n".encode() + b"data: " + USAGE + b"\n\n"
    assert chat(body) == 5


def test_sse_crlf_split_across_chunks_is_one_line_ending() -> None:
    # "data: x\r" | "\n\r\n": the CR and LF of the first CRLF arrive in different chunks.
    body = b"data: " + USAGE + b"\r\n\r\n"
    assert chat(body, [body[: body.index(b"\r") + 1], body[body.index(b"\r") + 1 :]]) == 5


def test_sse_cr_then_crlf_are_two_line_endings() -> None:
    # A lone CR ends a line, so "data: a\r\r\n" dispatches the event.
    assert chat(b"data: " + USAGE + b"\r\r\n") == 5


def test_sse_unfinished_event_after_early_close_is_ignored() -> None:
    assert chat(b"data: " + USAGE, complete=False) is None


def test_sse_oversized_event_is_dropped_and_the_stream_goes_on() -> None:
    huge = b"data: " + b'{"x":"' + b"a" * (1024 * 1024) + b'"}\n\n'
    usage = read(
        Sample(
            f"{OPENAI}/v1/chat/completions", SSE, huge + b"data: " + USAGE + b"\n\n", 5, "openai"
        )
    )
    assert usage.total == 5


def test_sse_oversized_line_without_end() -> None:
    body = b"data: " + b"a" * (2 * 1024 * 1024)
    usage = read(
        Sample(f"{OPENAI}/v1/chat/completions", SSE, body, 0, "openai"),
        [body[i : i + 65536] for i in range(0, len(body), 65536)],
    )
    assert usage.total is None
    assert usage.problem == "SSE event over 1 MiB dropped"


def test_sse_many_data_lines_over_the_bound_are_dropped() -> None:
    line = b"data: " + b"b" * 1000 + b"\n"
    body = line * 1100 + b"\n" + b"data: " + USAGE + b"\n\n"
    assert chat(body) == 5


def test_malformed_usage_event_is_reported() -> None:
    usage = read(
        Sample(
            f"{OPENAI}/v1/chat/completions",
            SSE,
            b'data: {"usage": {"total_tokens": 5\n\n',
            5,
            "openai",
        )
    )
    assert usage.total is None
    assert usage.problem == "malformed JSON in stream"


def test_malformed_chunk_before_a_valid_running_total_is_harmless() -> None:
    good = STREAMS["gemini-sse"].body
    body = b'data: {"usageMetadata": {"totalTokenCount": \r\n\r\n' + good
    sample = STREAMS["gemini-sse"]
    usage = read(Sample(sample.url, SSE, body, 418, "gemini"))
    assert (usage.total, usage.problem) == (418, None)


# -- NDJSON ---------------------------------------------------------------------------------


def ollama(body: bytes) -> float | None:
    return read(Sample("http://localhost:11434/api/generate", NDJSON, body, 0, "ollama")).total


def test_ndjson_with_crlf_and_blank_lines() -> None:
    body = b'{"done":false}\r\n\r\n  \n{"done":true,"prompt_eval_count":3,"eval_count":4}\r\n'
    assert ollama(body) == 7


def test_ndjson_last_line_without_newline() -> None:
    assert ollama(b'{"done":true,"prompt_eval_count":3,"eval_count":4}') == 7


def test_ndjson_oversized_line_is_dropped() -> None:
    body = b'{"response":"' + b"x" * (1024 * 1024) + b'"}\n'
    body += b'{"done":true,"prompt_eval_count":3,"eval_count":4}\n'
    assert ollama(body) == 7


def test_ndjson_error_line() -> None:
    usage = read(
        Sample(
            "http://localhost:11434/api/chat",
            NDJSON,
            b'{"error":"model \\"llama9\\" not found"}\n',
            0,
            "ollama",
        )
    )
    assert (usage.total, usage.partial, usage.problem) == (None, True, "error reported in stream")


# -- eventstream ----------------------------------------------------------------------------

CONVERSE = STREAMS["bedrock-converse-stream"]


def converse(body: bytes) -> Sample:
    return Sample(
        f"{BEDROCK}/{CLAUDE_ON_BEDROCK}/converse-stream", EVENTSTREAM, body, 56, "bedrock"
    )


def test_eventstream_prelude_crc_mismatch_stops_reading() -> None:
    body = bytearray(converse_stream())
    body[9] ^= 0xFF  # prelude CRC of the first message
    usage = read(converse(bytes(body)))
    assert usage.total is None
    assert usage.problem == "malformed eventstream (prelude CRC mismatch)"


def test_eventstream_message_crc_mismatch_on_the_usage_message() -> None:
    body = bytearray(converse_stream())
    body[-10] ^= 0x01  # inside the metadata payload
    usage = read(converse(bytes(body)))
    assert usage.total is None
    assert usage.problem == "malformed eventstream (message CRC mismatch)"


def test_eventstream_message_crc_mismatch_elsewhere_is_dropped() -> None:
    first = bytearray(eventstream(("messageStart", {"role": "assistant"})))
    first[-6] ^= 0x01
    usage = read(converse(bytes(first) + converse_stream()))
    assert usage.total == 56


def test_eventstream_oversized_message_is_skipped() -> None:
    big = eventstream_message("contentBlockDelta", b"{" + b" " * (2 * 1024 * 1024) + b"}")
    body = big + converse_stream()
    assert (
        read(converse(body), [body[i : i + 50000] for i in range(0, len(body), 50000)]).total == 56
    )


def test_eventstream_truncated_at_the_end() -> None:
    body = converse_stream()
    usage = read(converse(body[:-5]))
    assert usage.total is None
    assert usage.problem == "eventstream ended inside a message"


def test_eventstream_bad_invoke_chunk_payload() -> None:
    body = eventstream_message("chunk", b'{"bytes":"not base64!!"}') + eventstream_message(
        "chunk", dumps({"bytes": 5})
    )
    sample = Sample(
        f"{BEDROCK}/{CLAUDE_ON_BEDROCK}/invoke-with-response-stream",
        EVENTSTREAM,
        body,
        0,
        "bedrock",
    )
    assert read(sample).total is None


def _header(name: bytes, kind: int, value: bytes) -> bytes:
    return bytes([len(name)]) + name + bytes([kind]) + value


def test_parse_headers_skips_every_value_type() -> None:
    raw = b"".join(
        [
            _header(b"t", 0, b""),
            _header(b"f", 1, b""),
            _header(b"b", 2, b"\x01"),
            _header(b"s", 3, b"\x00\x02"),
            _header(b"i", 4, struct.pack(">i", 3)),
            _header(b"l", 5, struct.pack(">q", 4)),
            _header(b"y", 6, b"\x00\x02hi"),
            _header(b"ts", 8, struct.pack(">q", 5)),
            _header(b"u", 9, b"\x00" * 16),
            _header(b":event-type", 7, b"\x00\x08metadata"),
        ]
    )
    assert parse_headers(raw) == {b":event-type": b"metadata"}


@pytest.mark.parametrize(
    "raw",
    [
        b"\x05ab",
        b"\x01a",
        b"\x01a\x07\x00",
        b"\x01a\x07\x00\x09abc",
        b"\x01a\x0c",
        b"\x01a\x04\x00",
    ],
)
def test_parse_headers_rejects_malformed_blocks(raw: bytes) -> None:
    assert parse_headers(raw) is None


def test_eventstream_malformed_headers() -> None:
    headers = b"\x01a\x0c"
    total = 12 + len(headers) + 2 + 4
    prelude = struct.pack(">II", total, len(headers))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    message = prelude + headers + b"{}"
    message += struct.pack(">I", zlib.crc32(message))
    usage = read(converse(message + converse_stream()))
    assert usage.total == 56


# -- scanning for usage objects ------------------------------------------------------------


def last_usage(window: bytes, shape: UsageShape) -> dict[str, object] | None:
    return next(UsageScanner(shape).objects(window), None)


def test_scan_takes_the_last_usage_object() -> None:
    window = b'1, "usage": {"total_tokens": 1}}, {"usage" : \n {"total_tokens": 2}, "x": 1}'
    assert last_usage(window, OPENAI_SHAPE) == {"total_tokens": 2}


def test_scan_skips_keys_that_are_values_or_null_or_cut() -> None:
    window = b'"usage": {"total_tokens": 1}, "kind": "usage", "usage": null, "usage": {"tot'
    assert last_usage(window, OPENAI_SHAPE) == {"total_tokens": 1}


def test_scan_for_root_fields() -> None:
    window = b'..., 0.25]], "total_duration": 14, "prompt_eval_count": 8, "eval_count": 2}'
    assert last_usage(window, OLLAMA) == {"prompt_eval_count": 8, "eval_count": 2}


def test_scan_window_starting_inside_a_character() -> None:
    window = "é".encode()[1:] + b'"usageMetadata": {"totalTokenCount": 3}'
    assert last_usage(window, GEMINI) == {"totalTokenCount": 3}


def test_scan_finds_nothing() -> None:
    assert last_usage(b"\xff" * 100, OPENAI_SHAPE) is None


def test_a_later_usage_key_without_counts_is_passed_over() -> None:
    # e.g. a tool schema with a property called "usage", serialised after the real usage
    chunk = (
        b'{"usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5},'
        b'"tools":[{"parameters":{"properties":{"usage":{"type":"string"}}}}]}'
    )
    assert chat(b"data: " + chunk + b"\n\n") == 5


@given(
    st.lists(
        st.sampled_from(
            [
                b'"usage":null,',
                b'"usage": null,',
                b'"usage" : null,',
                b'"usage":{"total_tokens":3},',
                b'"usage": 7,',
                b'"usage"',
                b'"text":"a usage",',
                b"\n\n",
            ]
        ),
        max_size=30,
    )
)
# The first key's null form is counted first: spaced, then a mix, then a value after either.
@example([b'"usage": null,', b'"usage": null,', b'"usage":{"total_tokens":3},'])
@example([b'"usage": null,', b'"usage":null,', b'"usage": null,'])
@example([b'"usage":null,', b'"usage": null,', b'"usage": 7,', b'"usage":null,'])
def test_the_first_valued_usage_key_is_found_as_the_regex_finds_it(parts: list[bytes]) -> None:
    """``valued_at`` counts keys and null forms before it searches (and, with one key that is
    not null, steps back from the end to it): the same answer as the regex, from the start."""
    scanner = UsageScanner(OPENAI_SHAPE)
    data = b"".join(parts)
    expected = scanner._valued.search(data)
    assert scanner.valued_at(data) == (-1 if expected is None else expected.start())
