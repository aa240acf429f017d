"""An orchestrator and its subagents under one run budget. Runs as is, offline.

    python examples/agent_run.py

Three subagent threads (a researcher, a writer, a reviewer) share the run the orchestrator
opened with ``tokenfuse.run``: every LLM call each one makes reserves its estimate against the
run before it is sent and settles with its real usage after, so together they cannot pass the
budget, however their calls interleave. A fourth (a fixer) is stuck: its tool fails, and the
model asks for the same tool call with the same arguments again and again. Each call is cheap,
so no budget or rate notices; the failure-loop breaker reads the conversation and refuses it.
The threads are started with ``contextvars.copy_context()``, which is how a thread inherits
the run. A fake LLM (an httpx MockTransport answering like OpenAI's chat completions) sits
behind ``FuseTransport`` on the embedded store; dollars come from a price table of the
example's own.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import threading
import time

import httpx

import tokenfuse
from tokenfuse import BudgetExceeded, FailureLoop, Fuse, FuseTransport, MemoryStore
from tokenfuse.guards import Price, set_prices

URL = "https://api.openai.com/v1/chat/completions"
MODEL = "demo-model"
set_prices({MODEL: Price(input=2.0, output=8.0)})  # US dollars per million tokens


def fake_llm(request: httpx.Request) -> httpx.Response:
    """Answers every chat completion: the prompt's size in, most of ``max_tokens`` out."""
    time.sleep(0.01)  # a model takes a moment: the subagents' calls interleave
    body = json.loads(request.content)
    prompt_tokens = len(request.content) // 4
    completion_tokens = int(body.get("max_tokens", 500) * 0.9)
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    message = {"role": "assistant", "content": "..."}
    return httpx.Response(
        200,
        json={
            "object": "chat.completion",
            "model": MODEL,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": usage,
        },
    )


class Subagent:
    """Works through its steps, one LLM call each, until done or stopped by a guard."""

    def __init__(self, name: str, client: httpx.Client, steps: int, max_tokens: int) -> None:
        self.name = name
        self.client = client
        self.steps = steps
        self.max_tokens = max_tokens
        self.done = 0
        self.stopped_by: str | None = None

    def __call__(self) -> None:
        for step in range(self.steps):
            messages = [{"role": "user", "content": f"{self.name}, step {step}. " * 50}]
            body = {"model": MODEL, "max_tokens": self.max_tokens, "messages": messages}
            try:
                self.client.post(URL, content=json.dumps(body))
            except BudgetExceeded as exc:  # the run cannot afford this call: it was not sent
                self.stopped_by = f"the run budget: {exc}"
                return
            self.done += 1


PATCH = {"name": "apply_patch", "arguments": json.dumps({"file": "app.py", "line": 42})}


class StuckSubagent(Subagent):
    """Asks the model to fix a bug; the model calls ``apply_patch``, the tool fails, and the
    model asks for the very same call again: a loop no single call reveals."""

    def __call__(self) -> None:
        messages: list[dict[str, object]] = [{"role": "user", "content": "Fix the failing test."}]
        for step in range(self.steps):
            body = {"model": MODEL, "max_tokens": self.max_tokens, "messages": messages}
            try:
                self.client.post(URL, content=json.dumps(body))
            except FailureLoop as exc:  # refused before it was sent
                self.stopped_by = f"the failure-loop breaker: {exc}"
                return
            except BudgetExceeded as exc:
                self.stopped_by = f"the run budget: {exc}"
                return
            self.done += 1
            call_id = f"call_{step}"  # the model's answer: the same tool call, once more
            tool_call = {"id": call_id, "type": "function", "function": PATCH}
            messages.append({"role": "assistant", "content": None, "tool_calls": [tool_call]})
            messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": "Error: hunk 1 FAILED"}
            )


def main() -> None:
    # tokenfuse reports events (budget_near, budget_exceeded) on the "tokenfuse" logger too.
    log = logging.StreamHandler(sys.stdout)
    log.setFormatter(logging.Formatter("  [tokenfuse log, %(levelname)s] %(message)s"))
    logging.getLogger("tokenfuse").addHandler(log)
    fuse = Fuse(MemoryStore())
    client = httpx.Client(transport=FuseTransport(httpx.MockTransport(fake_llm), fuse=fuse))
    agents = [
        StuckSubagent("fixer", client, steps=20, max_tokens=200),  # starts first: its loop
        Subagent("researcher", client, steps=12, max_tokens=2_000),
        Subagent("writer", client, steps=10, max_tokens=3_000),
        Subagent("reviewer", client, steps=8, max_tokens=1_000),
    ]
    print("orchestrator: run 'report-42' with a budget of 40,000 tokens and $0.30")
    with tokenfuse.run("report-42", tokens=40_000, usd=0.30, fuse=fuse) as run:
        threads = [
            threading.Thread(target=contextvars.copy_context().run, args=(agent,))
            for agent in agents
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        spent, remaining = run.spent, run.remaining

    print("\nwhich guard stopped what:")
    for agent in agents:
        outcome = "finished" if agent.stopped_by is None else f"stopped by {agent.stopped_by}"
        print(f"  {agent.name}: {agent.done} of {agent.steps} calls made, {outcome}")
    print(f"\nrun 'report-42' spent {spent.tokens:,.0f} tokens and ${spent.usd:.4f}")
    print(f"remaining: {remaining.tokens:,.0f} tokens and ${remaining.usd:.4f}")
    print(f"within budget: {spent.tokens <= 40_000 and spent.usd <= 0.30}")


if __name__ == "__main__":
    main()
