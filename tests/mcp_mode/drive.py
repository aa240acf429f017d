"""Drive the test MCP server with the real MCP client of whichever SDK this interpreter has
(mcp 1.x or 2.x), and print what the client saw as one JSON line.

    python tests/mcp/drive.py URL sessions --n 100 --key sk-...
    python tests/mcp/drive.py URL loop --tool refund --args '{"order":"A-1","amount":5}' \\
        --limit 40 --then lookup --key sk-...

``--mode legacy`` (the initialize handshake) or ``auto`` (2.x: the 2026-07-28 wire when the
server offers it) picks the 2.x client's protocol; 1.x speaks only the handshake wire.

A refusal is a tool result with ``isError`` whose text says the call "was not run"; any other
failure (an exception, an error result of the tool itself) is reported as such, so the tests
can tell "refused, as designed" from "broken".
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

REFUSED_MARK = "was not run"


def _major() -> int:
    from importlib.metadata import version

    return int(version("mcp").split(".")[0])


class Session:
    """The few calls the scenarios need, over either SDK major."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    async def ping(self) -> None:
        await self.raw.send_ping()

    async def call(self, tool: str, arguments: dict[str, Any]) -> tuple[str, str]:
        """("ok" | "refused" | "tool_error", text of the result)."""
        result = await self.raw.call_tool(tool, arguments)
        text = " ".join(getattr(block, "text", "") for block in result.content)
        failed = getattr(result, "is_error", None)
        if failed is None:
            failed = result.isError
        if not failed:
            return "ok", text
        return ("refused" if REFUSED_MARK in text else "tool_error"), text


@asynccontextmanager
async def session(url: str, key: str, mode: str) -> AsyncIterator[Session]:
    headers = {"Authorization": f"Bearer {key}"}
    if _major() >= 2:
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, mode=mode) as client:
                yield Session(client)
        return
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    async with (
        streamablehttp_client(url, headers=headers) as (read, write, _),
        ClientSession(read, write) as client,
    ):
        await client.initialize()
        yield Session(client)


async def sessions(args: argparse.Namespace) -> dict[str, Any]:
    """``n`` short sessions in a row: connect, ping, one lookup, close."""
    ok, failures = 0, []
    for number in range(args.n):
        try:
            async with session(args.url, args.key, args.mode) as client:
                for _ in range(args.pings):
                    await client.ping()
                outcome, text = await client.call("lookup", {"q": f"c-{number}"})
            if outcome == "ok":
                ok += 1
            else:
                failures.append(f"{outcome}: {text}")
        except BaseException as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
    return {"ok": ok, "failures": failures}


async def loop(args: argparse.Namespace) -> dict[str, Any]:
    """Call one tool in a loop, as a runaway agent would, until refused (bounded)."""
    counts = {"ok": 0, "refused": 0, "tool_error": 0}
    report: dict[str, Any] = {"counts": counts, "refusals": [], "then": None}
    try:
        async with session(args.url, args.key, args.mode) as client:
            for _ in range(args.limit):
                outcome, text = await client.call(args.tool, json.loads(args.args))
                counts[outcome] += 1
                if outcome == "refused":
                    report["refusals"].append(text)
                    if counts["refused"] >= args.refusals:
                        break
            if args.then:
                report["then"] = list(await client.call(args.then, json.loads(args.then_args)))
    except BaseException as exc:
        report["exception"] = f"{type(exc).__name__}: {exc}"
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("scenario", choices=["sessions", "loop"])
    parser.add_argument("--key", default="sk-driver-0000")
    parser.add_argument("--mode", default="legacy", choices=["legacy", "auto"])
    parser.add_argument("--n", type=int, default=1)
    parser.add_argument("--pings", type=int, default=2)
    parser.add_argument("--tool", default="lookup")
    parser.add_argument("--args", default='{"q": "x"}')
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--refusals", type=int, default=1)
    parser.add_argument("--then", default="")
    parser.add_argument("--then-args", default='{"q": "after"}')
    args = parser.parse_args()
    scenario = sessions if args.scenario == "sessions" else loop
    print(json.dumps({"major": _major(), **asyncio.run(scenario(args))}))


if __name__ == "__main__":
    main()
