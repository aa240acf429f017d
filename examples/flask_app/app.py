"""The tool endpoints of the FastAPI example on Flask, contained by TokenFuseWSGI.

    python examples/flask_app/app.py                          # embedded store, port 5000
    TOKENFUSE_REDIS_URL=redis://localhost:6379/0 python examples/flask_app/app.py

Same containment: the FREE tier per caller (a bucket of 50 refilled at 10 calls/s; a refund
costs 5), a ceiling of 60 calls/min that latches a runaway caller out for 60 s (doubling for
each further trip within the hour), ``/health`` not guarded. Run
``python examples/flask_app/agent.py`` to watch a looping agent get 429s. With
``TOKENFUSE_REDIS_URL`` this app and the FastAPI example share their callers' buckets.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from flask import Flask, request

from tokenfuse import FREE, FuseEvent, MemoryStore, TokenFuseWSGI, VelocityPolicy, inbound_fuse

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
REDIS_URL = os.environ.get("TOKENFUSE_REDIS_URL")


def make_store() -> Any:
    if not REDIS_URL:
        return MemoryStore()
    from tokenfuse import RedisStore

    prefix = os.environ.get("TOKENFUSE_REDIS_PREFIX", "tokenfuse-example")
    return RedisStore.from_url(REDIS_URL, prefix=prefix)


def alert(event: FuseEvent) -> None:
    """Where a real service would page someone: trips and sustained near-limit use."""
    print(f"ALERT {event.kind}: {event.detail}", flush=True)


fuse = inbound_fuse(
    make_store(),
    bucket=FREE,
    velocity=VelocityPolicy(unit="calls", limit="60/minute", cold_start_limit=None),
    on_event=alert,
)

app = Flask(__name__)
app.wsgi_app = TokenFuseWSGI(  # type: ignore[method-assign]
    app.wsgi_app, fuse=fuse, cost={"/tools/refund": 5}, exclude=["/health"]
)


@app.post("/tools/refund")
def refund() -> dict[str, object]:
    body = request.get_json()
    return {"refunded": body["charge_id"], "amount_cents": body["amount_cents"]}


@app.post("/tools/crm/contacts")
def create_contact() -> dict[str, object]:
    return {"created": request.get_json()["email"]}


@app.get("/health")
def health() -> dict[str, str]:
    return {"status": "ok", "store": "redis" if REDIS_URL else "memory"}


if __name__ == "__main__":
    app.run(host="127.0.0.1", port=int(os.environ.get("PORT", "5000")), threaded=True)
