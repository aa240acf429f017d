"""A runaway agent on MCP: it retries a failing refund, then refunds in a loop.

    python examples/mcp_server/agent.py                      # against http://127.0.0.1:8000/mcp
    python examples/mcp_server/agent.py --url http://127.0.0.1:8001/mcp --calls 20

It prints what a model would read back from each tool call: the first result of each kind in
full, then a summary. The refusals arrive as ordinary tool results (``isError``), inside a
session that stays usable: the last call shows it.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


async def call(client: Client, tool: str, arguments: dict[str, object]) -> tuple[str, str]:
    result = await client.call_tool(tool, arguments)
    text = " ".join(getattr(block, "text", "") for block in result.content)
    if not result.is_error:
        return "ok", text
    return ("refused" if "was not run" in text else "tool error"), text


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000/mcp")
    parser.add_argument("--key", default="sk-agent-demo-7f3a9c21")
    parser.add_argument("--calls", type=int, default=15, help="refund calls in the loop")
    args = parser.parse_args()

    headers = {"Authorization": f"Bearer {args.key}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        Client(streamable_http_client(args.url, http_client=http)) as client,
    ):
        steps = [
            ("stuck: the same failing refund, retried", "refund",
             {"order_id": "A-1001", "amount": -25}, 5),
            ("runaway: refunds in a loop", "refund",
             {"order_id": "A-1001", "amount": 25}, args.calls),
            ("after the refusals, the same session", "lookup_order", {"order_id": "A-1001"}, 1),
        ]  # fmt: skip
        for title, tool, arguments, times in steps:
            if tool == "lookup_order":
                # As the refusals advise ("retry in a second"): the quota refills 1 a second,
                # and the runaway may have left less than the lookup's 1.
                await asyncio.sleep(1.0)
            print(f"== {title}: {tool}({arguments}) x {times}")
            outcomes: Counter[str] = Counter()
            for n in range(1, times + 1):
                outcome, text = await call(client, tool, arguments)
                outcomes[outcome] += 1
                if outcomes[outcome] == 1:
                    print(f"  call {n:3d} -> {outcome}: {text}")
            print("  summary:", ", ".join(f"{c} x {o}" for o, c in outcomes.items()))


if __name__ == "__main__":
    asyncio.run(main())
