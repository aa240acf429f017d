"""Operating tokenfuse from a browser: a JSON API and a live dashboard of every key.

::

    import os
    import tokenfuse.admin
    from starlette.routing import Mount
    from tokenfuse import Fuse, RedisStore

    fuse = Fuse(RedisStore.from_url("redis://localhost:6379/0"))
    admin_app = tokenfuse.admin.app(fuse, token=os.environ["TOKENFUSE_ADMIN_TOKEN"])
    routes = [Mount("/admin", admin_app)]          # in your Starlette or FastAPI app

    tokenfuse.admin.serve(fuse, port=8787, token=os.environ["TOKENFUSE_ADMIN_TOKEN"])

``app`` needs the ``admin`` extra (Starlette); ``serve`` runs it with uvicorn. The page lists
the keys (tripped ones first) with their rate, baseline, threshold and bucket, charts one key
against its baseline and threshold, follows the events of every process sharing the store, and
resets keys or changes their limits. Every request carries the admin token as a bearer header.
docs/admin.md describes the endpoints, the auth model and the event stream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._dashboard.auth import is_loopback
from ._errors import ConfigurationError

if TYPE_CHECKING:
    from starlette.types import ASGIApp

    from ._fuse import Fuse

__all__ = ["app", "serve"]


def app(fuse: Fuse, **options: Any) -> ASGIApp:
    """The admin ASGI app of ``fuse``: the JSON API under ``/api`` and the page at ``/``.

    Options: ``token`` (required unless ``allow_no_token_on_loopback=True``), ``refresh``
    (seconds between pushed tables, 2), ``max_scan`` (keys one listing reads, 10,000),
    ``allowed_origins`` (another origin that may call it, for a page behind a proxy).

    >>> asgi = tokenfuse.admin.app(fuse, token="a-long-random-admin-token")  # doctest: +SKIP
    """
    try:
        from ._dashboard.web import app as make_app
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("the admin app needs Starlette: pip install 'tokenfuse[admin]'") from exc
    return make_app(fuse, **options)


def serve(
    fuse: Fuse,
    *,
    host: str = "127.0.0.1",
    port: int = 8787,
    token: str | None = None,
    allow_no_token_on_loopback: bool = False,
    **options: Any,
) -> None:
    """Run the admin app with uvicorn until interrupted. Without a token it starts only on a
    loopback address, and only when told ``allow_no_token_on_loopback=True``.

    >>> tokenfuse.admin.serve(fuse, token=os.environ["TOKENFUSE_ADMIN_TOKEN"])  # doctest: +SKIP
    """
    if token is None and not is_loopback(host):
        raise ConfigurationError(
            f"refusing to serve the admin app on {host} without a token: pass token=..., "
            "or bind it to 127.0.0.1"
        )
    asgi = app(fuse, token=token, allow_no_token_on_loopback=allow_no_token_on_loopback, **options)
    try:
        import uvicorn
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("serving the admin app needs uvicorn: pip install uvicorn") from exc
    uvicorn.run(asgi, host=host, port=port, log_level="warning")
