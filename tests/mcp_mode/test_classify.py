"""The classifier: what an MCP body costs, read as the server reads it."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable

import pytest

from tokenfuse import ConfigurationError
from tokenfuse._middleware.mcp import Classifier
from tokenfuse._middleware.mcp.classify import UNREAD

NO_HEADERS: Callable[[str], str | None] = lambda _name: None  # noqa: E731


def headers(**values: str) -> Callable[[str], str | None]:
    lowered = {name.replace("_", "-").lower(): value for name, value in values.items()}
    return lowered.get


def body(method: str, request_id: object = 1, **params: object) -> bytes:
    message: dict[str, object] = {"jsonrpc": "2.0", "method": method}
    if request_id is not None:
        message["id"] = request_id
    if params:
        message["params"] = params
    return json.dumps(message).encode()


FREE_MESSAGES = [
    body("initialize", protocolVersion="2025-06-18", capabilities={}),
    body("notifications/initialized", None),
    body("notifications/cancelled", None, requestId=3),
    body("ping"),
    body("tools/list"),
    body("resources/list"),
    body("prompts/list"),
    body("resources/templates/list"),
    body("server/discover"),
    body("tools/call", None, name="refund"),  # a notification: nothing runs, nothing is owed
    b'{"jsonrpc":"2.0","id":4,"result":{"content":[]}}',  # the client answering the server
    b'{"jsonrpc":"2.0","id":5,"error":{"code":-1,"message":"no"}}',
    b"not json",
    b"",
    b'{"jsonrpc":"2.0","id":true,"method":"tools/call","params":{"name":"refund"}}',
    b"[" * 100_000,  # nested past the parser's recursion limit: rejected, never a crash
]


@pytest.mark.parametrize("message", FREE_MESSAGES)
def test_the_protocol_talking_to_itself_is_free(message: bytes) -> None:
    assert Classifier(cost={"refund": 5}).classify(message, NO_HEADERS).calls == ()


def test_a_tool_call_costs_its_tool_s_price() -> None:
    classifier = Classifier(cost={"refund": 5})
    refund = classifier.classify(body("tools/call", 7, name="refund"), NO_HEADERS)
    lookup = classifier.classify(body("tools/call", 8, name="lookup"), NO_HEADERS)

    assert [(call.id, call.name, call.cost) for call in refund.calls] == [(7, "refund", 5.0)]
    assert [(call.name, call.cost) for call in lookup.calls] == [("lookup", 1.0)]
    assert refund.request_ids == (7,)


def test_resources_and_prompts_are_charged_only_when_asked() -> None:
    read = body("resources/read", uri="file:///report.pdf")
    prompt = body("prompts/get", name="summary")
    default = Classifier()
    wider = Classifier(cost={"summary": 2}, methods=("tools/call", "resources/read", "prompts/get"))

    assert default.classify(read, NO_HEADERS).calls == ()
    assert default.classify(prompt, NO_HEADERS).calls == ()
    assert [c.name for c in wider.classify(read, NO_HEADERS).calls] == ["file:///report.pdf"]
    assert [c.cost for c in wider.classify(prompt, NO_HEADERS).calls] == [2.0]


def test_a_batch_costs_the_sum_of_its_charged_requests() -> None:
    batch = json.dumps([
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "refund"}},
        {"jsonrpc": "2.0", "id": 2, "method": "ping"},
        {"jsonrpc": "2.0", "method": "notifications/progress"},
        {"jsonrpc": "2.0", "id": "3", "method": "tools/call", "params": {"name": "lookup"}},
    ]).encode()  # fmt: skip

    exchange = Classifier(cost={"refund": 5}).classify(batch, NO_HEADERS)

    assert exchange.batch
    assert exchange.cost == 6
    assert exchange.request_ids == (1, 2, "3")


def test_headers_never_make_a_call_cheaper_than_its_body() -> None:
    classifier = Classifier(cost={"refund": 5})
    call = body("tools/call", 9, name="refund", arguments={"order": "A"})

    disguised = classifier.classify(call, headers(mcp_method="ping", mcp_name="lookup"))
    honest = classifier.classify(call, headers(mcp_method="tools/call", mcp_name="refund"))
    # and the reverse: a ping labelled as a tool call is still a ping
    labelled = classifier.classify(body("ping"), headers(mcp_method="tools/call"))

    assert [(c.name, c.cost) for c in disguised.calls] == [("refund", 5.0)]
    assert not disguised.headers_agree
    assert honest.headers_agree
    assert labelled.calls == ()
    assert not labelled.headers_agree


def test_a_base64_wrapped_mcp_name_is_compared_decoded() -> None:
    name = "rückerstattung"
    wrapped = "=?base64?" + base64.b64encode(name.encode()).decode() + "?="
    call = body("tools/call", 1, name=name)

    exchange = Classifier().classify(call, headers(mcp_method="tools/call", mcp_name=wrapped))

    assert exchange.headers_agree


def test_an_unread_body_is_charged_at_the_highest_price() -> None:
    exchange = Classifier(cost={"refund": 5, "export": 20}).classify(None, NO_HEADERS)

    assert [(call.name, call.cost) for call in exchange.calls] == [(UNREAD, 20.0)]


def test_the_fingerprint_ignores_key_order_and_meta_but_not_arguments() -> None:
    classifier = Classifier()

    def fingerprint(arguments: object, meta: object = None) -> str:
        params = {"name": "refund", "arguments": arguments, "_meta": meta}
        return classifier.classify(body("tools/call", 1, **params), NO_HEADERS).calls[0].fingerprint

    assert fingerprint({"order": "A", "amount": 5}) == fingerprint({"amount": 5, "order": "A"})
    assert fingerprint({"order": "A"}, {"progressToken": 1}) == fingerprint({"order": "A"})
    assert fingerprint({"order": "A"}) != fingerprint({"order": "B"})


def test_the_protocol_version_comes_from_the_header_or_the_request_meta() -> None:
    classifier = Classifier()
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}
    modern = body("tools/call", 1, name="lookup", _meta=meta)

    assert classifier.classify(modern, NO_HEADERS).protocol_version == "2026-07-28"
    legacy = classifier.classify(modern, headers(mcp_protocol_version="2025-06-18"))
    assert legacy.protocol_version == "2025-06-18"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cost": {"refund": -1}}, "non-negative"),
        ({"cost": float("nan")}, "non-negative"),
        ({"cost": lambda request: 1.0}, "not a function"),
        ({"methods": ("tools/list",)}, "charged methods"),
        ({"methods": "tools/call"}, "charged methods"),
    ],
)
def test_bad_options_fail_at_construction(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Classifier(**options)  # type: ignore[arg-type]


def test_the_public_module_offers_what_configures_mcp_mode() -> None:
    import tokenfuse.mcp

    assert tokenfuse.mcp.McpMode().methods == ("tools/call",)
    assert issubclass(tokenfuse.mcp.ToolFailureLoop, tokenfuse.FuseTripped)
    assert tokenfuse.mcp.RATE_LIMITED == -32029
