"""What an MCP request costs: the JSON-RPC body, read as the server will read it.

An MCP server over Streamable HTTP takes every message as a ``POST`` of JSON-RPC to one path,
so neither the path nor the method says what a request does. The body does:

* a **request** (``id`` and ``method``) whose method is charged (``tools/call`` by default;
  ``resources/read`` and ``prompts/get`` on request) costs the price of its tool, prompt or
  resource (``cost={"refund": 5}``; 1 otherwise);
* everything else is the protocol talking to itself and is free: ``initialize``, ``ping``,
  every ``*/list`` call, ``server/discover``, notifications (no ``id``), the client's
  responses to server requests, and any non-``POST`` (the ``GET`` event stream, ``DELETE``);
* a batch (a JSON array, wire versions up to 2025-03-26) costs the sum of its requests.

**Headers are labels, the body is the truth.** The ``Mcp-Method`` and ``Mcp-Name`` headers of
the 2026-07-28 wire are what a proxy may route on; the server validates them against the body
on that wire only, and ignores them on the older one. So the classifier never lets a header
make a request cheaper than its body: a ``tools/call`` labelled ``ping`` is a tool call.
``headers_agree`` reports whether the labels match, for logs and tests.

A body the middleware could not read whole (over the size bound) is charged as one call at
the highest configured price, under the name ``(unread)``: padding arguments never buys a
cheaper call. A complete body that is not JSON-RPC is free: the server rejects it unexecuted.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ..._errors import ConfigurationError

__all__ = [
    "CHARGEABLE_METHODS",
    "Call",
    "Classifier",
    "Exchange",
    "IdKey",
    "McpCost",
    "RequestId",
    "id_key",
]

#: Methods that do work a caller pays for; ``tools/call`` is charged by default.
CHARGEABLE_METHODS = frozenset({"tools/call", "resources/read", "prompts/get"})

#: The params field naming what a charged method acts on (mirrored in ``Mcp-Name``).
_NAME_FIELD = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}

#: Where the 2026-07-28 wire carries the protocol version inside each request.
_VERSION_META_KEY = "io.modelcontextprotocol/protocolVersion"

MAX_NAME = 128  # tool names are short; a longer one is cut before it reaches a key or a message
UNREAD = "(unread)"

RequestId = str | int | float | None
IdKey = tuple[bool, RequestId]


def id_key(request_id: RequestId) -> IdKey:
    """A request id as clients match answers to requests: ``1`` and ``"1"`` are different
    ids, ``1`` and ``1.0`` the same JSON number."""
    return (isinstance(request_id, str), request_id)


@dataclass(frozen=True, slots=True)
class Call:
    """One charged JSON-RPC request.

    ``fingerprint`` is a hash of the method, the name and the canonical JSON of the
    arguments (key order and whitespace do not matter; ``_meta`` is left out): the same call
    made again has the same fingerprint, and no argument is ever stored.
    """

    id: RequestId
    method: str
    name: str
    cost: float
    fingerprint: str

    @property
    def is_tool_call(self) -> bool:
        return self.method == "tools/call"


@dataclass(frozen=True, slots=True)
class Exchange:
    """What one HTTP request carries, as far as charging goes."""

    calls: tuple[Call, ...]
    """The charged requests, in body order; empty when the request is free."""
    request_ids: tuple[RequestId, ...]
    """Every request id in the body (charged or not): a refusal answers each one."""
    batch: bool
    protocol_version: str | None
    headers_agree: bool
    """Whether ``Mcp-Method`` / ``Mcp-Name``, where sent, match the body."""

    @property
    def cost(self) -> float:
        return math.fsum(call.cost for call in self.calls)


FREE = Exchange((), (), False, None, True)

McpCost = float | Mapping[str, float] | Callable[..., object]
"""A number or ``{tool name: cost}``; the middleware's ``cost`` type, whose functions of a
request MCP mode refuses (the request alone does not say which tool is called)."""


class Classifier:
    """Reads a request body into an ``Exchange``.

    >>> classifier = Classifier(cost={"refund": 5})
    >>> body = b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"refund"}}'
    >>> [(call.name, call.cost) for call in classifier.classify(body, lambda _: None).calls]
    [('refund', 5.0)]
    >>> classifier.classify(b'{"jsonrpc":"2.0","id":8,"method":"ping"}', lambda _: None).calls
    ()
    """

    def __init__(self, *, cost: McpCost = 1.0, methods: Iterable[str] = ("tools/call",)) -> None:
        self.methods = frozenset(methods)
        unknown = self.methods - CHARGEABLE_METHODS
        if isinstance(methods, str) or unknown:
            raise ConfigurationError(
                f"MCP charged methods are some of {sorted(CHARGEABLE_METHODS)}, not {methods!r}"
            )
        if isinstance(cost, Mapping):
            self._prices = {str(name): _checked(value) for name, value in cost.items()}
            self._default = 1.0
        elif callable(cost):
            raise ConfigurationError(
                "with mcp=True, cost is a number or {tool name: cost}, not a function"
            )
        else:
            self._prices = {}
            self._default = _checked(cost)
        self.highest = max([self._default, *self._prices.values()])

    def price(self, name: str) -> float:
        return self._prices.get(name, self._default)

    def classify(self, body: bytes | None, header: Callable[[str], str | None]) -> Exchange:
        """The exchange a POST body carries; ``body=None`` means it was too large to read."""
        if body is None:
            unread = Call(None, "tools/call", UNREAD, self.highest, _digest(UNREAD))
            return Exchange((unread,), (), False, header("mcp-protocol-version"), True)
        try:
            message = json.loads(body)
        except (ValueError, RecursionError):  # not JSON (or absurdly nested): never executed
            return FREE
        messages = message if isinstance(message, list) else [message]
        calls: list[Call] = []
        ids: list[RequestId] = []
        version = header("mcp-protocol-version")
        for item in messages:
            if not isinstance(item, dict) or "method" not in item or "id" not in item:
                continue  # notifications and the client's responses are free
            request_id = item["id"]
            if not isinstance(request_id, (str, int, float)) or isinstance(request_id, bool):
                continue  # not a valid JSON-RPC request id: the server rejects it unexecuted
            ids.append(request_id)
            params = item.get("params")
            params = params if isinstance(params, dict) else {}
            version = version or _meta_version(params)
            call = self.call(request_id, item["method"], params)
            if call is not None:
                calls.append(call)
        agree = len(messages) != 1 or _headers_agree(messages[0], header)
        return Exchange(tuple(calls), tuple(ids), isinstance(message, list), version, agree)

    def call(
        self, request_id: RequestId, method: object, params: Mapping[str, object]
    ) -> Call | None:
        """The charged call one request makes, or None when its method is free."""
        if not isinstance(method, str) or method not in self.methods:
            return None
        raw_name = params.get(_NAME_FIELD[method])
        name = raw_name[:MAX_NAME] if isinstance(raw_name, str) else ""
        fingerprint = _fingerprint(method, name, params.get("arguments"))
        return Call(request_id, method, name, self.price(name), fingerprint)


def _checked(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"cost must be a finite, non-negative number, not {value!r}")
    number = float(value)
    if not (math.isfinite(number) and number >= 0):
        raise ConfigurationError(f"cost must be a finite, non-negative number, not {value!r}")
    return number


def _meta_version(params: dict[str, object]) -> str | None:
    meta = params.get("_meta")
    version = meta.get(_VERSION_META_KEY) if isinstance(meta, dict) else None
    return version[:32] if isinstance(version, str) else None


def _headers_agree(message: object, header: Callable[[str], str | None]) -> bool:
    if not isinstance(message, dict):
        return True
    method = header("mcp-method")
    if method is not None and method != message.get("method"):
        return False
    name = header("mcp-name")
    if name is None:
        return True
    field = _NAME_FIELD.get(str(message.get("method")))
    params = message.get("params")
    return field is not None and isinstance(params, dict) and _decoded(name) == params.get(field)


def _decoded(value: str) -> str | None:
    """An ``Mcp-Name`` value: non-ASCII names travel base64-wrapped as ``=?base64?...?=``."""
    if not (value.startswith("=?base64?") and value.endswith("?=")):
        return value
    try:
        return base64.b64decode(value[9:-2], validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _fingerprint(method: str, name: str, arguments: object) -> str:
    canonical = json.dumps(
        [method, name, arguments], sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return _digest(canonical)
