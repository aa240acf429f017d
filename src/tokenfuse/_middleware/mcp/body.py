"""Reading an ASGI request body once, within a bound, and handing it on untouched.

The middleware must see a JSON-RPC body before the app does, and the app must then receive
exactly the messages the server sent: the same bytes, split the same way, followed by
whatever the server sends after (a disconnect). ``read_body`` keeps the messages it took;
``replay`` serves them first, then falls through to the server's ``receive``.

The bound keeps a huge upload from being held twice in memory: past ``limit`` bytes reading
stops, the body counts as unread (``data`` is None), and the app still gets every byte — the
messages read so far, then the rest straight from the server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["DEFAULT_MAX_BODY", "BufferedBody", "read_body"]

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]

#: Tool arguments are small; 4 MiB holds any sane call and bounds what one request may pin.
DEFAULT_MAX_BODY = 4 * 1024 * 1024


class BufferedBody:
    """The messages taken from ``receive`` and, when the body fit, its bytes."""

    __slots__ = ("data", "messages", "oversized")

    def __init__(self, messages: list[Message], data: bytes | None, oversized: bool) -> None:
        self.messages = messages
        self.data = data
        """The whole body; None when it was larger than the bound or the client went away."""
        self.oversized = oversized
        """The body passed the bound: the app will read more than the middleware did."""

    def replay(self, receive: Receive) -> Receive:
        """A ``receive`` that serves the buffered messages, then the server's own."""
        pending = iter(self.messages)

        async def replayed() -> Message:
            for message in pending:
                return message
            return await receive()

        return replayed


async def read_body(receive: Receive, limit: int = DEFAULT_MAX_BODY) -> BufferedBody:
    """Take request messages until the body ends, the bound is passed, or the client leaves.

    >>> async def receive():
    ...     return {"type": "http.request", "body": b"{}", "more_body": False}
    >>> import asyncio
    >>> asyncio.run(read_body(receive)).data
    b'{}'
    """
    messages: list[Message] = []
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message.get("type") != "http.request":
            return BufferedBody(messages, None, False)  # http.disconnect: the app will see it too
        chunk = message.get("body", b"")
        size += len(chunk)
        chunks.append(chunk)
        if size > limit:
            return BufferedBody(messages, None, True)
        if not message.get("more_body", False):
            return BufferedBody(messages, b"".join(chunks), False)
