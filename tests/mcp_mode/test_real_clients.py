"""``TokenFuse(mcp=True)`` in front of the real MCP server under uvicorn, driven by the real MCP
clients of both SDK majors, in their own processes.

Every figure is read from both ends: what the client was told (the driver's report) and what
the server really executed (``/stats``), so "allowed but reported failed" (a double
execution waiting to happen) cannot hide. The bucket is ``CAPACITY`` units per caller.
"""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from tests.mcp_mode.conftest import (
    CAPACITY,
    CLIENTS,
    McpServer,
    drive,
    finish,
    mcp1_interpreter,
    start,
)

pytestmark = pytest.mark.slow

REFUND = json.dumps({"order": "A-1001", "amount": 25})
BAD_REFUND = json.dumps({"order": "A-1001", "amount": -1})


def delta(server: McpServer, before: dict[str, int], name: str) -> int:
    return server.stats().get(name, 0) - before.get(name, 0)


def test_100_short_sessions_in_a_row_all_succeed_with_every_client(server_v2: McpServer) -> None:
    mcp1_interpreter()  # first: a skip must not leave started clients running
    # One caller per client, 100 sessions each: connect, ping (handshake wire), call lookup
    # once, close. The bucket holds 122 calls; the protocol messages (initialize,
    # initialized, the GET stream, pings, the automatic tools/list, DELETE) would be 600-800.
    before = server_v2.stats()
    started = [
        start(client, server_v2.url, "sessions", "--n", "100",
              "--pings", "0" if client == "v2-auto" else "2")  # no ping on the 2026 wire
        for client in CLIENTS
    ]  # fmt: skip
    reports = [finish(one) for one in started]

    assert [report["failures"] for report in reports] == [[], [], []]
    assert [report["ok"] for report in reports] == [100, 100, 100]
    assert delta(server_v2, before, "lookup") == 300


def test_a_runaway_refund_loop_is_refused_and_the_session_goes_on(server_v2: McpServer) -> None:
    mcp1_interpreter()  # first: a skip must not leave started clients running
    before = server_v2.stats()
    started = [
        start(client, server_v2.url, "loop", "--tool", "refund", "--args", REFUND,
              "--limit", "60", "--refusals", "3", "--then", "lookup")
        for client in CLIENTS
    ]  # fmt: skip
    reports = [finish(one) for one in started]

    for report in reports:
        assert "exception" not in report
        assert report["counts"] == {"ok": CAPACITY // 5, "refused": 3, "tool_error": 0}
        refusal = report["refusals"][0]
        assert refusal.startswith("tool 'refund' was not run: call quota exhausted")
        assert "retry in" in refusal
        # The session survived: 2 units were left, and a lookup (cost 1) passes.
        assert report["then"] == ["ok", "customer after: ok"]
    # No allowed call was reported failed: the server ran exactly the refunds the clients saw.
    assert delta(server_v2, before, "refund") == 3 * (CAPACITY // 5)


def test_refund_at_cost_5_admits_a_fifth_as_many_as_lookup(server_v2: McpServer) -> None:
    mcp1_interpreter()  # first: a skip must not leave started clients running
    started = [
        start(client, server_v2.url, "loop", "--tool", tool, "--args", arguments,
              "--limit", "200")
        for client in ("v1", "v2-legacy")  # v1 first: see CLIENTS
        for tool, arguments in (("lookup", '{"q": "x"}'), ("refund", REFUND))
    ]  # fmt: skip
    admitted = [finish(one)["counts"]["ok"] for one in started]

    assert admitted == [CAPACITY, CAPACITY // 5] * 2


def test_the_same_failing_call_trips_the_failure_loop_naming_the_tool(
    server_v2: McpServer,
) -> None:
    mcp1_interpreter()  # first: a skip must not leave started clients running
    before = server_v2.stats()
    started = [
        start(client, server_v2.url, "loop", "--tool", "refund", "--args", BAD_REFUND,
              "--limit", "10", "--then", "refund", "--then-args", REFUND)
        for client in CLIENTS
    ]  # fmt: skip
    reports = [finish(one) for one in started]

    for report in reports:
        assert "exception" not in report
        assert report["counts"] == {"ok": 0, "refused": 1, "tool_error": 3}
        assert report["refusals"][0].startswith(
            "tool 'refund' was not run: failure loop: 'refund' failed 3 times"
        )
        # The same tool with other arguments is progress, not the loop: it runs.
        assert report["then"] == ["ok", "refunded 25.0 on A-1001"]
    assert delta(server_v2, before, "refund_failed") == 3 * 3
    assert delta(server_v2, before, "refund") == 3


def test_a_tools_call_labelled_ping_in_its_headers_is_charged(server_v2: McpServer) -> None:
    key = f"sk-test-{uuid.uuid4().hex}"
    accept = "application/json, text/event-stream"
    with httpx.Client(headers={"Authorization": f"Bearer {key}", "Accept": accept}) as http:
        opened = http.post(
            server_v2.url,
            json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"}}},
        )  # fmt: skip
        session = {
            "Mcp-Session-Id": opened.headers["mcp-session-id"],
            "Mcp-Protocol-Version": "2025-06-18",
        }
        http.post(server_v2.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                  headers=session)  # fmt: skip
        disguised = {**session, "Mcp-Method": "ping", "Mcp-Name": "ping"}
        before = server_v2.stats()
        replies = []
        for n in range(1, CAPACITY + 2):
            call = {"name": "lookup", "arguments": {"q": str(n)}}
            message = {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": call}
            replies.append(http.post(server_v2.url, json=message, headers=disguised))

    assert delta(server_v2, before, "lookup") == CAPACITY
    refused = replies[-1]
    assert refused.status_code == 200
    assert refused.headers["content-type"] == "application/json"
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers["ratelimit"].startswith('"default";r=0;')
    answer = refused.json()
    assert answer["id"] == CAPACITY + 1
    assert answer["result"]["isError"] is True
    assert "resultType" not in answer["result"]  # 2025-06-18 does not know it
    assert answer["result"]["_meta"]["tokenfuse/refusal"]["type"] == "quota_exhausted"


@pytest.mark.parametrize("client", ["v1", "v2-legacy"])
def test_the_mcp1_server_is_guarded_the_same(server_v1: McpServer, client: str) -> None:
    before = server_v1.stats()
    sessions = drive(client, server_v1.url, "sessions", "--n", "30")
    report = drive(
        client, server_v1.url, "loop", "--tool", "refund", "--args", REFUND,
        "--limit", "40", "--then", "lookup",
    )  # fmt: skip

    assert sessions == {"major": sessions["major"], "ok": 30, "failures": []}
    assert report["counts"] == {"ok": CAPACITY // 5, "refused": 1, "tool_error": 0}
    assert report["then"] == ["ok", "customer after: ok"]
    assert delta(server_v1, before, "refund") == CAPACITY // 5
    assert delta(server_v1, before, "lookup") == 31
