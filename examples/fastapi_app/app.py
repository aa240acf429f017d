"""Tool endpoints an AI agent calls (refunds, CRM writes), contained by TokenFuse.

    python examples/fastapi_app/app.py                        # embedded store, port 8000
    TOKENFUSE_REDIS_URL=redis://localhost:6379/0 python examples/fastapi_app/app.py

Every caller (``Authorization: Bearer <key>``) gets the FREE tier: a bucket of 50 that refills
at 10 calls/s; a refund costs 5 of it. On top, the velocity check counts calls per minute and
a ceiling of 60 calls/min ("this agent cannot make more than 60 tool calls a minute,
period") latches a runaway caller out for 60 s, doubling for each further trip within the
hour. ``/health`` is not guarded. Run ``python examples/fastapi_app/agent.py`` against it to
watch a looping agent get 429s; README.md says how to start over.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from tokenfuse import FREE, FuseEvent, MemoryStore, TokenFuse, VelocityPolicy, inbound_fuse

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


store = make_store()
fuse = inbound_fuse(
    store,
    bucket=FREE,
    velocity=VelocityPolicy(unit="calls", limit="60/minute", cold_start_limit=None),
    on_event=alert,
)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    if hasattr(store, "aclose"):
        await store.aclose()


class Refund(BaseModel):
    charge_id: str
    amount_cents: int


class Contact(BaseModel):
    email: str
    name: str


app = FastAPI(title="tool endpoints", lifespan=lifespan)
app.add_middleware(TokenFuse, fuse=fuse, cost={"/tools/refund": 5}, exclude=["/health"])


@app.post("/tools/refund")
async def refund(body: Refund) -> dict[str, object]:
    return {"refunded": body.charge_id, "amount_cents": body.amount_cents}


@app.post("/tools/crm/contacts")
async def create_contact(body: Contact) -> dict[str, object]:
    return {"created": body.email}


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok", "store": "redis" if REDIS_URL else "memory"}


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")))
