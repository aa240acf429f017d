"""A fake OpenAI-compatible server on real sockets: uvicorn on loopback, in a thread.

It answers ``POST /v1/chat/completions`` with a JSON body or (``"stream": true``) an SSE stream
sent with chunked transfer encoding, one event per write; compressed with gzip when the client
accepts it (flushed per event, as real APIs do). As OpenAI does, a stream reports its usage only
when the request asks with ``"stream_options": {"include_usage": true}``: then every chunk has
``"usage": null`` and a last chunk with empty ``choices`` holds the usage. A ``strict`` server
refuses any ``stream_options`` with a 400 naming the field, as servers that validate fields do.
With ``"pause": true`` it sends the first event, then waits until the test releases it: a
transport that held chunks back would never let the client see that first event.

The prompt is counted as a tokenizer roughly would: one token per word of the messages' text,
plus 4 per message (``PROMPT_TOKENS`` for a request without messages); each streamed chunk is
one completion token.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import zlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import uvicorn

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

_JSON = [(b"content-type", b"application/json")]
PROMPT_TOKENS = 12
STRICT_ERROR = {
    "error": {
        "message": "Unrecognized request argument supplied: stream_options",
        "type": "invalid_request_error",
        "param": "stream_options",
    }
}


def prompt_tokens(request: dict[str, Any]) -> int:
    """What the stub bills for a prompt: 1 token per word of the messages, 4 per message."""
    messages = request.get("messages")
    if not isinstance(messages, list):
        return PROMPT_TOKENS
    words = sum(len(str(message.get("content", "")).split()) for message in messages)
    return words + 4 * len(messages)


async def read_body(receive: Receive) -> bytes:
    """The whole body of an ASGI request."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


def chat_body(completion_tokens: int, prompt: int = PROMPT_TOKENS) -> bytes:
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + completion_tokens,
    }
    return json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "stub",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
            "usage": usage,
        }
    ).encode()


def _chunk(payload: dict[str, Any]) -> bytes:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "stub"}
    return b"data: " + json.dumps({**base, **payload}).encode() + b"\n\n"


def chat_events(chunks: int, *, usage: bool = True, prompt: int = PROMPT_TOKENS) -> list[bytes]:
    """``chunks`` content events, then (``usage``: as asked with ``include_usage``) the usage
    event, then [DONE]."""
    events = []
    for n in range(chunks):
        delta: dict[str, Any] = {"choices": [{"index": 0, "delta": {"content": f"tok{n} "}}]}
        if usage:
            delta["usage"] = None
        events.append(_chunk(delta))
    if usage:
        counts = {
            "prompt_tokens": prompt,
            "completion_tokens": chunks,
            "total_tokens": prompt + chunks,
        }
        events.append(_chunk({"choices": [], "usage": counts}))
    events.append(b"data: [DONE]\n\n")
    return events


class LLMServer:
    """The app and its server thread. ``release`` lets a paused stream go on."""

    def __init__(self, *, strict: bool = False) -> None:
        self.strict = strict
        self.release = threading.Event()
        self.released_in_time: list[bool] = []
        self.requests = 0
        self.bodies: list[bytes] = []  # as received
        self.billed: list[int] = []  # the total tokens of each answer, reported or not
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}/v1/chat/completions"
        config = uvicorn.Config(
            self.app,
            interface="asgi3",
            log_level="warning",
            lifespan="off",
            ws="none",
            access_log=False,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def __enter__(self) -> LLMServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:  # readiness, not timing: nothing is asserted on it
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the stub LLM server did not start")
            time.sleep(0.005)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._sock.close()

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        self.requests += 1
        body = await read_body(receive)
        self.bodies.append(body)
        options = json.loads(body or b"{}")
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        if self.strict and "stream_options" in options:
            error = json.dumps(STRICT_ERROR).encode()
            await send({"type": "http.response.start", "status": 400, "headers": _JSON})
            await send({"type": "http.response.body", "body": error})
            return
        gzip_it = "gzip" in headers.get("accept-encoding", "") and options.get("gzip", True)
        compressor = zlib.compressobj(wbits=16 + zlib.MAX_WBITS) if gzip_it else None

        def encode(data: bytes, last: bool = False) -> bytes:
            if compressor is None:
                return data
            flush = zlib.Z_FINISH if last else zlib.Z_SYNC_FLUSH
            return compressor.compress(data) + compressor.flush(flush)

        stream = bool(options.get("stream"))
        response_headers = [
            (b"content-type", b"text/event-stream" if stream else b"application/json")
        ]
        if compressor is not None:
            response_headers.append((b"content-encoding", b"gzip"))
        await send({"type": "http.response.start", "status": 200, "headers": response_headers})
        prompt = prompt_tokens(options)
        if not stream:
            tokens = int(options.get("tokens", 30))
            self.billed.append(prompt + tokens)
            payload = chat_body(tokens, prompt)
            await send({"type": "http.response.body", "body": encode(payload, last=True)})
            return
        chunks = int(options.get("chunks", 20))
        self.billed.append(prompt + chunks)
        asked = (options.get("stream_options") or {}).get("include_usage") is True
        events = chat_events(chunks, usage=asked, prompt=prompt)
        for number, event in enumerate(events):
            await send({"type": "http.response.body", "body": encode(event), "more_body": True})
            if number == 0 and options.get("pause"):
                released = await asyncio.to_thread(self.release.wait, 10)
                self.released_in_time.append(released)
        await send({"type": "http.response.body", "body": encode(b"", last=True)})
