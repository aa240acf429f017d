"""Guard Google's Gen AI SDK (``google-genai``): ``HttpOptions`` whose clients send through
tokenfuse.

``guard_genai()`` returns ``HttpOptions`` with a ``FuseTransport`` in ``client_args`` and an
``AsyncFuseTransport`` in ``async_client_args``: the SDK still builds its own clients (its
choice of httpx or httpx2, its TLS setup and headers), only their transports are guarded. A
transport in the async arguments also keeps the SDK off its aiohttp path, which would bypass
httpx. The SDK lets a refusal through untouched, so ``generate_content`` (sync, async,
streamed) raises ``tokenfuse.FuseTripped`` (``LoopSuspected``, ``CeilingExceeded``) itself.
"""

from __future__ import annotations

from typing import Any

from .. import AsyncFuseTransport, ConfigurationError, Fuse, FuseTransport
from ._common import Key, load, seam_moved

__all__ = ["guard_genai"]

_SUPPORTED = ">=1.50,<3"
#: Clients the application may have built itself: the SDK uses them instead of its own.
_OWN_CLIENTS = ("httpx_client", "httpx_async_client", "aiohttp_client")


def guard_genai(http_options: Any = None, *, fuse: Fuse | None = None, key: Key = None) -> Any:
    """``http_options`` (a ``google.genai.types.HttpOptions``, a dict of its fields, or None)
    with guarded HTTP transports; the original is left unchanged.

    >>> client = genai.Client(http_options=guard_genai())          # doctest: +SKIP

    A transport already in ``client_args``/``async_client_args`` becomes the inner transport
    of the guard.

    Raises:
        ConfigurationError: ``google-genai`` is not installed or moved ``HttpOptions``, or the
            options carry a client the application built itself (guard its transport instead).
    """
    types = load("google.genai.types", extra="genai")
    options_type = types.HttpOptions
    fields = getattr(options_type, "model_fields", {})
    if not {"client_args", "async_client_args"} <= set(fields):
        raise seam_moved("google-genai", _SUPPORTED, "HttpOptions.client_args")
    if http_options is None:
        options = options_type()
    elif isinstance(http_options, dict):
        options = options_type.model_validate(http_options)
    else:
        options = http_options
    own = [name for name in _OWN_CLIENTS if getattr(options, name, None) is not None]
    if own:
        raise ConfigurationError(
            f"HttpOptions.{own[0]} is a client the SDK uses as it is: build it with "
            "transport=FuseTransport() (or AsyncFuseTransport()) instead of guard_genai()"
        )
    client_args = dict(options.client_args or {})
    async_client_args = dict(options.async_client_args or {})
    client_args["transport"] = FuseTransport(client_args.get("transport"), fuse=fuse, key=key)
    async_client_args["transport"] = AsyncFuseTransport(
        async_client_args.get("transport"), fuse=fuse, key=key
    )
    return options.model_copy(
        update={"client_args": client_args, "async_client_args": async_client_args}
    )
