"""Refusals in MCP's own shape, so that clients survive them and models read them.

A plain HTTP 429 is poison on the MCP wire: mcp 1.x clients tear the whole session down on
any HTTP error, and mcp 2.x clients turn it into ``-32603 "Server returned an error
response"``, losing the body and ``Retry-After``. So a refused request is *answered*, with
HTTP 200 and a JSON-RPC response for each request id in the body:

* ``tools/call`` → a tool result with ``isError: true`` whose text says what tripped and when
  to retry. The client hands it to the model like any failed tool, the model reads why. The
  numbers ride along in ``_meta["tokenfuse/refusal"]``; on the 2026-07-28 wire the result
  carries ``resultType: "complete"``, which that version requires.
* other charged methods (``resources/read``, ``prompts/get``), and ``tools/call`` with
  ``refuse_as="error"``, → a JSON-RPC error with the request id, code ``-32029``
  (``RATE_LIMITED``), the same sentence as message and the numbers as ``data``.

``Retry-After`` and the ``RateLimit`` headers are kept. The body is ``application/json``,
which every Streamable HTTP client must accept; a client that accepts only
``text/event-stream`` gets the same response as one SSE event.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from ..._errors import FuseTripped, StoreUnavailable
from ..reply import Reply, error_fields
from .classify import Call, Exchange, RequestId, id_key

__all__ = ["META_KEY", "RATE_LIMITED", "RefuseAs", "Refused", "answer", "refusal", "refusal_text"]

#: JSON-RPC error code of a refusal: implementation-defined server range, 429 as a mnemonic.
RATE_LIMITED = -32029

#: The ``_meta`` key under which a refused tool result carries the refusal's numbers.
META_KEY = "tokenfuse/refusal"

RefuseAs = Literal["result", "error"]

#: Protocol revisions of the initialize-handshake era: they do not know ``resultType``.
_HANDSHAKE_VERSIONS = frozenset({"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"})


Refused = FuseTripped | StoreUnavailable


def refusal_text(error: Refused, call: Call | None) -> str:
    """The sentence a model reads: what was refused, why, and when to try again."""
    what = f"{_kind(call)} was not run" if call is not None else "this request was not run"
    if isinstance(error, FuseTripped):
        why, wait = str(error), max(error.retry_after, 0.0)
    else:  # a dead store's own error names hosts and ports: for the log, not the caller
        why, wait = str(error_fields(error)["message"]), 1.0
    when = f"retry in {wait:.0f} s or later" if wait >= 1 else "retry in a second"
    return f"{what}: {why} — {when}; repeating the call at once will be refused again."


def refusal(
    exchange: Exchange,
    error: Refused,
    headers: tuple[tuple[str, str], ...],
    *,
    accept: str | None,
    refuse_as: RefuseAs = "result",
) -> Reply:
    """The HTTP reply that answers every request of a refused exchange."""
    calls = {id_key(call.id): call for call in exchange.calls}
    # An unread body has no known id: its refusal is a JSON-RPC error with id null.
    ids = exchange.request_ids or (None,)
    answers = [
        answer(request_id, calls.get(id_key(request_id)), error, exchange, refuse_as)
        for request_id in ids
    ]
    payload: object = answers if exchange.batch else answers[0]
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    if _wants_sse(accept):
        return Reply(200, (("Content-Type", "text/event-stream"), *headers), _sse_event(body))
    return Reply(200, (("Content-Type", "application/json"), *headers), body)


def answer(
    request_id: RequestId,
    call: Call | None,
    error: Refused,
    exchange: Exchange,
    refuse_as: RefuseAs,
) -> dict[str, Any]:
    """The JSON-RPC response refusing one request (``call`` None: an uncharged request of a
    refused batch)."""
    text = refusal_text(error, call)
    data = error_fields(error)
    if call is not None and call.is_tool_call and refuse_as == "result":
        result: dict[str, Any] = {
            "content": [{"type": "text", "text": text}],
            "isError": True,
            "_meta": {META_KEY: data},
        }
        if exchange.protocol_version not in _HANDSHAKE_VERSIONS:
            result["resultType"] = "complete"
        return {"jsonrpc": "2.0", "id": request_id, "result": result}
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "error": {"code": RATE_LIMITED, "message": text, "data": data},
    }


def _kind(call: Call) -> str:
    label = {"tools/call": "tool", "prompts/get": "prompt", "resources/read": "resource"}
    return f"{label.get(call.method, call.method)} {call.name!r}"


def _wants_sse(accept: str | None) -> bool:
    if not accept:
        return False
    kinds = {part.split(";", 1)[0].strip().lower() for part in accept.split(",")}
    return "text/event-stream" in kinds and not kinds & {"application/json", "application/*", "*/*"}


def _sse_event(body: bytes) -> bytes:
    return b"event: message\ndata: " + body + b"\n\n"
