"""MCP mode at the ASGI level, on a simulated clock: what reaches the app, what the client gets.

The app here is a small JSON-RPC tool server that records what it executed and answers each
request: ``fail`` with an ``isError`` result, ``boom`` with a JSON-RPC error, anything else
with a plain result; as JSON, or as SSE events cut mid-line with CRLF line ends.
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any

import pytest

from tests.conftest import Clock
from tokenfuse import BucketPolicy, ConfigurationError, Fuse, FuseTripped, MemoryStore
from tokenfuse._middleware import Reply, RequestView, TokenFuse, TokenFuseWSGI, inbound_fuse
from tokenfuse._middleware.mcp import McpMode, ToolFailures
from tokenfuse._middleware.mcp.keys import tool_key

Message = MutableMapping[str, Any]
KEY = "sk-mcp-test-key-0001"  # long enough for its label to show the tail


class ToolServer:
    def __init__(self, sse: bool = False, status: int = 200) -> None:
        self.sse = sse
        self.status = status
        self.executed: list[str] = []
        self.received: list[Message] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        chunks = []
        while True:
            message = await receive()
            self.received.append(message)
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        request = json.loads(b"".join(chunks))
        name = request.get("params", {}).get("name", "")
        self.executed.append(name)
        if name == "boom":
            answer: dict[str, Any] = {"error": {"code": -32603, "message": "boom"}}
        else:
            answer = {"result": {"content": [], "isError": name == "fail"}}
        payload = json.dumps({"jsonrpc": "2.0", "id": request.get("id"), **answer}).encode()
        kind = b"text/event-stream" if self.sse else b"application/json"
        await send({"type": "http.response.start", "status": self.status,
                    "headers": [(b"content-type", kind)]})  # fmt: skip
        if not self.sse:
            await send({"type": "http.response.body", "body": payload})
            return
        event = b": keep-alive\r\n\r\nevent: message\r\ndata: " + payload + b"\r\n\r\n"
        for part in (event[:20], event[20:-1], event[-1:]):  # a CRLF split between chunks
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class Client:
    """Sends one request through the middleware; keeps what the server side sent back."""

    def __init__(self, middleware: TokenFuse) -> None:
        self.middleware = middleware

    async def post(
        self, message: object, *, chunks: int = 1, method: str = "POST", **headers: str
    ) -> tuple[int, dict[str, str], Any]:
        raw = json.dumps(message).encode()
        size = -(-len(raw) // chunks)
        parts = [raw[i : i + size] for i in range(0, len(raw), size)] or [b""]
        incoming = [
            {"type": "http.request", "body": part, "more_body": n < len(parts) - 1}
            for n, part in enumerate(parts)
        ]
        incoming.append({"type": "http.disconnect"})
        sent: list[Message] = []

        async def receive() -> Message:
            return incoming.pop(0)

        async def send(message: Message) -> None:
            sent.append(message)

        scope = {
            "type": "http", "method": method, "path": "/mcp",
            "headers": [(b"authorization", f"Bearer {KEY}".encode()),
                        *((k.replace("_", "-").encode(), v.encode()) for k, v in headers.items())],
        }  # fmt: skip
        await self.middleware(scope, receive, send)
        start = sent[0]
        names = {bytes(k).decode(): bytes(v).decode() for k, v in start["headers"]}
        body = b"".join(m.get("body", b"") for m in sent[1:])
        return start["status"], names, body


def call(name: str, request_id: int = 1, **arguments: object) -> dict[str, object]:
    params = {"name": name, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def guarded(
    app: ToolServer, clock: Clock, capacity: float = 10, **options: Any
) -> tuple[Client, Fuse]:
    store = MemoryStore(clock=clock)
    fuse = options.pop("fuse", None) or inbound_fuse(
        store, bucket=BucketPolicy(rate=1, capacity=capacity)
    )
    options.setdefault("mcp", True)
    return Client(TokenFuse(app, fuse=fuse, **options)), fuse


async def test_the_body_reaches_the_app_message_for_message(clock: Clock) -> None:
    app = ToolServer()
    client, _ = guarded(app, clock)
    message = call("lookup", q="x" * 300)

    free = await client.post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, chunks=3)
    charged = await client.post(message, chunks=4)

    raw = json.dumps(message).encode()
    assert free[0] == charged[0] == 200
    bodies = [m["body"] for m in app.received[3:]]
    assert len(bodies) == 4 and b"".join(bodies) == raw  # the same bytes, the same split
    assert "ratelimit" not in free[1]  # a free message is not even looked at by the store
    assert charged[1]["ratelimit"] == '"default";r=9;t=1'


async def test_non_post_requests_pass_without_a_store_trip(clock: Clock) -> None:
    app = ToolServer()
    client, fuse = guarded(app, clock)

    for _ in range(20):
        status, names, _body = await client.post(call("lookup"), method="GET")
        assert status == 200 and "ratelimit" not in names
    assert fuse.status(_identity()).bucket_level is None  # never touched


def _identity() -> Any:
    from tokenfuse._identity import Identity

    return Identity.secret(KEY)


@pytest.mark.parametrize(
    ("version", "result_type"), [("2025-06-18", None), ("2026-07-28", "complete")]
)
async def test_a_refused_tool_call_is_a_tool_result_the_model_reads(
    clock: Clock, version: str, result_type: str | None
) -> None:
    app = ToolServer()
    client, _ = guarded(app, clock, capacity=5, cost={"refund": 5})

    await client.post(call("refund", 1))
    status, names, body = await client.post(call("refund", 2), mcp_protocol_version=version)

    assert app.executed == ["refund"]
    assert status == 200
    assert names["content-type"] == "application/json"
    assert names["retry-after"] == "5"
    assert names["ratelimit"] == '"default";r=0;t=5'
    answer = json.loads(body)
    assert answer["id"] == 2
    result = answer["result"]
    assert result["isError"] is True
    assert result.get("resultType") == result_type
    text = result["content"][0]["text"]
    assert text.startswith("tool 'refund' was not run: call quota exhausted for key sk-…0001")
    assert "retry in 5 s or later" in text
    assert result["_meta"]["tokenfuse/refusal"]["retry_after"] == 5.0


async def test_other_charged_methods_and_refuse_as_error_answer_a_json_rpc_error(
    clock: Clock,
) -> None:
    mode = McpMode(methods=("tools/call", "resources/read"), refuse_as="error")
    client, _ = guarded(ToolServer(), clock, capacity=1, mcp=mode)
    read = {"jsonrpc": "2.0", "id": "r1", "method": "resources/read",
            "params": {"uri": "file:///a"}}  # fmt: skip

    await client.post(read)
    _status, _names, tool_body = await client.post(call("lookup", 5))
    _status, _names, read_body = await client.post(read)

    for body, request_id, what in ((tool_body, 5, "tool 'lookup'"), (read_body, "r1", "resource")):
        answer = json.loads(body)
        assert answer["id"] == request_id
        assert answer["error"]["code"] == -32029
        assert answer["error"]["message"].startswith(what)
        assert answer["error"]["data"]["type"] == "quota_exhausted"


async def test_a_client_that_accepts_only_sse_gets_the_refusal_as_an_event(clock: Clock) -> None:
    client, _ = guarded(ToolServer(), clock, capacity=1)
    await client.post(call("lookup", 1))

    _status, names, body = await client.post(call("lookup", 2), accept="text/event-stream")

    assert names["content-type"] == "text/event-stream"
    assert body.startswith(b"event: message\ndata: {") and body.endswith(b"}\n\n")
    assert json.loads(body.split(b"data: ", 1)[1])["result"]["isError"] is True


async def test_a_refused_batch_answers_every_request_it_carried(clock: Clock) -> None:
    app = ToolServer()
    client, _ = guarded(app, clock, capacity=5, cost={"refund": 5})
    batch = [call("refund", 1), {"jsonrpc": "2.0", "id": 2, "method": "ping"}, call("lookup", 3)]

    _status, _names, body = await client.post(batch)

    answers = json.loads(body)
    assert app.executed == []  # 6 units asked of a bucket of 5: the batch is refused whole
    assert [a["id"] for a in answers] == [1, 2, 3]
    assert [a["result"]["isError"] for a in (answers[0], answers[2])] == [True, True]
    assert answers[1]["error"]["code"] == -32029


@pytest.mark.parametrize("failure", ["fail", "boom", "http", "sse"])
async def test_the_same_failing_call_trips_the_breaker_and_the_cooldown_ends_it(
    clock: Clock, failure: str
) -> None:
    app = ToolServer(sse=failure == "sse", status=500 if failure == "http" else 200)
    name = failure if failure in ("fail", "boom") else "fail"
    mcp = McpMode(failures=ToolFailures(errors=3, cooldown=60))
    client, _ = guarded(app, clock, capacity=100, mcp=mcp)

    for n in range(3):
        await client.post(call(name, n, order="A"))
        clock.advance(1)
    _status, _names, refused = await client.post(call(name, 9, order="A"))
    other = await client.post(call(name, 10, order="B"))  # other arguments: not the loop
    clock.advance(61)
    after = await client.post(call(name, 11, order="A"))

    assert app.executed == [name] * 3 + [name, name]
    text = json.loads(refused)["result"]["content"][0]["text"]
    assert text.startswith(f"tool '{name}' was not run: failure loop: '{name}' failed 3 times")
    assert other[0] == after[0] == (500 if failure == "http" else 200)


async def test_successful_calls_never_count_as_failures(clock: Clock) -> None:
    app = ToolServer(sse=True)
    client, _ = guarded(app, clock, capacity=100)

    for n in range(10):
        await client.post(call("lookup", n, q="same"))

    assert app.executed == ["lookup"] * 10


async def test_each_tool_has_its_own_velocity_key_named_in_the_refusal(clock: Clock) -> None:
    app = ToolServer()
    middleware = TokenFuse(app, fuse=inbound_fuse(MemoryStore(clock=clock), bucket=None), mcp=True)
    client = Client(middleware)
    gate = middleware._mcp.gate  # type: ignore[union-attr]
    refund = gate.classifier.classify(json.dumps(call("refund")).encode(), lambda _: None).calls[0]
    assert gate.tools is not None
    gate.tools.set_limit(tool_key(_identity(), refund), 2)  # refund only: 2 per minute

    statuses = [json.loads((await client.post(call("refund", n)))[2]) for n in range(3)]
    lookups = [(await client.post(call("lookup", n)))[0] for n in range(5)]

    assert app.executed == ["refund", "refund"] + ["lookup"] * 5
    text = statuses[2]["result"]["content"][0]["text"]
    tool_id = gate.tools.key_id(tool_key(_identity(), refund))
    assert f"for key sk-…0001 tool refund [id {tool_id}]" in text
    assert lookups == [200] * 5


async def test_shadow_mode_lets_a_refused_call_run_with_its_headers(clock: Clock) -> None:
    app = ToolServer()
    client, _ = guarded(app, clock, capacity=1, shadow=True)

    await client.post(call("lookup", 1))
    status, names, body = await client.post(call("lookup", 2))

    assert app.executed == ["lookup", "lookup"]
    assert status == 200 and json.loads(body)["result"]["isError"] is False
    assert names["ratelimit"].startswith('"default";r=0;')


async def test_a_custom_refusal_is_sent_as_the_user_made_it(clock: Clock) -> None:
    def refusal(error: FuseTripped, request: RequestView) -> Reply:
        return Reply.json({"mine": error.reason}, status=429)

    client, _ = guarded(ToolServer(), clock, capacity=1, refusal=refusal)
    await client.post(call("lookup", 1))
    status, names, body = await client.post(call("lookup", 2))

    assert (status, json.loads(body)) == (429, {"mine": "quota_exhausted"})
    assert "retry-after" in names


async def test_a_store_down_with_fail_closed_is_answered_in_mcp_shape(clock: Clock) -> None:
    class DownStore(MemoryStore):
        async def arun(self, op: Any) -> Any:
            raise ConnectionError("redis is down")

    app = ToolServer()
    fuse = inbound_fuse(DownStore(clock=clock), fail_closed=True)
    client = Client(TokenFuse(app, fuse=fuse, mcp=True))

    status, names, body = await client.post(call("lookup", 1))

    assert app.executed == []
    assert (status, names["retry-after"]) == (200, "1")
    result = json.loads(body)["result"]
    assert result["isError"] is True
    assert result["_meta"]["tokenfuse/refusal"]["type"] == "store_unavailable"
    assert b"redis is down" not in body  # the store's error is for the log, not the caller


async def test_an_oversized_body_is_charged_at_the_highest_price_and_still_delivered(
    clock: Clock,
) -> None:
    app = ToolServer()
    mode = McpMode(max_body=64)
    client, _ = guarded(app, clock, capacity=10, cost={"refund": 5, "export": 8}, mcp=mode)
    message = call("lookup", 1, q="x" * 200)

    status, names, _ = await client.post(message, chunks=5)

    assert status == 200 and app.executed == ["lookup"]
    assert b"".join(m["body"] for m in app.received[:5]) == json.dumps(message).encode()
    assert names["ratelimit"] == '"default";r=2;t=8'


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mcp": "yes"}, "mcp must be"),
        ({"mcp": True, "count": "tokens"}, "count='tokens'"),
        ({"mcp": True, "cost": lambda request: 2.0}, "not a function"),
    ],
)
def test_bad_mcp_options_fail_at_construction(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        TokenFuse(ToolServer(), **options)


def test_mcp_mode_is_for_asgi_only() -> None:
    with pytest.raises(ConfigurationError, match="ASGI"):
        TokenFuseWSGI(lambda environ, start_response: [], mcp=True)


@pytest.mark.parametrize(
    ("kind", "options", "message"),
    [
        (ToolFailures, {"errors": 1}, "at least 2"),
        (ToolFailures, {"slots": 0}, "slots"),
        (McpMode, {"max_body": 0}, "max_body"),
        (McpMode, {"refuse_as": "429"}, "refuse_as"),
    ],
)
def test_bad_mcp_settings_fail_at_construction(
    kind: type[Any], options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        kind(**options)


async def test_lease_mode_charges_tool_calls_from_the_lease(clock: Clock) -> None:
    from tokenfuse._core.lease import LeasePolicy

    app = ToolServer()
    client, _ = guarded(
        app, clock, capacity=10, lease=LeasePolicy(size=4, lifetime=60, top_up=False)
    )
    for n in range(11):
        await client.post(call("lookup", n))
    assert app.executed == ["lookup"] * 10  # the eleventh was refused (as a tool result)
    leases = client.middleware.guard.leases
    assert leases is not None
    assert (leases.counts.renewals, leases.counts.local) == (3, 8)
