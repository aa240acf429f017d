"""A fake LLM API that always asks for a tool: the perfect runaway agent, on loopback.

It speaks the four wire formats the agent frameworks use, each JSON or streamed (SSE):

* OpenAI Chat Completions (``POST /v1/chat/completions``); a stream carries its usage only
  when the request asks with ``stream_options.include_usage``, as the real API does;
* OpenAI Responses (``POST /v1/responses``), usage in ``response.completed``;
* Anthropic Messages (``POST /v1/messages``), usage in ``message_start``/``message_delta``;
* Gemini (``POST /v1beta/models/M:generateContent`` and ``:streamGenerateContent?alt=sse``).

Every answer costs ``CALL_TOKENS`` and, when the request offers tools, calls the first one:
an agent framework then runs the tool and asks again, forever. ``hits`` records the
credential and path of every request that reached the server, which is what the tests count.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tests.transport.llm_server import LLMServer, Receive, Scope, Send, read_body

#: What one call costs: the default cold-start ceiling (100,000/min without the largest call)
#: trips on the third.
PROMPT_TOKENS = 50_000
OUTPUT_TOKENS = 10_000
CALL_TOKENS = PROMPT_TOKENS + OUTPUT_TOKENS

Json = dict[str, Any]


@dataclass(frozen=True)
class Hit:
    """One request that reached the server."""

    path: str
    credential: str
    stream: bool


class AgentServer(LLMServer):
    """The stub on real sockets (uvicorn in a thread), with per-credential request counts."""

    def __init__(self) -> None:
        super().__init__()
        self.base = f"http://127.0.0.1:{self.port}"
        self.hits: list[Hit] = []
        self._ids = itertools.count(1)

    def count(self, credential: str | None = None) -> int:
        """How many requests reached the server (for one credential, if given)."""
        if credential is None:
            return len(self.hits)
        return Counter(hit.credential for hit in self.hits)[credential]

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        request: Json = json.loads(await read_body(receive) or b"{}")
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        path: str = scope["path"]
        stream = bool(request.get("stream")) or path.endswith(":streamGenerateContent")
        self.hits.append(Hit(path, _credential(headers, scope["query_string"]), stream))
        number = next(self._ids)
        if path.endswith("/chat/completions"):
            answer = _chat(request, number, stream)
        elif path.endswith("/responses"):
            answer = _responses(request, number, stream)
        elif path.endswith("/messages"):
            answer = _messages(request, number, stream)
        elif ":generateContent" in path or ":streamGenerateContent" in path:
            answer = _gemini(request, stream)
        else:
            await _send_json(send, 404, {"error": {"message": f"no route {path}"}})
            return
        if isinstance(answer, dict):
            await _send_json(send, 200, answer)
            return
        start = {"type": "http.response.start", "status": 200}
        await send({**start, "headers": [(b"content-type", b"text/event-stream")]})
        for event in answer:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def _credential(headers: dict[str, str], query: bytes) -> str:
    for name in ("x-api-key", "x-goog-api-key", "api-key"):
        if name in headers:
            return headers[name]
    authorization = headers.get("authorization", "")
    if authorization.lower().startswith("bearer "):
        return authorization[7:]
    for pair in query.decode().split("&"):
        name, _, value = pair.partition("=")
        if name == "key":
            return value
    return ""


async def _send_json(send: Send, status: int, payload: Json) -> None:
    start = {"type": "http.response.start", "status": status}
    await send({**start, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": json.dumps(payload).encode()})


def _sse(payload: Json | str, event: str | None = None) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data}\n\n".encode()


def _first_tool(tools: Any, *path: str) -> str | None:
    """The name of the first tool offered, found by following ``path`` into each tool."""
    for tool in tools or ():
        value: Any = tool
        for step in path:
            value = value.get(step) if isinstance(value, dict) else None
        if isinstance(value, str):
            return value
    return None


# --- OpenAI Chat Completions ---------------------------------------------------------------


def _chat(request: Json, number: int, stream: bool) -> Json | Iterator[bytes]:
    tool = _first_tool(request.get("tools"), "function", "name")
    usage = {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": OUTPUT_TOKENS,
        "total_tokens": CALL_TOKENS,
    }
    call = {
        "index": 0,
        "id": f"call_{number}",
        "type": "function",
        "function": {"name": tool, "arguments": "{}"},
    }
    message: Json = {"role": "assistant", "content": None if tool else "ok"}
    if tool:
        message["tool_calls"] = [{k: v for k, v in call.items() if k != "index"}]
    finish = "tool_calls" if tool else "stop"
    head = {"id": f"chatcmpl-{number}", "created": 1_767_225_600, "model": "stub"}
    if not stream:
        choice = {"index": 0, "message": message, "finish_reason": finish}
        return {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
    include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
    return _chat_events(head, message, finish, usage if include_usage else None)


def _chat_events(head: Json, message: Json, finish: str, usage: Json | None) -> Iterator[bytes]:
    chunk = {**head, "object": "chat.completion.chunk"}

    def event(delta: Json, finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        return _sse({**chunk, "choices": [choice]})

    calls = message.get("tool_calls")
    if calls:
        call = calls[0]
        started = {
            **call,
            "index": 0,
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        yield event({"role": "assistant", "content": None, "tool_calls": [started]})
        yield event({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]})
    else:
        yield event({"role": "assistant", "content": message["content"]})
    yield event({}, finish)
    if usage is not None:
        yield _sse({**chunk, "choices": [], "usage": usage})
    yield _sse("[DONE]")


# --- OpenAI Responses ----------------------------------------------------------------------


def _responses(request: Json, number: int, stream: bool) -> Json | Iterator[bytes]:
    tool = _first_tool(request.get("tools"), "name")
    if tool:
        item: Json = {
            "type": "function_call",
            "id": f"fc_{number}",
            "call_id": f"call_{number}",
            "name": tool,
            "arguments": "{}",
            "status": "completed",
        }
    else:
        text = {"type": "output_text", "text": "ok", "annotations": []}
        item = {
            "type": "message",
            "id": f"msg_{number}",
            "role": "assistant",
            "status": "completed",
            "content": [text],
        }
    done: Json = {
        "id": f"resp_{number}",
        "object": "response",
        "created_at": 1_767_225_600,
        "model": request.get("model", "stub"),
        "status": "completed",
        "output": [item],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": PROMPT_TOKENS,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": OUTPUT_TOKENS,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": CALL_TOKENS,
        },
    }
    if not stream:
        return done
    return _responses_events(done, item)


def _responses_events(done: Json, item: Json) -> Iterator[bytes]:
    started = {**done, "status": "in_progress", "output": [], "usage": None}
    events: list[tuple[str, Json]] = [
        ("response.created", {"response": started}),
        ("response.in_progress", {"response": started}),
        ("response.output_item.added", {"output_index": 0, "item": item}),
        ("response.output_item.done", {"output_index": 0, "item": item}),
        ("response.completed", {"response": done}),
    ]
    for number, (kind, payload) in enumerate(events):
        yield _sse({"type": kind, "sequence_number": number, **payload}, kind)


# --- Anthropic Messages --------------------------------------------------------------------


def _messages(request: Json, number: int, stream: bool) -> Json | Iterator[bytes]:
    tool = _first_tool(request.get("tools"), "name")
    block: Json = (
        {"type": "tool_use", "id": f"toolu_{number}", "name": tool, "input": {}}
        if tool
        else {"type": "text", "text": "ok"}
    )
    message: Json = {
        "id": f"msg_{number}",
        "type": "message",
        "role": "assistant",
        "model": request.get("model", "stub"),
        "content": [block],
        "stop_reason": "tool_use" if tool else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": PROMPT_TOKENS, "output_tokens": OUTPUT_TOKENS},
    }
    if not stream:
        return message
    return _messages_events(message, block)


def _messages_events(message: Json, block: Json) -> Iterator[bytes]:
    started = {
        **message,
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": PROMPT_TOKENS, "output_tokens": 1},
    }
    if block["type"] == "tool_use":
        opened: Json = {**block, "input": {}}
        delta: Json = {"type": "input_json_delta", "partial_json": "{}"}
    else:
        opened = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": block["text"]}
    events: list[Json] = [
        {"type": "message_start", "message": started},
        {"type": "content_block_start", "index": 0, "content_block": opened},
        {"type": "content_block_delta", "index": 0, "delta": delta},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": OUTPUT_TOKENS},
        },
        {"type": "message_stop"},
    ]
    for event in events:
        yield _sse(event, event["type"])


# --- Gemini --------------------------------------------------------------------------------


def _gemini(request: Json, stream: bool) -> Json | Iterator[bytes]:
    declarations = [
        declaration
        for tool in request.get("tools") or ()
        for declaration in tool.get("functionDeclarations")
        or tool.get("function_declarations")
        or ()
    ]
    tool = _first_tool(declarations, "name")
    part: Json = {"functionCall": {"name": tool, "args": {}}} if tool else {"text": "ok"}
    answer: Json = {
        "candidates": [
            {"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}
        ],
        "usageMetadata": {
            "promptTokenCount": PROMPT_TOKENS,
            "candidatesTokenCount": OUTPUT_TOKENS,
            "totalTokenCount": CALL_TOKENS,
        },
        "modelVersion": "stub",
    }
    if not stream:
        return answer
    return iter([_sse(answer)])
