"""Recorded-shape response bodies and streams for every provider, plus encoders.

The bodies are written by hand in the providers' real shapes (field names checked against the
openai and anthropic SDK types and the providers' API references); ids and text are shortened.
"""

from __future__ import annotations

import base64
import gzip
import json
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import brotli

from tokenfuse._usage import ExtractorRegistry, Usage, UsageReader, default_registry

OPENAI = "https://api.openai.com"
AZURE = "https://contoso.openai.azure.com/openai/deployments/gpt-4o"
AZURE_QUERY = "?api-version=2024-10-21"
ANTHROPIC = "https://api.anthropic.com"
GEMINI = "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash"
BEDROCK = "https://bedrock-runtime.us-east-1.amazonaws.com/model"
CLAUDE_ON_BEDROCK = "anthropic.claude-3-5-sonnet-20240620-v1%3A0"

JSON = "application/json"
SSE = "text/event-stream"
NDJSON = "application/x-ndjson"
EVENTSTREAM = "application/vnd.amazon.eventstream"


@dataclass(frozen=True)
class Sample:
    """One response: where it came from, its body, and the total the provider reports."""

    url: str
    content_type: str
    body: bytes
    total: float
    provider: str
    input: float | None = None
    output: float | None = None
    headers: dict[str, str] = field(default_factory=dict)


def dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def sse(*events: tuple[str | None, object], crlf: bool = False) -> bytes:
    """An SSE stream; an event is (name or None, JSON object or raw str data)."""
    out = []
    for name, data in events:
        text = data if isinstance(data, str) else json.dumps(data)
        lines = ([f"event: {name}"] if name else []) + [f"data: {text}", ""]
        out.append("\n".join(lines) + "\n")
    body = "".join(out)
    return (body.replace("\n", "\r\n") if crlf else body).encode()


def ndjson(*objects: object) -> bytes:
    return b"".join(dumps(obj) + b"\n" for obj in objects)


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    return (
        bytes([len(raw_name)]) + raw_name + b"\x07" + struct.pack(">H", len(raw_value)) + raw_value
    )


def eventstream_message(event_type: str, payload: bytes, message_type: str = "event") -> bytes:
    """One AWS eventstream message, CRCs included."""
    headers = _header(":event-type", event_type) + _header(":content-type", JSON)
    headers += _header(":message-type", message_type)
    total = 12 + len(headers) + len(payload) + 4
    prelude = struct.pack(">II", total, len(headers))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    message = prelude + headers + payload
    return message + struct.pack(">I", zlib.crc32(message))


def eventstream(*events: tuple[str, object]) -> bytes:
    return b"".join(eventstream_message(name, dumps(obj)) for name, obj in events)


def compress(body: bytes, coding: str) -> bytes:
    if coding == "gzip":
        return gzip.compress(body)
    if coding == "deflate":
        return zlib.compress(body)
    if coding == "raw-deflate":
        packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        return packer.compress(body) + packer.flush()
    if coding == "br":
        return bytes(brotli.compress(body))
    assert coding == "identity"
    return body


# -- OpenAI family: non-streaming -----------------------------------------------------------

CHAT_USAGE = {
    "prompt_tokens": 1117,
    "completion_tokens": 46,
    "total_tokens": 1163,
    "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
    "completion_tokens_details": {
        "reasoning_tokens": 0,
        "audio_tokens": 0,
        "accepted_prediction_tokens": 0,
        "rejected_prediction_tokens": 0,
    },
}


def chat_completion(usage: object = CHAT_USAGE, **extra: object) -> dict[str, object]:
    return {
        "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
        "object": "chat.completion",
        "created": 1741570283,
        "model": "gpt-4o-2024-08-06",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "The image shows a wooden boardwalk\u2028through tall grass.",
                    "refusal": None,
                    "annotations": [],
                },
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": usage,
        "service_tier": "default",
        "system_fingerprint": "fp_fc9f1d7035",
        **extra,
    }


OPENAI_CHAT = Sample(
    f"{OPENAI}/v1/chat/completions", JSON, dumps(chat_completion()), 1163, "openai", 1117, 46
)
OPENAI_COMPLETION = Sample(
    f"{OPENAI}/v1/completions",
    JSON,
    dumps(
        {
            "id": "cmpl-uqkvlQyYK7bGYrRHQ0eXlWi7",
            "object": "text_completion",
            "created": 1589478378,
            "model": "gpt-3.5-turbo-instruct",
            "choices": [
                {
                    "text": "\n\nThis is a test",
                    "index": 0,
                    "logprobs": None,
                    "finish_reason": "length",
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
        }
    ),
    12,
    "openai",
    5,
    7,
)
RESPONSES_USAGE = {
    "input_tokens": 328,
    "input_tokens_details": {"cached_tokens": 128},
    "output_tokens": 52,
    "output_tokens_details": {"reasoning_tokens": 20},
    "total_tokens": 380,
}


def response_object(
    status: str = "completed", usage: object = RESPONSES_USAGE
) -> dict[str, object]:
    return {
        "id": "resp_67ccd3a9da748190baa7f1570fe91ac604becb25c45c1d41",
        "object": "response",
        "created_at": 1741476777,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "model": "gpt-4o-2024-08-06",
        "output": [
            {
                "type": "message",
                "id": "msg_67ccd3acc8d48190a77525dc6de64b4104becb25c45c1d41",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "A boardwalk.", "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "reasoning": {"effort": None, "summary": None},
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "usage": usage,
        "metadata": {},
    }


OPENAI_RESPONSES = Sample(
    f"{OPENAI}/v1/responses", JSON, dumps(response_object()), 380, "openai", 328, 52
)


def embeddings_body(inputs: int, dims: int = 1536) -> bytes:
    vector = base64.b64encode(struct.pack(f"<{dims}f", *([0.0123] * dims))).decode()
    data = [{"object": "embedding", "index": i, "embedding": vector} for i in range(inputs)]
    tokens = 8 * inputs
    return dumps(
        {
            "object": "list",
            "data": data,
            "model": "text-embedding-3-small",
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


OPENAI_EMBEDDINGS = Sample(f"{OPENAI}/v1/embeddings", JSON, embeddings_body(2), 16, "openai", 16)
AZURE_CHAT = Sample(
    f"{AZURE}/chat/completions{AZURE_QUERY}",
    JSON,
    dumps(
        chat_completion(
            prompt_filter_results=[
                {
                    "prompt_index": 0,
                    "content_filter_results": {"hate": {"filtered": False, "severity": "safe"}},
                }
            ]
        )
    ),
    1163,
    "azure",
    1117,
    46,
)
MISTRAL_CHAT = Sample(
    "https://api.mistral.ai/v1/chat/completions",
    JSON,
    # Mistral serialises usage before choices.
    b'{"id":"cmpl-e5cc70bb28c444948073e77776eb30ef","object":"chat.completion",'
    b'"model":"mistral-small-latest","usage":{"prompt_tokens":16,"completion_tokens":34,'
    b'"total_tokens":50},"created":1702256327,"choices":[{"index":0,"message":{"role":'
    b'"assistant","content":"Bonjour","tool_calls":null},"finish_reason":"stop"}]}',
    50,
    "mistral",
    16,
    34,
)
GROQ_CHAT = Sample(
    "https://api.groq.com/openai/v1/chat/completions",
    JSON,
    dumps(
        chat_completion(
            usage={
                "queue_time": 0.037,
                "prompt_tokens": 18,
                "prompt_time": 0.00068,
                "completion_tokens": 556,
                "completion_time": 0.463,
                "total_tokens": 574,
                "total_time": 0.464,
            },
            x_groq={"id": "req_01jbd6g2qdfw2adyrt2az8hz4w"},
        )
    ),
    574,
    "groq",
    18,
    556,
)

# -- Anthropic, Gemini, Bedrock, Cohere, Ollama: non-streaming ------------------------------

ANTHROPIC_MESSAGE = Sample(
    f"{ANTHROPIC}/v1/messages",
    JSON,
    dumps(
        {
            "id": "msg_013Zva2CMHLNnXjNJJKqJ2EF",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5-20250929",
            "content": [{"type": "text", "text": "Hi! My name is Claude."}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": 2095,
                "cache_creation_input_tokens": 2051,
                "cache_read_input_tokens": 0,
                "cache_creation": {
                    "ephemeral_5m_input_tokens": 2051,
                    "ephemeral_1h_input_tokens": 0,
                },
                "output_tokens": 503,
                "service_tier": "standard",
            },
        }
    ),
    2095 + 2051 + 0 + 503,
    "anthropic",
    2095 + 2051,
    503,
)


def gemini_chunk(text: str, usage: Mapping[str, object], finish: bool = False) -> dict[str, object]:
    candidate: dict[str, object] = {
        "content": {"parts": [{"text": text}], "role": "model"},
        "index": 0,
    }
    if finish:
        candidate["finishReason"] = "STOP"
    return {
        "candidates": [candidate],
        "usageMetadata": usage,
        "modelVersion": "gemini-2.5-flash",
        "responseId": "mAitaJ2bM8TXz7IPkOTQyAg",
    }


GEMINI_USAGE = {
    "promptTokenCount": 8,
    "candidatesTokenCount": 215,
    "totalTokenCount": 1187,
    "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 8}],
    "thoughtsTokenCount": 964,
}
GEMINI_GENERATE = Sample(
    f"{GEMINI}:generateContent",
    JSON,
    dumps(gemini_chunk("Paris.", GEMINI_USAGE, finish=True)),
    1187,  # not 8 + 215: thinking tokens count too
    "gemini",
    8,
    215 + 964,
)
VERTEX_GENERATE = Sample(
    "https://us-central1-aiplatform.googleapis.com/v1/projects/p/locations/us-central1/"
    "publishers/google/models/gemini-2.5-flash:generateContent",
    JSON,
    GEMINI_GENERATE.body,
    1187,
    "gemini",
    8,
    215 + 964,
)
BEDROCK_CONVERSE = Sample(
    f"{BEDROCK}/{CLAUDE_ON_BEDROCK}/converse",
    JSON,
    dumps(
        {
            "output": {"message": {"role": "assistant", "content": [{"text": "Hello."}]}},
            "stopReason": "end_turn",
            "usage": {
                "inputTokens": 30,
                "outputTokens": 628,
                "totalTokens": 658,
                "cacheReadInputTokens": 0,
                "cacheWriteInputTokens": 0,
            },
            "metrics": {"latencyMs": 1275},
        }
    ),
    658,
    "bedrock",
    30,
    628,
)
BEDROCK_INVOKE = Sample(
    f"{BEDROCK}/{CLAUDE_ON_BEDROCK}/invoke",
    JSON,
    dumps(
        {
            "id": "msg_bdrk_01",
            "type": "message",
            "content": [{"type": "text", "text": "Hi"}],
            "usage": {"input_tokens": 25, "output_tokens": 120},
        }
    ),
    145,
    "bedrock",
    25,
    120,
    headers={"X-Amzn-Bedrock-Input-Token-Count": "25", "X-Amzn-Bedrock-Output-Token-Count": "120"},
)
COHERE_CHAT = Sample(
    "https://api.cohere.com/v2/chat",
    JSON,
    dumps(
        {
            "id": "c14c80c3-18eb-4519-9460-6c92edd8cfb4",
            "finish_reason": "COMPLETE",
            "message": {"role": "assistant", "content": [{"type": "text", "text": "LLMs are"}]},
            "usage": {
                "billed_units": {"input_tokens": 5, "output_tokens": 418},
                "tokens": {"input_tokens": 71.0, "output_tokens": 418.0},
            },
        }
    ),
    489,  # tokens, not billed_units
    "cohere",
    71,
    418,
)
OLLAMA_DONE = {
    "model": "llama3.2",
    "created_at": "2023-12-12T14:13:43.416799Z",
    "message": {"role": "assistant", "content": ""},
    "done": True,
    "done_reason": "stop",
    "total_duration": 5191566416,
    "load_duration": 2154458,
    "prompt_eval_count": 26,
    "prompt_eval_duration": 383809000,
    "eval_count": 298,
    "eval_duration": 4799921000,
}
OLLAMA_CHAT = Sample(
    "http://localhost:11434/api/chat",
    JSON,
    dumps({**OLLAMA_DONE, "message": {"role": "assistant", "content": "Hello! How are you?"}}),
    324,
    "ollama",
    26,
    298,
)
OLLAMA_GENERATE = Sample(
    "http://localhost:11434/api/generate",
    JSON,
    dumps(
        {
            **{k: v for k, v in OLLAMA_DONE.items() if k != "message"},
            "response": "The sky is blue because...",
            "context": list(range(1, 400)),
        }
    ),
    324,
    "ollama",
    26,
    298,
)
OLLAMA_EMBED = Sample(
    "http://localhost:11434/api/embed",
    JSON,
    dumps(
        {
            "model": "all-minilm",
            "embeddings": [[0.010071029, -0.0017594862, 0.05007221]],
            "total_duration": 14143917,
            "load_duration": 1019500,
            "prompt_eval_count": 8,
        }
    ),
    8,
    "ollama",
    8,
)
OLLAMA_OPENAI = Sample(
    "http://localhost:11434/v1/chat/completions",
    JSON,
    dumps(
        chat_completion(usage={"prompt_tokens": 26, "completion_tokens": 298, "total_tokens": 324})
    ),
    324,
    "openai-compatible",
    26,
    298,
)

BODIES = {
    "openai-chat": OPENAI_CHAT,
    "openai-completions": OPENAI_COMPLETION,
    "openai-responses": OPENAI_RESPONSES,
    "openai-embeddings": OPENAI_EMBEDDINGS,
    "azure-chat": AZURE_CHAT,
    "mistral-chat": MISTRAL_CHAT,
    "groq-chat": GROQ_CHAT,
    "anthropic-messages": ANTHROPIC_MESSAGE,
    "gemini-generate": GEMINI_GENERATE,
    "vertex-generate": VERTEX_GENERATE,
    "bedrock-converse": BEDROCK_CONVERSE,
    "bedrock-invoke": BEDROCK_INVOKE,
    "cohere-chat": COHERE_CHAT,
    "ollama-chat": OLLAMA_CHAT,
    "ollama-generate": OLLAMA_GENERATE,
    "ollama-embed": OLLAMA_EMBED,
    "ollama-openai": OLLAMA_OPENAI,
}

# -- Streams --------------------------------------------------------------------------------


def chat_chunk(
    content: str | None = None,
    *,
    finish: str | None = None,
    usage: object = None,
    choices: bool = True,
    **extra: object,
) -> dict[str, object]:
    chunk: dict[str, object] = {
        "id": "chatcmpl-123",
        "object": "chat.completion.chunk",
        "created": 1694268190,
        "model": "gpt-4o-mini",
        "system_fingerprint": "fp_44709d6fcb",
        "choices": [],
    }
    if choices:
        delta = {} if content is None else {"content": content}
        chunk["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    chunk.update(extra)
    if usage != "absent":
        chunk["usage"] = usage
    return chunk


WORDS = ["Hello", "!", " How", " can", " I", " help", " you", " today", "?"]
STREAM_USAGE = {
    "prompt_tokens": 9,
    "completion_tokens": 12,
    "total_tokens": 21,
    "prompt_tokens_details": {"cached_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 0},
}


def chat_stream(*, include_usage: bool = True, azure: bool = False) -> bytes:
    events: list[tuple[str | None, object]] = []
    absent = None if include_usage else "absent"
    if azure:  # Azure's first chunk: empty choices, prompt filter results, no usage
        events.append(
            (
                None,
                {
                    "choices": [],
                    "created": 0,
                    "id": "",
                    "model": "",
                    "object": "",
                    "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {}}],
                },
            )
        )
    events.append((None, chat_chunk("", usage=absent)))
    events += [(None, chat_chunk(word, usage=absent)) for word in WORDS]
    events.append((None, chat_chunk(finish="stop", usage=absent)))
    if include_usage:
        events.append((None, chat_chunk(choices=False, usage=STREAM_USAGE)))
    events.append((None, "[DONE]"))
    return sse(*events)


def responses_stream(final: str = "response.completed") -> bytes:
    created = response_object(status="in_progress", usage=None)
    created["output"] = []
    events: list[tuple[str | None, object]] = [
        (
            "response.created",
            {"type": "response.created", "sequence_number": 0, "response": created},
        ),
        (
            "response.in_progress",
            {"type": "response.in_progress", "sequence_number": 1, "response": created},
        ),
    ]
    for n, word in enumerate(WORDS):
        events.append(
            (
                "response.output_text.delta",
                {
                    "type": "response.output_text.delta",
                    "sequence_number": n + 2,
                    "item_id": "msg_67c",
                    "output_index": 0,
                    "content_index": 0,
                    "delta": word,
                },
            )
        )
    status = final.removeprefix("response.")
    events.append(
        (final, {"type": final, "sequence_number": 99, "response": response_object(status=status)})
    )
    return sse(*events)


ANTHROPIC_START_USAGE = {
    "input_tokens": 472,
    "cache_creation_input_tokens": 0,
    "cache_read_input_tokens": 1024,
    "output_tokens": 2,
}


def anthropic_stream(
    *,
    deltas: tuple[dict[str, object], ...] = ({"output_tokens": 15},),
    error_after_start: bool = False,
) -> bytes:
    events: list[tuple[str | None, object]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY",
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "model": "claude-sonnet-4-5-20250929",
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": ANTHROPIC_START_USAGE,
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
    ]
    events += [
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": word},
            },
        )
        for word in WORDS
    ]
    if error_after_start:
        events.append(
            (
                "error",
                {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            )
        )
        return sse(*events)
    events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
    events += [
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": usage,
            },
        )
        for usage in deltas
    ]
    events.append(("message_stop", {"type": "message_stop"}))
    return sse(*events)


GEMINI_RUNNING = [
    {"promptTokenCount": 9, "totalTokenCount": 9},
    {
        "promptTokenCount": 9,
        "candidatesTokenCount": 12,
        "totalTokenCount": 400,
        "thoughtsTokenCount": 379,
    },
    {
        "promptTokenCount": 9,
        "candidatesTokenCount": 30,
        "totalTokenCount": 418,
        "thoughtsTokenCount": 379,
    },
]


def gemini_chunks() -> list[dict[str, object]]:
    texts = ["The", " sky is", " blue."]
    return [
        gemini_chunk(text, usage, finish=i == 2)
        for i, (text, usage) in enumerate(zip(texts, GEMINI_RUNNING, strict=True))
    ]


def gemini_sse() -> bytes:
    return sse(*[(None, chunk) for chunk in gemini_chunks()], crlf=True)


def gemini_array() -> bytes:
    # Without alt=sse the stream is one pretty-printed JSON array, elements joined by ",\r\n".
    return ("[" + ",\r\n".join(json.dumps(c, indent=2) for c in gemini_chunks()) + "]").encode()


def converse_stream() -> bytes:
    return eventstream(
        ("messageStart", {"p": "abcdefgh", "role": "assistant"}),
        *[
            ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": w}, "p": "abcd"})
            for w in WORDS
        ],
        ("contentBlockStop", {"contentBlockIndex": 0, "p": "abcdefghijk"}),
        ("messageStop", {"p": "abcdefghijklmnop", "stopReason": "end_turn"}),
        (
            "metadata",
            {
                "metrics": {"latencyMs": 612},
                "p": "abc",
                "usage": {"inputTokens": 19, "outputTokens": 37, "totalTokens": 56},
            },
        ),
    )


def invoke_stream() -> bytes:
    inner = [
        {"type": "message_start", "message": {"usage": {"input_tokens": 16, "output_tokens": 1}}},
        *[
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": w}}
            for w in WORDS
        ],
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 40},
        },
        {
            "type": "message_stop",
            "amazon-bedrock-invocationMetrics": {
                "inputTokenCount": 16,
                "outputTokenCount": 40,
                "invocationLatency": 1020,
                "firstByteLatency": 310,
            },
        },
    ]
    return b"".join(
        eventstream_message(
            "chunk", dumps({"bytes": base64.b64encode(dumps(e)).decode(), "p": "abcd"})
        )
        for e in inner
    )


def cohere_stream() -> bytes:
    return sse(
        (
            "message-start",
            {
                "id": "29f14a5a-11de-4cae-9800-25e4747408ed",
                "type": "message-start",
                "delta": {
                    "message": {
                        "role": "assistant",
                        "content": [],
                        "tool_plan": "",
                        "tool_calls": [],
                        "citations": [],
                    }
                },
            },
        ),
        (
            "content-start",
            {
                "type": "content-start",
                "index": 0,
                "delta": {"message": {"content": {"type": "text", "text": ""}}},
            },
        ),
        *[
            (
                "content-delta",
                {
                    "type": "content-delta",
                    "index": 0,
                    "delta": {"message": {"content": {"text": w}}},
                },
            )
            for w in WORDS
        ],
        ("content-end", {"type": "content-end", "index": 0}),
        (
            "message-end",
            {
                "type": "message-end",
                "delta": {
                    "finish_reason": "COMPLETE",
                    "usage": {
                        "billed_units": {"input_tokens": 3, "output_tokens": 9},
                        "tokens": {"input_tokens": 69, "output_tokens": 9},
                    },
                },
            },
        ),
    )


def ollama_stream(*, cache_hit: bool = False) -> bytes:
    lines: list[object] = [
        {
            "model": "llama3.2",
            "created_at": "2023-08-04T08:52:19.385406455-07:00",
            "message": {"role": "assistant", "content": w},
            "done": False,
        }
        for w in WORDS
    ]
    done = dict(OLLAMA_DONE)
    if cache_hit:
        del done["prompt_eval_count"]
    lines.append(done)
    return ndjson(*lines)


def mistral_stream() -> bytes:
    return sse(
        *[(None, chat_chunk(w, usage="absent", model="mistral-small-latest")) for w in WORDS],
        (
            None,
            chat_chunk(
                "",
                finish="stop",
                model="mistral-small-latest",
                usage={"prompt_tokens": 10, "total_tokens": 25, "completion_tokens": 15},
            ),
        ),
        (None, "[DONE]"),
    )


def groq_stream() -> bytes:
    return sse(
        *[(None, chat_chunk(w, usage="absent", x_groq={"id": "req_01j"})) for w in WORDS],
        (
            None,
            chat_chunk(
                finish="stop",
                usage="absent",
                x_groq={
                    "id": "req_01j",
                    "usage": {
                        "queue_time": 0.02,
                        "prompt_tokens": 24,
                        "prompt_time": 0.002,
                        "completion_tokens": 70,
                        "completion_time": 0.058,
                        "total_tokens": 94,
                        "total_time": 0.06,
                    },
                },
            ),
        ),
        (None, "[DONE]"),
    )


def openrouter_stream() -> bytes:
    body = b": OPENROUTER PROCESSING\n\n: OPENROUTER PROCESSING\n\n"
    body += sse(
        *[(None, chat_chunk(w, usage="absent", provider="OpenAI")) for w in WORDS],
        (
            None,
            chat_chunk(
                "",
                usage={
                    "prompt_tokens": 14,
                    "completion_tokens": 163,
                    "total_tokens": 177,
                    "cost": 0.00168,
                    "prompt_tokens_details": {"cached_tokens": 0},
                    "completion_tokens_details": {"reasoning_tokens": 0},
                },
            ),
        ),
        (None, "[DONE]"),
    )
    return body


def vllm_stream() -> bytes:
    # continuous_usage_stats: running totals on every chunk; the last is the answer, not the sum.
    events: list[tuple[str | None, object]] = []
    for n, word in enumerate(WORDS, start=1):
        events.append(
            (
                None,
                chat_chunk(
                    word,
                    usage={"prompt_tokens": 10, "completion_tokens": n, "total_tokens": 10 + n},
                ),
            )
        )
    events.append((None, "[DONE]"))
    return sse(*events)


STREAMS = {
    "openai-chat": Sample(f"{OPENAI}/v1/chat/completions", SSE, chat_stream(), 21, "openai", 9, 12),
    "azure-chat": Sample(
        f"{AZURE}/chat/completions{AZURE_QUERY}", SSE, chat_stream(azure=True), 21, "azure", 9, 12
    ),
    "openai-responses": Sample(
        f"{OPENAI}/v1/responses", SSE, responses_stream(), 380, "openai", 328, 52
    ),
    "openai-responses-incomplete": Sample(
        f"{OPENAI}/v1/responses",
        SSE,
        responses_stream("response.incomplete"),
        380,
        "openai",
        328,
        52,
    ),
    "anthropic": Sample(
        f"{ANTHROPIC}/v1/messages", SSE, anthropic_stream(), 1511, "anthropic", 1496, 15
    ),
    "anthropic-cumulative": Sample(
        f"{ANTHROPIC}/v1/messages",
        SSE,
        anthropic_stream(
            deltas=(
                {"output_tokens": 10},
                {
                    "input_tokens": 472,
                    "cache_creation_input_tokens": None,
                    "cache_read_input_tokens": 1024,
                    "output_tokens": 15,
                },
            )
        ),
        1511,
        "anthropic",
        1496,
        15,
    ),
    "gemini-sse": Sample(
        f"{GEMINI}:streamGenerateContent?alt=sse", SSE, gemini_sse(), 418, "gemini", 9, 409
    ),
    "gemini-array": Sample(
        f"{GEMINI}:streamGenerateContent", JSON, gemini_array(), 418, "gemini", 9, 409
    ),
    "bedrock-converse-stream": Sample(
        f"{BEDROCK}/{CLAUDE_ON_BEDROCK}/converse-stream",
        EVENTSTREAM,
        converse_stream(),
        56,
        "bedrock",
        19,
        37,
    ),
    "bedrock-invoke-stream": Sample(
        f"{BEDROCK}/{CLAUDE_ON_BEDROCK}/invoke-with-response-stream",
        EVENTSTREAM,
        invoke_stream(),
        56,
        "bedrock",
        16,
        40,
    ),
    "cohere": Sample("https://api.cohere.com/v2/chat", SSE, cohere_stream(), 78, "cohere", 69, 9),
    "ollama": Sample(
        "http://localhost:11434/api/chat", NDJSON, ollama_stream(), 324, "ollama", 26, 298
    ),
    "mistral": Sample(
        "https://api.mistral.ai/v1/chat/completions", SSE, mistral_stream(), 25, "mistral", 10, 15
    ),
    "groq": Sample(
        "https://api.groq.com/openai/v1/chat/completions", SSE, groq_stream(), 94, "groq", 24, 70
    ),
    "openrouter": Sample(
        "https://openrouter.ai/api/v1/chat/completions",
        SSE,
        openrouter_stream(),
        177,
        "openrouter",
        14,
        163,
    ),
    "vllm": Sample(
        "http://localhost:8000/v1/chat/completions",
        SSE,
        vllm_stream(),
        19,
        "openai-compatible",
        10,
        9,
    ),
}


def reader_for(
    url: str,
    content_type: str | None = JSON,
    *,
    encoding: str | None = None,
    status: int = 200,
    method: str = "POST",
    headers: dict[str, str] | None = None,
    estimate: bool = False,
    registry: ExtractorRegistry = default_registry,
) -> UsageReader | None:
    response_headers = dict(headers or {})
    if content_type is not None:
        response_headers["Content-Type"] = content_type
    if encoding is not None:
        response_headers["Content-Encoding"] = encoding
    return registry.reader_for(
        method=method,
        url=url,
        status_code=status,
        request_headers={"Accept-Encoding": "gzip, deflate, br"},
        response_headers=response_headers,
        estimate=estimate,
    )


def read(
    sample: Sample,
    chunks: list[bytes] | None = None,
    *,
    coding: str = "identity",
    complete: bool = True,
    **kwargs: Any,
) -> Usage:
    """Feed a sample (or the given chunks of it) through the default registry's reader."""
    if "encoding" not in kwargs:
        kwargs["encoding"] = None if coding == "identity" else coding.removeprefix("raw-")
    reader = reader_for(sample.url, sample.content_type, headers=sample.headers, **kwargs)
    assert reader is not None
    for chunk in [compress(sample.body, coding)] if chunks is None else chunks:
        reader.feed(chunk)
    return reader.finish(complete=complete)


def split_at(body: bytes, *cuts: int) -> list[bytes]:
    bounds = [0, *sorted(cuts), len(body)]
    return [body[a:b] for a, b in pairwise(bounds)]


def assert_counts(usage: Usage, sample: Sample) -> None:
    assert usage.total == sample.total, usage
    assert (usage.provider, usage.partial, usage.estimated) == (sample.provider, False, False)
    assert usage.problem is None
    assert usage.input == sample.input
    assert usage.output == sample.output
