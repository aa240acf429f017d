"""Code run in the OS processes of test_budget_concurrency (spawned, so kept small): agents
spending against shared runs through the real ``FuseTransport`` and a real Redis."""

from __future__ import annotations

import contextlib
import contextvars
import json
import random
import threading
from typing import Any

import httpx2

from tokenfuse import BudgetExceeded, Fuse, RedisStore, VelocityPolicy
from tokenfuse.guards import run

SECRET = "budget drill secret, 32+ chars long"
#: What each call asks for (its output maximum) and the range its real usage is drawn from:
#: up to EXCESS more than its estimate, so settling can take a run past its limit.
MAX_TOKENS = 100
USAGE = (50, 160)
# Counting only: no velocity rule may refuse the drill's calls (no cold-start limits).
COUNTING = VelocityPolicy(cold_start_limit=None, cold_start_sustained=None, learning_period=1e9)


def _llm(seed: int) -> Any:
    rng = random.Random(seed)
    lock = threading.Lock()

    def answer(request: Any) -> Any:
        with lock:
            total = rng.randint(*USAGE)
        usage = {"prompt_tokens": 10, "completion_tokens": total - 10, "total_tokens": total}
        body = {"object": "chat.completion", "model": "m", "choices": [], "usage": usage}
        return httpx2.Response(200, json=body)

    return answer


def spend(url: str, prefix: str, cluster: bool, run_ids: list[str], threads: int, seed: int,
          ready: Any, go: Any, results: Any) -> None:  # fmt: skip
    """``threads`` agents calling until their runs refuse; report what was answered."""
    store = RedisStore.from_url(url, prefix=prefix, cluster=cluster)
    fuse = Fuse(store, secret=SECRET, velocity=COUNTING)
    transport = httpx2.MockTransport(_llm(seed))
    from tokenfuse import FuseTransport

    client = httpx2.Client(transport=FuseTransport(transport, fuse=fuse))
    body = json.dumps({"model": "m", "max_tokens": MAX_TOKENS, "messages": []})
    spent: list[int] = []
    refused: list[int] = []
    largest_estimate: list[float] = []

    def agent() -> None:
        total = refusals = 0
        calls = 0
        while refusals < 3 and calls < 2_000:  # refused thrice it stops (2,000: a broken run)
            calls += 1
            try:
                reply = client.post("https://llm.test/v1/chat/completions", content=body)
            except BudgetExceeded as exc:
                refusals += 1
                largest_estimate.append(exc.requested)
                continue
            total += reply.json()["usage"]["total_tokens"]
        spent.append(total)
        refused.append(refusals)

    client.post("https://llm.test/v1/chat/completions", content=body)  # connect, load scripts
    with contextlib.ExitStack() as runs:
        for run_id in run_ids:  # nested, outermost first
            runs.enter_context(run(run_id, fuse=fuse))
        ready.wait(60)
        go.wait(60)
        workers = [
            threading.Thread(target=contextvars.copy_context().run, args=(agent,))
            for _ in range(threads)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(300)
    results.put((sum(spent), sum(refused), max(largest_estimate, default=0.0)))
    client.close()
    store.close()
