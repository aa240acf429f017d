"""One tool endpoint as an ASGI app and as a WSGI app, both guarded by one bucket in Redis.

Configured from the environment so that separate server processes can run it:
``TOKENFUSE_REDIS_URL``, ``SHARED_PREFIX``, ``SHARED_RATE``, ``SHARED_CAPACITY``.

    python -m uvicorn tests.middleware.shared_app:asgi_app --port 8001
    python -m tests.middleware.shared_app 8002          # the WSGI app on werkzeug's server
"""

from __future__ import annotations

import os
import sys
from typing import Any

from tokenfuse import BucketPolicy, Fuse
from tokenfuse._middleware import TokenFuse, TokenFuseWSGI, inbound_fuse


def _fuse() -> Fuse:
    from tokenfuse._stores.redis import RedisStore

    store = RedisStore.from_url(
        os.environ["TOKENFUSE_REDIS_URL"], prefix=os.environ["SHARED_PREFIX"]
    )
    bucket = BucketPolicy(
        rate=float(os.environ["SHARED_RATE"]), capacity=float(os.environ["SHARED_CAPACITY"])
    )
    return inbound_fuse(store, bucket=bucket)


async def _tool(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b'{"served_by":"asgi"}'
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _wsgi_tool(environ: Any, start_response: Any) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "application/json")])
    return [b'{"served_by":"wsgi"}']


asgi_app: Any = None
wsgi_app: Any = None
if "SHARED_PREFIX" in os.environ:
    asgi_app = TokenFuse(_tool, fuse=_fuse())
    wsgi_app = TokenFuseWSGI(_wsgi_tool, fuse=_fuse())


if __name__ == "__main__":
    from werkzeug.serving import run_simple

    run_simple("127.0.0.1", int(sys.argv[1]), wsgi_app, threaded=True)
