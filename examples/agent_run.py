"""An orchestrator and its subagents under one run budget. Runs as is, offline.

    python examples/agent_run.py

Three subagent threads (a researcher, a writer, a reviewer) share the run the orchestrator
opened with ``tokenfuse.run``: every LLM call each one makes reserves its estimate against the
run before it is sent and settles with its real usage after, so together they cannot pass the
budget, however their calls interleave. The threads are started with
``contextvars.copy_context()``, which is how a thread inherits the run. A fake LLM (an httpx
MockTransport answering like OpenAI's chat completions) sits behind ``FuseTransport`` on the
embedded store; dollars come from a price table of the example's own.
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
from tokenfuse import BudgetExceeded, Fuse, FuseTransport, MemoryStore
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


def main() -> None:
    # tokenfuse reports events (budget_near, budget_exceeded) on the "tokenfuse" logger too.
    log = logging.StreamHandler(sys.stdout)
    log.setFormatter(logging.Formatter("  [tokenfuse log, %(levelname)s] %(message)s"))
    logging.getLogger("tokenfuse").addHandler(log)
    fuse = Fuse(MemoryStore())
    client = httpx.Client(transport=FuseTransport(httpx.MockTransport(fake_llm), fuse=fuse))
    agents = [
        Subagent("researcher", client, steps=12, max_tokens=2_000),
        Subagent("writer", client, steps=10, max_tokens=3_000),
        Subagent("reviewer", client, steps=8, max_tokens=1_000),
        # -- the failure-loop breaker's subagent goes here: a subagent stuck calling a failing
        # -- tool with the same arguments, stopped by the breaker, not by the budget.
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
