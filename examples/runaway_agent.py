"""A runaway agent loop, stopped by FuseTransport in under a minute. Runs as is, offline.

    python examples/runaway_agent.py

A fake LLM (an httpx MockTransport answering like OpenAI's chat completions) sits behind
``FuseTransport`` on the embedded store. A simulated clock lets the agent first work normally
for three days, so its key learns a baseline; then a bug makes it call the model in a loop,
re-sending a growing context, and the fuse refuses it with ``LoopSuspected``. Nothing sleeps:
the clock is moved by hand, as a test would. tokenfuse's own log lines (the trip) are printed
marked ``[tokenfuse log, ...]``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys

import httpx

from tokenfuse import Fuse, FuseTransport, LoopSuspected, MemoryStore
from tokenfuse.transport import FuseReport

API_KEY = "sk-proj-demo-agent-7f3a"
URL = "https://api.openai.com/v1/chat/completions"


class SimulatedClock:
    def __init__(self) -> None:
        self.now = 1_767_225_600.0  # 2026-01-01T00:00:00Z

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeLLM:
    """Answers every chat completion; the usage grows with the prompt it was sent."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        prompt_tokens = len(request.content) // 4
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": 150,
            "total_tokens": prompt_tokens + 150,
        }
        message = {"role": "assistant", "content": "Let me try calling the tool again."}
        return httpx.Response(
            200,
            json={
                "id": f"chatcmpl-{self.calls}",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": usage,
            },
        )


def ask(client: httpx.Client, context: list[str]) -> FuseReport:
    """One agent step: send the conversation so far; tokenfuse's report of the call."""
    messages = [{"role": "user", "content": text} for text in context]
    response = client.post(URL, content=json.dumps({"model": "gpt-4o-mini", "messages": messages}))
    report: FuseReport = response.extensions["tokenfuse"]
    return report


def main() -> None:
    # tokenfuse logs every event (a trip, a store outage) on the "tokenfuse" logger, and passes
    # it to Fuse(on_event=...) hooks. Show those log lines in order with the rest, marked.
    log = logging.StreamHandler(sys.stdout)
    log.setFormatter(logging.Formatter("  [tokenfuse log, %(levelname)s] %(message)s"))
    logging.getLogger("tokenfuse").addHandler(log)
    clock = SimulatedClock()
    llm = FakeLLM()
    fuse = Fuse(MemoryStore(clock=clock))
    transport = FuseTransport(httpx.MockTransport(llm), fuse=fuse)
    client = httpx.Client(transport=transport, headers={"Authorization": f"Bearer {API_KEY}"})

    # Three days of normal work: a short task every half hour, two model calls each. The clock
    # is simulated, so the three days take a fraction of a second.
    print("simulating 3 days of normal work: a short task every 30 minutes, 2 model calls each")
    task = ["Summarise the new support ticket. " * 40]
    for _ in range(3 * 48):
        ask(client, task)
        report = ask(client, task)
        clock.advance(30 * 60)
    status = fuse.status(report.identity)
    print(
        f"learned baseline for key {status.key} after 3 simulated days: "
        f"{status.baseline:,.0f} tokens/min"
    )

    # The bug: the agent retries a failing tool forever, appending each answer to its context.
    print("\nthe agent starts looping: it retries a failing tool every 3 s, its context growing")
    context = list(task)
    start = clock.now
    step = 0
    try:
        while True:
            step += 1
            elapsed = clock.now - start
            report = ask(client, context)
            assert report.usage is not None
            assert report.usage.total is not None
            tripped = report.record is not None and report.record.tripped
            note = " <- these tokens tripped the fuse (the log line above)" if tripped else ""
            print(
                f"  call {step:2d} at t+{elapsed:2.0f} s: {report.usage.total:6,.0f} tokens{note}"
            )
            context.append("Tool call failed: timeout. Retrying the same call. " * 20)
            clock.advance(3)  # each round trip of the agent takes about 3 seconds
    except LoopSuspected as exc:  # what agent code catches, with or without an SDK
        print(f"\ncall {step} at t+{elapsed:.0f} s was refused before it was sent:")
        print(f"  LoopSuspected: {exc}")
        print(f"  rate={exc.rate:,.0f} baseline={exc.baseline:,.0f} multiple={exc.multiple:.1f}x "
              f"retry_after={exc.retry_after:.0f} s")  # fmt: skip

    sent = llm.calls
    for _ in range(5):  # the agent keeps trying: every call is refused before it is sent
        with contextlib.suppress(LoopSuspected):
            ask(client, context)
    print(f"\n5 more attempts refused; requests that reached the LLM: {llm.calls - sent}")


if __name__ == "__main__":
    main()
