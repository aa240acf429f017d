"""The admin app: a JSON API and a live web page over one fuse's keys (``tokenfuse.admin.app``).

``service`` answers the page's queries (``Panel``, on ``tokenfuse.admin.Admin``), ``history``
keeps each key's last hour as the app sees it, ``auth`` decides who may ask, ``web`` is the
Starlette app and ``static`` the page. Only ``web`` needs Starlette.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError
from .auth import is_loopback

if TYPE_CHECKING:
    from starlette.types import ASGIApp

    from .._fuse import Fuse

__all__ = ["app", "serve"]


def app(fuse: Fuse, **options: Any) -> ASGIApp:
    """The admin ASGI app of ``fuse``: the JSON API under ``/api`` and the page at ``/``.

    Options: ``token`` (required unless ``allow_no_token_on_loopback=True``), ``refresh``
    (seconds between pushed tables, 2), ``allowed_origins`` (another origin that may call it,
    for a page behind a proxy).

    >>> asgi = tokenfuse.admin.app(fuse, token="a-long-random-admin-token")  # doctest: +SKIP
    """
    try:
        from .web import app as make_app
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
