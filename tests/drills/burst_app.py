"""A tool endpoint guarded by ``TokenFuse`` on ``RedisStore``, for the burst drill.

Configured from the environment so that a uvicorn process can run it:
``TOKENFUSE_REDIS_URL``, ``BURST_PREFIX``, ``BURST_RATE``, ``BURST_CAPACITY``.

    python -m uvicorn tests.drills.burst_app:app --port 8001

``GET /stats`` (not guarded) answers how many guarded calls reached the tool, how many of
those were let through because the decision was degraded (the store was not consulted), and
the fuse's events (kind: first detail).
"""

from __future__ import annotations

import json
import os
from typing import Any

from tokenfuse import BucketPolicy
from tokenfuse._middleware import DECISION_KEY, TokenFuse, inbound_fuse
from tokenfuse._stores.redis import RedisStore

counts: dict[str, object] = {"served": 0, "degraded": 0, "events": {}}


async def _reply(send: Any, body: object) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _tool(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/stats":
        await _reply(send, counts)
        return
    counts["served"] += 1  # type: ignore[operator]
    counts["degraded"] += scope[DECISION_KEY].degraded  # type: ignore[operator]
    await _reply(send, {"ok": True})


def _app() -> Any:
    store = RedisStore.from_url(
        os.environ["TOKENFUSE_REDIS_URL"], prefix=os.environ["BURST_PREFIX"]
    )
    bucket = BucketPolicy(
        rate=float(os.environ["BURST_RATE"]), capacity=float(os.environ["BURST_CAPACITY"])
    )
    events: Any = counts["events"]
    fuse = inbound_fuse(
        store, bucket=bucket, on_event=lambda e: events.setdefault(e.kind, e.detail)
    )
    return TokenFuse(_tool, fuse=fuse, exclude=["/stats"])


app: Any = _app() if "BURST_PREFIX" in os.environ else None
