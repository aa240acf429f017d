"""Watching an MCP response pass, to learn which charged calls failed.

The response goes to the client message for message, unchanged except for the headers the
guard adds; on the side, the watcher reads just enough to tell, for each charged request id,
whether the answer was an error: a JSON-RPC ``error``, a result with ``isError: true``, or an
HTTP error status. It reads an ``application/json`` body whole (bounded) and a
``text/event-stream`` event by event (each event bounded), and stops reading once every
watched id is answered, so a long-lived stream costs nothing after its answer.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from .classify import IdKey, id_key

__all__ = ["ResponseWatch"]

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]

MAX_READ = 1024 * 1024  # an answer larger than this is not read: its outcome stays unknown


class ResponseWatch:
    """A ``send`` that adds ``headers`` to the response start and reports failed request ids.

    ``on_failure`` runs for each failed id *before* the message carrying the failure goes to
    the client: a client that retries at once is then judged with the failure counted.
    """

    def __init__(
        self,
        send: Send,
        headers: list[tuple[bytes, bytes]],
        watched: Iterable[IdKey],
        on_failure: Callable[[IdKey], Awaitable[None]],
    ) -> None:
        self._send = send
        self._headers = headers
        self._waiting = set(watched)
        self._on_failure = on_failure
        self._kind = ""  # "json", "sse", or "" once nothing more is read
        self._buffer = bytearray()
        self._failed: list[IdKey] = []

    async def send(self, message: Message) -> None:
        kind = message.get("type")
        if kind == "http.response.start":
            message = self._start(message)
        elif kind == "http.response.body" and self._kind:
            self._body(bytes(message.get("body", b"")), bool(message.get("more_body", False)))
        while self._failed:
            await self._on_failure(self._failed.pop(0))
        await self._send(message)

    def _start(self, message: Message) -> Message:
        status = int(message.get("status", 200))
        content_type = b""
        for name, value in message.get("headers", ()):
            if bytes(name).lower() == b"content-type":
                content_type = bytes(value).lower()
        if status >= 400:
            self._failed.extend(self._waiting)  # the call did not succeed, whatever the body says
            self._waiting = set()
        elif content_type.startswith(b"application/json"):
            self._kind = "json"
        elif content_type.startswith(b"text/event-stream"):
            self._kind = "sse"
        if not self._waiting:
            self._kind = ""
        if not self._headers:
            return message
        return {**message, "headers": [*message.get("headers", ()), *self._headers]}

    def _body(self, chunk: bytes, more: bool) -> None:
        buffer = self._buffer
        buffer += chunk
        if self._kind == "json":
            if len(buffer) > MAX_READ:
                self._stop()
            elif not more:
                self._answers(bytes(buffer))
                self._stop()
            return
        if b"\r" in buffer:  # a CR ending this chunk may pair with an LF starting the next
            held = b"\r" if buffer.endswith(b"\r") else b""
            whole = bytes(buffer[:-1] if held else buffer)
            buffer[:] = whole.replace(b"\r\n", b"\n").replace(b"\r", b"\n") + held
        while self._kind and (end := buffer.find(b"\n\n")) >= 0:
            event = bytes(buffer[:end])
            del buffer[: end + 2]
            data = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line[:5] == b"data:"]
            if data:
                self._answers(b"\n".join(data))
        if len(buffer) > MAX_READ or not more:
            self._stop()

    def _answers(self, payload: bytes) -> None:
        try:
            parsed = json.loads(payload)
        except (ValueError, RecursionError):
            return
        for answer in parsed if isinstance(parsed, list) else [parsed]:
            if not isinstance(answer, dict) or "id" not in answer:
                continue
            key = id_key(answer["id"])
            if key not in self._waiting:
                continue
            self._waiting.discard(key)
            result = answer.get("result")
            if "error" in answer or (isinstance(result, dict) and result.get("isError") is True):
                self._failed.append(key)
        if not self._waiting:
            self._stop()

    def _stop(self) -> None:
        self._kind = ""
        self._buffer = bytearray()
