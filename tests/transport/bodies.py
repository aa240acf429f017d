"""Responses in the real shapes of each API (reference/usage-formats.md), with their totals.

Written by hand for the transport tests, independently of the usage package's own samples, so
the two test suites check each other. Totals are worked out here from the reference table, not
read back from the parser.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field

JSON = "application/json"
SSE = "text/event-stream"
NDJSON = "application/x-ndjson"
EVENTSTREAM = "application/vnd.amazon.eventstream"


@dataclass(frozen=True)
class Case:
    """One call: the request the client makes and the response the provider sends."""

    url: str
    content_type: str
    body: bytes
    total: float | None  # None: the response carries no usage (recorded as unknown)
    method: str = "POST"
    status: int = 200
    request_headers: dict[str, str] = field(default_factory=dict)
    response_headers: dict[str, str] = field(default_factory=dict)
    counts_nothing: bool = False


def dumps(obj: object) -> bytes:
    return json.dumps(obj).encode()


def sse(*events: tuple[str | None, object], eol: str = "\n") -> bytes:
    out = []
    for name, data in events:
        text = data if isinstance(data, str) else json.dumps(data)
        lines = ([f"event: {name}"] if name else []) + [f"data: {text}", ""]
        out.append(eol.join(lines) + eol)
    return "".join(out).encode()


def ndjson(*objects: object) -> bytes:
    return b"".join(dumps(obj) + b"\n" for obj in objects)


def eventstream(*events: tuple[str, object]) -> bytes:
    """AWS eventstream messages (Bedrock ConverseStream), CRCs included."""
    out = b""
    for event_type, payload_obj in events:
        headers = b""
        for name, value in (
            (":event-type", event_type),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ):
            raw = value.encode()
            headers += bytes([len(name)]) + name.encode() + b"\x07" + struct.pack(">H", len(raw))
            headers += raw
        payload = dumps(payload_obj)
        total = 12 + len(headers) + len(payload) + 4
        prelude = struct.pack(">II", total, len(headers))
        prelude += struct.pack(">I", zlib.crc32(prelude))
        message = prelude + headers + payload
        out += message + struct.pack(">I", zlib.crc32(message))
    return out


OPENAI = "https://api.openai.com/v1"
BEARER = {"Authorization": "Bearer sk-proj-transport-test-a1b2"}


def _chat_chunk(content: str | None, *, usage: object = None, finish: str | None = None) -> dict:
    choices = (
        []
        if content is None
        else [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]
    )
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1767225600,
        "model": "gpt-4o-mini",
        "choices": choices,
        "usage": usage,
    }


CHAT_USAGE = {
    "prompt_tokens": 19,
    "completion_tokens": 6,
    "total_tokens": 25,
    "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
}

CASES: dict[str, Case] = {
    # -- non-streaming bodies ------------------------------------------------------------------
    "openai-chat": Case(
        f"{OPENAI}/chat/completions",
        JSON,
        dumps(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 1767225600,
                "model": "gpt-4o-mini",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "Hello there!"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": CHAT_USAGE,
            }
        ),
        25,
        request_headers=BEARER,
    ),
    "openai-completions": Case(
        f"{OPENAI}/completions",
        JSON,
        dumps(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "choices": [{"text": "ok", "index": 0, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
            }
        ),
        12,
        request_headers=BEARER,
    ),
    "openai-responses": Case(
        f"{OPENAI}/responses",
        JSON,
        dumps(
            {
                "id": "resp_1",
                "object": "response",
                "status": "completed",
                "output": [
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": "Hi"}],
                    }
                ],
                "usage": {
                    "input_tokens": 36,
                    "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": 87,
                    "output_tokens_details": {"reasoning_tokens": 64},
                    "total_tokens": 123,
                },
            }
        ),
        123,
        request_headers=BEARER,
    ),
    "openai-embeddings": Case(
        f"{OPENAI}/embeddings",
        JSON,
        dumps(
            {
                "object": "list",
                "data": [{"object": "embedding", "index": 0, "embedding": "AAAAAAAAgD8="}],
                "model": "text-embedding-3-small",
                "usage": {"prompt_tokens": 8, "total_tokens": 8},
            }
        ),
        8,
        request_headers=BEARER,
    ),
    "azure-chat": Case(
        "https://contoso.openai.azure.com/openai/deployments/gpt-4o/chat/completions"
        "?api-version=2024-10-21",
        JSON,
        dumps(
            {
                "id": "chatcmpl-az",
                "object": "chat.completion",
                "choices": [],
                "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {}}],
                "usage": {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42},
            }
        ),
        42,
        request_headers={"api-key": "0123456789abcdef0123456789abcdef"},
    ),
    "anthropic-messages": Case(
        "https://api.anthropic.com/v1/messages",
        JSON,
        dumps(
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-5",
                "content": [{"type": "text", "text": "Hi!"}],
                "stop_reason": "end_turn",
                "usage": {
                    "input_tokens": 100,
                    "cache_creation_input_tokens": 20,
                    "cache_read_input_tokens": 30,
                    "output_tokens": 50,
                },
            }
        ),
        200,
        request_headers={"x-api-key": "sk-ant-api03-transport-c3d4"},
    ),
    "gemini-generate": Case(
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent",
        JSON,
        dumps(
            {
                "candidates": [
                    {
                        "content": {"parts": [{"text": "Hi"}], "role": "model"},
                        "finishReason": "STOP",
                    }
                ],
                "usageMetadata": {
                    "promptTokenCount": 20,
                    "candidatesTokenCount": 30,
                    "thoughtsTokenCount": 20,
                    "totalTokenCount": 70,
                },
            }
        ),
        70,
        request_headers={"x-goog-api-key": "AIzaSy-transport-test-e5f6"},
    ),
    "bedrock-converse": Case(
        "https://bedrock-runtime.us-east-1.amazonaws.com/model/amazon.nova-lite-v1%3A0/converse",
        JSON,
        dumps(
            {
                "output": {"message": {"role": "assistant", "content": [{"text": "Hi"}]}},
                "stopReason": "end_turn",
                "usage": {"inputTokens": 30, "outputTokens": 12, "totalTokens": 42},
                "metrics": {"latencyMs": 321},
            }
        ),
        42,
        request_headers={
            "Authorization": "AWS4-HMAC-SHA256 Credential=AKIATRANSPORTTEST/20260101/"
            "us-east-1/bedrock/aws4_request, SignedHeaders=host;x-amz-date, Signature=abc"
        },
    ),
    "bedrock-invoke": Case(
        "https://bedrock-runtime.us-east-1.amazonaws.com/model/meta.llama3-8b-instruct-v1%3A0/invoke",
        JSON,
        dumps({"generation": "Hi", "stop_reason": "stop"}),
        33,
        response_headers={
            "x-amzn-bedrock-input-token-count": "11",
            "x-amzn-bedrock-output-token-count": "22",
        },
    ),
    "cohere-chat": Case(
        "https://api.cohere.com/v2/chat",
        JSON,
        dumps(
            {
                "id": "c1",
                "finish_reason": "COMPLETE",
                "message": {"role": "assistant", "content": [{"type": "text", "text": "Hi"}]},
                "usage": {
                    "billed_units": {"input_tokens": 5.0, "output_tokens": 8.0},
                    "tokens": {"input_tokens": 71.0, "output_tokens": 8.0},
                },
            }
        ),
        79,
        request_headers={"Authorization": "bearer co-transport-test-g7h8"},
    ),
    "ollama-chat": Case(
        "http://localhost:11434/api/chat",
        JSON,
        dumps(
            {
                "model": "llama3.2",
                "message": {"role": "assistant", "content": "Hi"},
                "done": True,
                "prompt_eval_count": 26,
                "eval_count": 298,
            }
        ),
        324,
    ),
    "vllm-chat": Case(
        "http://127.0.0.1:8000/v1/chat/completions",
        JSON,
        dumps(
            {
                "id": "cmpl-v",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}}],
                "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
            }
        ),
        12,
    ),
    # -- streams --------------------------------------------------------------------------------
    "openai-chat-stream": Case(
        f"{OPENAI}/chat/completions",
        SSE,
        sse(
            (None, _chat_chunk("Hel")),
            (None, _chat_chunk("lo")),
            (None, _chat_chunk("", finish="stop")),
            (None, _chat_chunk(None, usage=CHAT_USAGE)),
            (None, "[DONE]"),
        ),
        25,
        request_headers=BEARER,
    ),
    "azure-chat-stream": Case(
        "https://contoso.openai.azure.com/openai/deployments/gpt-4o/chat/completions"
        "?api-version=2024-10-21",
        SSE,
        sse(
            (None, {"choices": [], "prompt_filter_results": [{"prompt_index": 0}]}),
            (None, _chat_chunk("Hi")),
            (
                None,
                _chat_chunk(
                    None,
                    usage={"prompt_tokens": 30, "completion_tokens": 2, "total_tokens": 32},
                ),
            ),
            (None, "[DONE]"),
        ),
        32,
        request_headers={"api-key": "0123456789abcdef0123456789abcdef"},
    ),
    "openai-responses-stream": Case(
        f"{OPENAI}/responses",
        SSE,
        sse(
            ("response.created", {"type": "response.created", "response": {"id": "r1"}}),
            ("response.output_text.delta", {"type": "response.output_text.delta", "delta": "Hi"}),
            (
                "response.completed",
                {
                    "type": "response.completed",
                    "response": {
                        "id": "r1",
                        "status": "completed",
                        "usage": {"input_tokens": 40, "output_tokens": 20, "total_tokens": 60},
                    },
                },
            ),
        ),
        60,
        request_headers=BEARER,
    ),
    "anthropic-stream": Case(
        "https://api.anthropic.com/v1/messages",
        SSE,
        sse(
            (
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": "msg_1",
                        "type": "message",
                        "role": "assistant",
                        "content": [],
                        "model": "claude-sonnet-4-5",
                        "usage": {
                            "input_tokens": 25,
                            "cache_creation_input_tokens": 0,
                            "cache_read_input_tokens": 0,
                            "output_tokens": 1,
                        },
                    },
                },
            ),
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
            ),
            ("ping", {"type": "ping"}),
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": "Hi!"},
                },
            ),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": 15},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ),
        40,  # 25 input + 15 cumulative output (the 1 of message_start is replaced, not added)
        request_headers={"x-api-key": "sk-ant-api03-transport-c3d4"},
    ),
    "gemini-stream": Case(
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash"
        ":streamGenerateContent?alt=sse&key=AIzaSy-query-key-i9j0",
        SSE,
        sse(
            (
                None,
                {
                    "candidates": [{"content": {"parts": [{"text": "Hel"}], "role": "model"}}],
                    "usageMetadata": {"promptTokenCount": 20, "totalTokenCount": 21},
                },
            ),
            (
                None,
                {
                    "candidates": [
                        {"content": {"parts": [{"text": "lo"}]}, "finishReason": "STOP"}
                    ],
                    "usageMetadata": {
                        "promptTokenCount": 20,
                        "candidatesTokenCount": 13,
                        "totalTokenCount": 33,
                    },
                },
            ),
            eol="\r\n",
        ),
        33,
    ),
    "gemini-json-array-stream": Case(
        "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash"
        ":streamGenerateContent",
        JSON,
        dumps(
            [
                {
                    "candidates": [{"content": {"parts": [{"text": "Hel"}]}}],
                    "usageMetadata": {"promptTokenCount": 20, "totalTokenCount": 21},
                },
                {
                    "candidates": [
                        {"content": {"parts": [{"text": "lo"}]}, "finishReason": "STOP"}
                    ],
                    "usageMetadata": {
                        "promptTokenCount": 20,
                        "candidatesTokenCount": 9,
                        "totalTokenCount": 29,
                    },
                },
            ]
        ),
        29,
        request_headers={"x-goog-api-key": "AIzaSy-transport-test-e5f6"},
    ),
    "cohere-stream": Case(
        "https://api.cohere.com/v2/chat",
        SSE,
        sse(
            ("message-start", {"type": "message-start", "id": "c1"}),
            (
                "content-delta",
                {
                    "type": "content-delta",
                    "index": 0,
                    "delta": {"message": {"content": {"text": "Hi"}}},
                },
            ),
            (
                "message-end",
                {
                    "type": "message-end",
                    "delta": {
                        "finish_reason": "COMPLETE",
                        "usage": {
                            "billed_units": {"input_tokens": 3.0, "output_tokens": 2.0},
                            "tokens": {"input_tokens": 21.0, "output_tokens": 9.0},
                        },
                    },
                },
            ),
        ),
        30,
        request_headers={"Authorization": "Bearer co-transport-test-g7h8"},
    ),
    "mistral-stream": Case(
        "https://api.mistral.ai/v1/chat/completions",
        SSE,
        sse(
            (None, _chat_chunk("Hi")),
            (
                None,
                _chat_chunk(
                    "!",
                    finish="stop",
                    usage={"prompt_tokens": 31, "completion_tokens": 9, "total_tokens": 40},
                ),
            ),
            (None, "[DONE]"),
        ),
        40,
        request_headers={"Authorization": "Bearer mistral-transport-k1l2"},
    ),
    "groq-stream": Case(
        "https://api.groq.com/openai/v1/chat/completions",
        SSE,
        sse(
            (None, {**_chat_chunk("Hi"), "x_groq": {"id": "req_1"}}),
            (
                None,
                {
                    **_chat_chunk("", finish="stop"),
                    "x_groq": {
                        "id": "req_1",
                        "usage": {"prompt_tokens": 40, "completion_tokens": 10, "total_tokens": 50},
                    },
                },
            ),
            (None, "[DONE]"),
        ),
        50,
        request_headers={"Authorization": "Bearer gsk_transport_m3n4"},
    ),
    "openrouter-stream": Case(
        "https://openrouter.ai/api/v1/chat/completions",
        SSE,
        b": OPENROUTER PROCESSING\n\n"
        + sse((None, _chat_chunk("Hi")))
        + b": OPENROUTER PROCESSING\n\n"
        + sse(
            (
                None,
                _chat_chunk(
                    "",
                    finish="stop",
                    usage={
                        "prompt_tokens": 12,
                        "completion_tokens": 5,
                        "total_tokens": 17,
                        "cost": 0.0001,
                    },
                ),
            ),
            (None, "[DONE]"),
        ),
        17,
        request_headers={"Authorization": "Bearer sk-or-v1-transport-o5p6"},
    ),
    "vllm-continuous-stream": Case(
        "http://127.0.0.1:8000/v1/chat/completions",
        SSE,
        sse(
            *(
                (
                    None,
                    _chat_chunk(
                        "x",
                        usage={
                            "prompt_tokens": 10,
                            "completion_tokens": n,
                            "total_tokens": 10 + n,
                        },
                    ),
                )
                for n in range(1, 6)
            ),
            (None, "[DONE]"),
        ),
        15,  # running totals: the last wins (summing would give 65)
    ),
    "ollama-ndjson-stream": Case(
        "http://localhost:11434/api/generate",
        NDJSON,
        ndjson(
            {"model": "llama3.2", "response": "Hel", "done": False},
            {"model": "llama3.2", "response": "lo", "done": False},
            {
                "model": "llama3.2",
                "response": "",
                "done": True,
                "done_reason": "stop",
                "prompt_eval_count": 26,
                "eval_count": 290,
            },
        ),
        316,
    ),
    "bedrock-converse-stream": Case(
        "https://bedrock-runtime.us-east-1.amazonaws.com/model/amazon.nova-lite-v1%3A0"
        "/converse-stream",
        EVENTSTREAM,
        eventstream(
            ("messageStart", {"role": "assistant", "p": "abcd"}),
            ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Hi"}}),
            ("messageStop", {"stopReason": "end_turn"}),
            (
                "metadata",
                {
                    "usage": {"inputTokens": 18, "outputTokens": 9, "totalTokens": 27},
                    "metrics": {"latencyMs": 250},
                },
            ),
        ),
        27,
        request_headers={
            "Authorization": "AWS4-HMAC-SHA256 Credential=AKIATRANSPORTTEST/20260101/"
            "us-east-1/bedrock/aws4_request, SignedHeaders=host, Signature=def"
        },
    ),
    # -- calls that count nothing by design ------------------------------------------------------
    "anthropic-count-tokens": Case(
        "https://api.anthropic.com/v1/messages/count_tokens",
        JSON,
        dumps({"input_tokens": 2095}),
        0,
        request_headers={"x-api-key": "sk-ant-api03-transport-c3d4"},
        counts_nothing=True,
    ),
    "openai-input-tokens": Case(
        f"{OPENAI}/responses/input_tokens",
        JSON,
        dumps({"object": "response.input_tokens", "input_tokens": 11}),
        0,
        request_headers=BEARER,
        counts_nothing=True,
    ),
    "openai-get-retrieval": Case(
        f"{OPENAI}/responses/resp_1",
        JSON,
        dumps(
            {
                "id": "resp_1",
                "object": "response",
                "usage": {"input_tokens": 40, "output_tokens": 20, "total_tokens": 60},
            }
        ),
        0,
        method="GET",
        request_headers=BEARER,
        counts_nothing=True,
    ),
    "openai-error-429": Case(
        f"{OPENAI}/chat/completions",
        JSON,
        dumps({"error": {"message": "Rate limit reached", "type": "requests", "code": None}}),
        0,
        status=429,
        request_headers=BEARER,
        counts_nothing=True,
    ),
    "anthropic-error-529": Case(
        "https://api.anthropic.com/v1/messages",
        JSON,
        dumps({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        0,
        status=529,
        request_headers={"x-api-key": "sk-ant-api03-transport-c3d4"},
        counts_nothing=True,
    ),
    # -- a stream that carries no usage ----------------------------------------------------------
    "openai-chat-stream-no-usage": Case(
        f"{OPENAI}/chat/completions",
        SSE,
        sse(
            (None, _chat_chunk("Hello, ")),
            (None, _chat_chunk("world, how are you today?", finish="stop")),
            (None, "[DONE]"),
        ),
        None,
        request_headers=BEARER,
    ),
}

COUNTED = {name: case for name, case in CASES.items() if case.total}
